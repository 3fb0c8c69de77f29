"""Multi-hop QA revision runs as an evaluation over proposers: 4 runs x 10 rounds x 8 proposals,
`BestOfG`, exact match (see configs/adapt_qa.py for the servers and data flags)."""

from configs import adapt_qa


def get_config():
    c = adapt_qa.get_config()
    c.run_dir = "runs/eval_qa_rounds"
    return c
