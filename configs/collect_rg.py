"""Teacher SFT data for Reasoning Gym (the paper: a 35B teacher's revisions of the seed harness on the
21 SFT families, kept when they beat the seed on the scoring set and pass the quality filters).
This file is also the schema of collector configs; field meanings are on the typed configs in
hljax/data/collect.py (CollectConfig, TeacherSpec) and hljax/harness/filters.py (FilterConfig).

    # The teacher: any OpenAI-compatible endpoint (SGLang, vLLM, ...), e.g.
    python -m sglang.launch_server --model-path /models/TEACHER --port 30001
    # The solver (the paper: Qwen3.5-4B):
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30000
    python -m launch.collect --config configs/collect_rg.py \
        --config.teacher.url=http://localhost:30001 --config.teacher.model=TEACHER \
        --config.solver.url=http://localhost:30000 --config.solver.path=/models/Qwen3.5-4B

Then `python -m launch.train --config configs/rg_sft.py --config.sft.data=data/rg_teacher.jsonl`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.out = "data/rg_teacher.jsonl"
    c.run_dir = "runs/collect_rg"
    c.seed = 0
    c.rounds = 4  # Revision states per family: 21 x 4 = 84 prompts.
    c.proposals = 8  # Teacher samples per state.
    c.scoring_questions = 32
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.teacher = dict(backend="remote", api="openai", url="", model="", path="", preset="tiny", api_key_env="",
                     template_kwargs=True, enable_thinking=False, max_new_tokens=4096, temperature=0.7, top_p=0.95,
                     top_k=-1, timeout_s=900.0, max_batch=16, max_seq_len=16384)
    c.solver = dict(backend="sglang", path="", url="", max_batch=64, max_seq_len=8192, prompt_mode="chat",
                    enable_thinking=False, max_new_tokens=1024, temperature=0.0, top_p=1.0, top_k=-1,
                    max_calls=8, max_tokens=8192)
    c.tasks = dict(suite="reasoning_gym", role="sft", families=(), qa_files=(), qa_aliases="", feedback=4,
                   scoring=64, eval=64, pool_size=5000, formats=())
    c.sandbox = dict(isolation="bwrap", workers=4, slots_per_worker=8, timeout_s=60.0, memory_bytes=1 << 30)
    c.prompt = dict(report_max_chars=6000)
    # Reasoning Gym's contract lets a harness set every sampling keyword, so the task fixes none;
    # misuse of the solver handle itself is refused regardless (filters.solver_settings).
    c.filters = dict(max_code_chars=12_000, max_code_lines=300, max_completion_chars=16_000, fixed_sampling=(),
                     min_improvement=0.0, min_reference_chars=4, min_numeric_digits=3)
    return c
