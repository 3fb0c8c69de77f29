"""Reasoning Gym single revision (the paper's headline): for each held-out family, 8 proposals from
the seed harness on format-varied questions; the mean held-out score over all proposals, and
separately the oracle best-of-8. One row per proposer (base, SFT, RL, teacher), seed harness first:

    python -m launch.evaluate --config configs/eval_rg_single.py --config.solver.path=/models/Qwen3.5-4B \
        --config.proposers='("base=http://127.0.0.1:30000|/models/Qwen3.5-4B", "rl=http://127.0.0.1:30002|runs/rg_grpo/export")'
"""

from configs import adapt_rg


def get_config():
    c = adapt_rg.get_config()
    c.run_dir = "runs/eval_rg_single"
    c.evaluation.protocol = "single"
    c.adapt.proposals = 8
    return c
