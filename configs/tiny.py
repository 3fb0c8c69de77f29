"""The embedded default: a tiny Qwen3 (random init, bundled tokenizer) learns the edit format by SFT
on the bundled revisions, then GRPO on the 5 RL families with our JAX engine as proposer server and
as solver, sandbox scoring, checkpoints and an HF export. Minutes on 2 CPU cores.

    python -m launch.train --config configs/tiny.py
"""

from configs import base


def get_config():
    c = base.get_config()
    c.mode = "sft+grpo"
    c.run_dir = "runs/tiny"
    c.model.preset = "tiny"
    c.sft_optim.learning_rate = 5e-3
    c.sft_optim.warmup_steps = 10
    c.sft_optim.decay_steps = 190
    c.sft.steps = 200
    c.sft.batch_size = 4
    c.sft.max_len = 1280
    c.sft.eval_temperature = 0.3
    c.sft.eval_rows = 8
    c.optim.learning_rate = 1e-4
    c.grpo.steps = 8
    c.grpo.prompts_per_step = 2
    c.grpo.group_size = 4
    c.grpo.max_new_tokens = 160
    c.grpo.temperature = 0.7
    c.grpo.max_len = 2048
    c.grpo.scoring_questions = 4
    c.loss.logprob_chunk = 2048  # The tiny vocabulary's logits fit whole; chunking would only cost time.
    c.rollout.max_seq_len = 2048
    # The solver is the simulated one (a stand-in for an LLM, hljax/tasks/simulated_solver.py): a random
    # tiny model scores 0 whatever the harness does, so no learning could be seen with it.
    c.solver.backend = "simulated"
    c.solver.max_seq_len = 1024
    c.solver.max_new_tokens = 32
    c.solver.max_calls = 4
    c.solver.max_tokens = 256
    c.tasks.feedback = 3
    c.tasks.pool_size = 2000
    c.prompt.report_max_chars = 700
    c.checkpoint.every = 50
    return c
