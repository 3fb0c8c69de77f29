"""Reasoning Gym GRPO on the 5 RL families (paper: Qwen3.5-4B proposer and solver, single-step RL
from the SFT checkpoint). Rollouts and the solver come from SGLang servers; the solver, the report
and the sandbox limit are the Reasoning Gym setup's (configs/setups.py), shared with collection and
evaluation. Thinking mode is off for proposer and solver (model.enable_thinking, solver.enable_thinking).

    python -m sglang.launch_server --model-path runs/rg_sft/export --port 30000   # proposer (weights synced)
    python -m sglang.launch_server --model-path /models/Qwen3.5-4B --port 30001   # frozen solver
    python -m launch.train --config configs/rg_grpo.py --config.model.path=runs/rg_sft/export \
        --config.solver.path=/models/Qwen3.5-4B

Prompt diversity: 5 families x 240 feedback rounds = 1,200 distinct seed-harness states for the
300 x 16 = 4,800 prompt slots, so each state is revised 4 times (every 75 steps), not 240 times as
with 4 rounds. Each state costs one cached sandbox run of the seed on its 16 feedback questions
(1,200 x 16 harness runs, against 300 x 128 x 16 for scoring); the feedback split must hold
240 x 16 = 3,840 questions per family, hence pool_size 20,000 (the smallest RL family,
calendar_arithmetic, yields 5,767 distinct feedback questions from 20,000 draws). Multistep RL from
this run's export: configs/rg_grpo_multistep.py.
"""

from configs import base, setups


def get_config():
    c = base.get_config()
    c.mode = "grpo"
    c.run_dir = "runs/rg_grpo"
    c.model.path = ""  # Required: the SFT export (or the base model to skip SFT).
    c.model.preset = ""
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.rollout.dtype = "bfloat16"  # The rollout server samples in the dtype the trainer scores in.
    c.model.remat = True
    c.model.enable_thinking = False
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 10
    c.optim.decay_steps = 300
    c.loss.eps_low = 0.2
    c.loss.eps_high = 0.28
    c.loss.beta = 0.0
    c.loss.aggregation = "token_mean"
    c.loss.std_ddof = 1
    # Rollouts come from a bf16 SGLang server, the trainer recomputes log-probs on its own kernels:
    # weight each token by min(pi_old / pi_sampler, 2) (verl's and slime's TIS). Sampling is at
    # temperature 1 with no top-p / top-k, so the sampler's log-probs are of the trained distribution.
    c.loss.tis_cap = 2.0
    c.loss.logprob_chunk = 512
    c.grpo.steps = 300
    c.grpo.prompts_per_step = 16
    c.grpo.group_size = 8
    c.grpo.micro_batches = 8
    c.grpo.mu = 1
    c.grpo.max_new_tokens = 4096
    c.grpo.temperature = 1.0
    c.grpo.max_len = 16384
    c.grpo.scoring_questions = 16
    c.grpo.state_rounds = 240
    c.rollout.backend = "sglang"
    c.rollout.url = "http://127.0.0.1:30000"
    c.rollout.sync_dir = "/dev/shm/hljax-sync"  # Fast local path: the server reads the export from here.
    setups.apply(c, "reasoning_gym")
    c.solver.path = ""  # Required: the solver's HF folder (for its chat template).
    c.tasks.suite = "reasoning_gym"
    c.tasks.role = "rl"
    c.tasks.scoring = 256
    c.tasks.pool_size = 20000
    c.sandbox.workers = 8
    c.sandbox.slots_per_worker = 8
    c.checkpoint.every = 20
    c.export.dtype = "bfloat16"
    return c
