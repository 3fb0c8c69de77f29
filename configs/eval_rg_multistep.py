"""Reasoning Gym multistep test-time revision: 5 rounds, 1 proposal per round, `KeepIfBetter`, one
row per proposer. The same protocol as configs/adapt_rg.py, run as an evaluation over proposers:

    python -m launch.evaluate --config configs/eval_rg_multistep.py --config.solver.path=/models/Qwen3.5-4B \
        --config.proposers='("base=http://127.0.0.1:30000|/models/Qwen3.5-4B", "rl=http://127.0.0.1:30002|runs/rg_grpo/export")'
"""

from configs import adapt_rg


def get_config():
    c = adapt_rg.get_config()
    c.run_dir = "runs/eval_rg_multistep"
    return c
