"""Multi-hop QA GRPO (paper: Qwen3-4B proposer, Qwen3-8B solver, trained on HotpotQA only, from the
base model with no SFT). The dataset file is the official HotpotQA distractor JSON. The solver, the
report and the sandbox limit are the QA setup's (configs/setups.py), shared with evaluation
(configs/adapt_qa.py, eval_qa_*.py). Thinking mode is off for proposer and solver.

    python -m sglang.launch_server --model-path /models/Qwen3-4B --port 30000   # proposer (weights synced)
    python -m sglang.launch_server --model-path /models/Qwen3-8B --port 30001   # frozen solver
    python -m launch.train --config configs/qa_grpo.py --config.model.path=/models/Qwen3-4B \
        --config.solver.path=/models/Qwen3-8B \
        --config.tasks.qa_files='("hotpotqa:/data/hotpot_train_v1.1.json",)'

One task (HotpotQA) x 600 feedback rounds = 600 distinct seed states for 300 x 8 prompt slots: each
is revised 4 times. Online multistep RL (revision chains, the paper's QA setting): configs/qa_grpo_online.py.
"""

from configs import rg_grpo, setups


def get_config():
    c = rg_grpo.get_config()
    c.run_dir = "runs/qa_grpo"
    c.tasks.suite = "multihop_qa"
    c.tasks.qa_files = ()  # Required: ("hotpotqa:/path/to/hotpot_train_v1.1.json",)
    c.tasks.scoring = 512
    c.grpo.prompts_per_step = 8
    c.grpo.group_size = 8
    c.grpo.state_rounds = 600
    setups.apply(c, "multihop_qa")
    return c
