"""What every config of one of the paper's setups shares: the frozen solver and the conditions a
revision is made and judged under. Collection (the teacher's revisions kept when they beat the seed),
training (the proposer's reward) and evaluation (held-out scores) apply the same block, so the
three cannot drift apart; tests/test_configs.py checks the resolved blocks are equal across the
configs of each setup.

The paper names the solver models (Qwen3.5-4B for Reasoning Gym, Qwen3-8B for QA) but not how they
decode, so the regime is ours: Qwen's recommended sampling for non-thinking mode (temperature 0.7,
top-p 0.8, top-k 20), thinking off, up to 2,048 new tokens per call and 16 calls / 16,384 completion
tokens per harness run for Reasoning Gym (a revised harness may sample, vote or verify; the seed makes
one call). QA answers are short spans: 512 new tokens per call. The report shows 16 feedback
questions in up to 12,000 characters, and a harness run may use 300 s of its own time (brokered
solver calls not counted).

    c = adapt_base.get_config()
    setups.apply(c, "reasoning_gym")
"""

# The `solver` block (hljax/config.py SolverSpec; its budget and sampling keys sit in the block itself).
# solver.path, the solver's HF folder (its chat template), stays a required override of each config.
RG_SOLVER = {
    "backend": "sglang",
    "url": "http://127.0.0.1:30001",
    "max_batch": 64,  # These two size an embedded solver only.
    "max_seq_len": 8192,
    "prompt_mode": "chat",
    "enable_thinking": False,
    "max_new_tokens": 2048,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "max_calls": 16,
    "max_tokens": 16384,
}
QA_SOLVER = {**RG_SOLVER, "max_new_tokens": 512}

# What the proposer is shown (the report's fresh feedback questions, its size) and how long a harness
# may run in the sandbox before it counts as crashed.
RG_REVISION = {"tasks.feedback": 16, "prompt.report_max_chars": 12000, "sandbox.timeout_s": 300.0}
QA_REVISION = dict(RG_REVISION)

SETUPS = {"reasoning_gym": (RG_SOLVER, RG_REVISION), "multihop_qa": (QA_SOLVER, QA_REVISION)}


def apply(c, setup: str):
    """Set config `c`'s solver block and revision conditions to those of `setup` (a task suite)."""
    solver, revision = SETUPS[setup]
    for key, value in solver.items():
        c.solver[key] = value
    for path, value in revision.items():
        block, key = path.split(".")
        c[block][key] = value
    return c
