"""The collector end to end on CPU in a minute or two: the tiny random Qwen3 behind our embedded
server is the teacher (spoken to over /v1/chat/completions, as a remote one would be) and the solver.
Its proposals are mostly invalid edits: this checks the machinery, rejection reasons and resume.

    python -m launch.collect --config configs/collect_tiny.py
"""

from configs import collect_rg


def get_config():
    c = collect_rg.get_config()
    c.out = "runs/collect_tiny/sft.jsonl"
    c.run_dir = "runs/collect_tiny"
    c.rounds = 1
    c.proposals = 3
    c.scoring_questions = 3
    c.teacher.backend = "embedded_server"
    c.teacher.api = "openai"
    c.teacher.max_new_tokens = 96
    c.teacher.temperature = 1.0
    c.teacher.top_p = 1.0
    c.teacher.max_seq_len = 2048
    c.solver.backend = "embedded"
    c.solver.url = ""
    # Greedy, as this smoke run has always sampled its random solver (the RG setup samples at 0.7).
    c.solver.temperature = 0.0
    c.solver.top_p = 1.0
    c.solver.top_k = -1
    c.solver.max_batch = 16
    c.solver.max_seq_len = 1024
    c.solver.max_new_tokens = 32
    c.solver.max_calls = 4
    c.solver.max_tokens = 256
    c.tasks.families = ("basic_arithmetic", "spell_backward")
    c.tasks.feedback = 3
    c.tasks.scoring = 8
    c.tasks.pool_size = 2000
    c.sandbox.workers = 1
    c.sandbox.timeout_s = 20.0
    c.prompt.report_max_chars = 700
    return c
