"""Multi-hop QA independent proposals (the paper's protocol): 80 proposals from the seed retrieval
workflow per dataset, each scored by exact match on held-out questions; mean and oracle best-of-80
(see configs/adapt_qa.py for the servers and data flags)."""

from configs import adapt_qa


def get_config():
    c = adapt_qa.get_config()
    c.run_dir = "runs/eval_qa_single"
    c.evaluation.protocol = "single"
    c.adapt.proposals = 80
    c.adapt.runs = 1
    return c
