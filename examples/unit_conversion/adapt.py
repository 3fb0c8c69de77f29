"""Adapt the seed harness of examples/unit_conversion/task.py with the tiny proposer of the quick start
(runs/tiny/export) and the simulated solver, then evaluate it: a few minutes on 2 CPU cores.

    python -m launch.adapt --config examples/unit_conversion/adapt.py

Any key can be overridden on the command line (--config.adapt.rounds=5); docs/configs.md lists them.
"""

import os

from configs import adapt_tiny


def get_config():
    c = adapt_tiny.get_config()
    c.run_dir = "runs/unit_conversion"
    c.tasks.suite = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task.py")
    c.tasks.families = ()  # Every task of the file (it has one).
    c.tasks.feedback = 4
    c.adapt.rounds = 3
    c.adapt.proposals = 4
    c.adapt.scoring_questions = 8
    c.evaluation.eval_questions = 32
    return c
