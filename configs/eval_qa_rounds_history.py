"""The paper's multi-hop QA rounds protocol (4 runs x 10 rounds x 8 proposals, `BestOfG`) with each
proposer evaluated twice on the same seeds and questions: without history (row `<label>`) and with the
run's earlier candidates in its prompt (row `<label>+history`; the newest 8, one round's worth).
See configs/adapt_qa.py for the servers and data flags."""

from configs import eval_qa_rounds


def get_config():
    c = eval_qa_rounds.get_config()
    c.run_dir = "runs/eval_qa_rounds_history"
    c.evaluation.compare_history = True
    c.prompt.history.mode = "last"
    c.prompt.history.last = 8
    return c
