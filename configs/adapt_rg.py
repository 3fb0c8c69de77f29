"""Reasoning Gym test-time adaptation (the paper's multistep protocol): on each of the 21 held-out
families, 5 rounds with one proposal per round, `KeepIfBetter`; the kept harness after each round
is scored on held-out questions. Proposer and solver are frozen SGLang servers; the solver, the
report and the sandbox limit are the Reasoning Gym setup's (configs/setups.py), as in collection and
training. Thinking mode is off for proposer and solver (proposer.enable_thinking, solver.enable_thinking).

    python -m sglang.launch_server --model-path runs/rg_grpo/export --port 30000   # proposer
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30001    # solver
    python -m launch.adapt --config configs/adapt_rg.py \
        --config.proposers='("rl=http://127.0.0.1:30000|runs/rg_grpo/export",)' \
        --config.solver.path=/models/Qwen3.5-4B
"""

from configs import adapt_base, setups


def get_config():
    c = adapt_base.get_config()
    c.run_dir = "runs/adapt_rg"
    c.tasks.suite = "reasoning_gym"
    c.tasks.role = "heldout"
    c.adapt.rounds = 5
    c.adapt.proposals = 1
    c.adapt.policy = "keep_if_better"
    c.adapt.scoring_questions = 32
    c.adapt.max_new_tokens = 4096
    c.evaluation.protocol = "rounds"
    c.evaluation.eval_questions = 64
    c.proposer.dtype = "bfloat16"
    c.proposer.enable_thinking = False
    setups.apply(c, "reasoning_gym")
    c.sandbox.workers = 8
    c.sandbox.slots_per_worker = 8
    return c
