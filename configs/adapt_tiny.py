"""The embedded default of test-time adaptation: the tiny proposer trained by configs/tiny.py
revises the seed harness on two held-out families for 3 rounds (2 proposals per round, `BestOfG`),
with our JAX engine as proposer server and the simulated solver (a stand-in for an LLM on CPU,
hljax/tasks/simulated_solver.py), as in the tiny default. Minutes on 2 CPU cores:

    python -m launch.train --config configs/tiny.py      # writes runs/tiny/export
    python -m launch.adapt --config configs/adapt_tiny.py
"""

from configs import adapt_base


def get_config():
    c = adapt_base.get_config()
    c.run_dir = "runs/adapt_tiny"
    c.proposers = ("tiny=runs/tiny/export",)
    c.proposer.max_seq_len = 2048
    c.tasks.role = "heldout"
    c.tasks.families = ("aiw", "syllogism")
    c.tasks.feedback = 3
    c.tasks.pool_size = 2000
    c.adapt.rounds = 3
    c.adapt.proposals = 2
    c.adapt.policy = "best_of_g"
    c.adapt.scoring_questions = 4
    c.adapt.max_new_tokens = 160
    c.evaluation.eval_questions = 6
    c.solver.backend = "simulated"
    c.solver.max_seq_len = 1024
    # The tiny default's solver block (configs/tiny.py): the scores it trained on.
    c.solver.max_new_tokens = 256
    c.solver.max_calls = 8
    c.solver.max_tokens = 8192
    c.prompt.report_max_chars = 700
    # The longest task description of any family the tiny proposer trains on is 293 tokens (SFT and RL
    # families); a held-out family's runs to 1,424, past the positions it was ever trained on (issue 33).
    c.prompt.task_max_tokens = 320
    return c
