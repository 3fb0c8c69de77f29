"""Teacher SFT data for Reasoning Gym (the paper: a 35B teacher's revisions of the seed harness on the
21 SFT families, kept when they beat the seed on the scoring set and pass the quality filters).
The solver, the report and the sandbox limit are the Reasoning Gym setup's (configs/setups.py), the
same as training and evaluation, so the "beats the seed" filter selects under the regime the
proposer is later rewarded and scored under. Thinking mode is off for teacher and solver
(teacher.enable_thinking, solver.enable_thinking). Field meanings are on the typed configs in
hljax/data/collect_config.py (CollectConfig, TeacherSpec) and hljax/harness/filters.py (FilterConfig).

    # The teacher: any OpenAI-compatible endpoint (SGLang, vLLM, ...), e.g.
    python -m sglang.launch_server --model-path /models/TEACHER --port 30000
    # The solver (the paper: Qwen3.5-4B), where the setup's solver.url points:
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30001
    python -m launch.collect --config configs/collect_rg.py \
        --config.teacher.url=http://localhost:30000 --config.teacher.model=TEACHER \
        --config.solver.path=/models/Qwen3.5-4B

Then `python -m launch.train --config configs/rg_sft.py --config.sft.data=data/rg_teacher.jsonl`.
"""

from configs import collect_base, setups


def get_config():
    c = collect_base.get_config()
    c.out = "data/rg_teacher.jsonl"
    c.run_dir = "runs/collect_rg"
    setups.apply(c, "reasoning_gym")
    c.solver.path = ""  # Required: the solver's HF folder (for its chat template).
    c.teacher.enable_thinking = False
    return c
