"""Multi-hop QA multistep RL (the paper: revision runs generated online, from the base model with no
SFT). configs/qa_grpo.py with live revision chains: each of the 8 prompt slots revises the harness
its chain reached, moves to its best candidate after every step (`BestOfG`, even when worse, as at
test time) and restarts from the seed after 10 revisions, the length of the paper's QA test-time runs
(hljax/rl/states.py). Each (step, slot) reads fresh feedback questions for its report. Thinking
mode is off for proposer and solver.

    python -m sglang.launch_server --model-path /models/Qwen3-4B --port 30000   # proposer (weights synced)
    python -m sglang.launch_server --model-path /models/Qwen3-8B --port 30001   # frozen solver
    python -m launch.train --config configs/qa_grpo_online.py --config.model.path=/models/Qwen3-4B \
        --config.solver.path=/models/Qwen3-8B \
        --config.tasks.qa_files='("hotpotqa:/data/hotpot_train_v1.1.json",)'
"""

from configs import qa_grpo


def get_config():
    c = qa_grpo.get_config()
    c.run_dir = "runs/qa_grpo_online"
    c.states.mode = "online"
    c.states.max_depth = 10
    return c
