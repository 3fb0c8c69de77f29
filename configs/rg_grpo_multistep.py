"""Reasoning Gym multistep RL (the paper: revision states refreshed between offline phases,
continuing from the single-step RL checkpoint). Starts from configs/rg_grpo.py's export and keeps its
setup; at the start of each 50-step phase the current proposer runs 4 revision rounds of 4 proposals
per RL family (`BestOfG`), and the harnesses it reaches join the state pool beside the seeds
(hljax/rl/states.py). Refresh proposals sample as the training ones do: states.max_new_tokens,
temperature, top_p and top_k are unset, so they follow grpo's (4,096 tokens, temperature 1). A
refresh costs 5 x 4 x (16 + 4 x 16) harness runs, under one training step's scoring (16 x 8 x 16).
Thinking mode is off for proposer and solver.

    python -m sglang.launch_server --model-path runs/rg_grpo/export --port 30000   # proposer (weights synced)
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30001    # frozen solver
    python -m launch.train --config configs/rg_grpo_multistep.py --config.solver.path=/models/Qwen3.5-4B
"""

from configs import rg_grpo


def get_config():
    c = rg_grpo.get_config()
    c.run_dir = "runs/rg_grpo_multistep"
    # The single-step RL proposer: configs/rg_grpo.py exports it here at the end of its run.
    c.model.path = "runs/rg_grpo/export"
    c.states.mode = "offline"
    c.states.refresh_every = 50
    c.states.rounds = 4
    c.states.proposals = 4
    c.states.scoring_questions = 16
    c.states.keep_seeds = True
    return c
