"""Reasoning Gym GRPO on the 5 RL families (paper: Qwen3.5-4B proposer and solver, single-step RL
from the SFT checkpoint). Rollouts and the solver come from SGLang servers:

    python -m sglang.launch_server --model-path runs/rg_sft/export --port 30000   # proposer (weights synced)
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30001   # frozen solver
    python -m launch.train --config configs/rg_grpo.py --config.model.path=runs/rg_sft/export \
        --config.solver.path=/models/Qwen3.5-4B
"""

from configs import base


def get_config():
    c = base.get_config()
    c.mode = "grpo"
    c.run_dir = "runs/rg_grpo"
    c.model.path = ""  # Required: the SFT export (or the base model to skip SFT).
    c.model.preset = ""
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = True
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 10
    c.optim.decay_steps = 300
    c.loss.eps_low = 0.2
    c.loss.eps_high = 0.28
    c.loss.beta = 0.0
    c.loss.aggregation = "token_mean"
    c.loss.logprob_chunk = 512
    c.grpo.steps = 300
    c.grpo.prompts_per_step = 16
    c.grpo.group_size = 8
    c.grpo.micro_batches = 8
    c.grpo.max_new_tokens = 4096
    c.grpo.max_len = 16384
    c.grpo.scoring_questions = 16
    c.rollout.backend = "sglang"
    c.rollout.url = "http://127.0.0.1:30000"
    c.rollout.sync_dir = "/dev/shm/hljax-sync"  # Fast local path: the server reads the export from here.
    c.solver.backend = "sglang"
    c.solver.url = "http://127.0.0.1:30001"
    c.solver.path = ""  # Required: the solver's HF folder (for its chat template).
    c.solver.max_new_tokens = 2048
    c.solver.temperature = 0.7
    c.solver.top_p = 0.8
    c.solver.top_k = 20
    c.solver.max_calls = 16
    c.solver.max_tokens = 16384
    c.tasks.suite = "reasoning_gym"
    c.tasks.role = "rl"
    c.tasks.feedback = 16
    c.tasks.scoring = 256
    c.sandbox.workers = 8
    c.sandbox.slots_per_worker = 8
    c.sandbox.timeout_s = 300.0
    c.prompt.report_max_chars = 12000
    c.checkpoint.every = 20
    c.export.dtype = "bfloat16"
    return c
