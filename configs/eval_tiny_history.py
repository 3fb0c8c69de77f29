"""The tiny proposer with and without history at CPU scale, with the simulated solver: the Reasoning
Gym multistep protocol (5 rounds, 1 proposal per round, `KeepIfBetter`) on configs/adapt_tiny.py's
held-out families, rows `tiny` and `tiny+history` on the same seeds and questions. bench/history.py
runs it over seeds and writes the table in docs/benchmarks.md:

    python -m launch.train --config configs/tiny.py      # writes runs/tiny/export (about 9 min)
    python -m launch.evaluate --config configs/eval_tiny_history.py
"""

from configs import adapt_tiny


def get_config():
    c = adapt_tiny.get_config()
    c.run_dir = "runs/eval_tiny_history"
    c.adapt.rounds = 5
    c.adapt.proposals = 1
    c.adapt.policy = "keep_if_better"
    c.adapt.temperature = 0.5  # The tiny default's GRPO sampling temperature (as bench/learning.py).
    c.evaluation.compare_history = True
    c.prompt.history.mode = "last"
    c.prompt.history.last = 4
    c.prompt.history.max_chars = 1200  # Sized like the tiny default's report (700 chars).
    c.proposer.max_seq_len = 4096  # The tiny model's positions: the history lengthens prompts.
    return c
