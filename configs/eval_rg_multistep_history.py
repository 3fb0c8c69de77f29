"""The paper's Reasoning Gym multistep protocol (5 rounds, 1 proposal per round, `KeepIfBetter`) with
each proposer evaluated twice on the same seeds and questions: without history (row `<label>`, the
paper's prompt) and with the run's earlier candidates in its prompt (row `<label>+history`):

    python -m launch.evaluate --config configs/eval_rg_multistep_history.py --config.solver.path=/models/Qwen3.5-4B \
        --config.proposers='("rl=http://127.0.0.1:30002|runs/rg_grpo/export",)'
"""

from configs import eval_rg_multistep


def get_config():
    c = eval_rg_multistep.get_config()
    c.run_dir = "runs/eval_rg_multistep_history"
    c.evaluation.compare_history = True
    c.prompt.history.mode = "last"
    return c
