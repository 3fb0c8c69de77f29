"""The one schema of test-time adaptation and evaluation runs (`launch.adapt`, `launch.evaluate`).
Experiment configs start from `get_config()` and override fields; the config is locked, so a
misspelt key is an error that names it. Field meanings: hljax/loop/run_config.py."""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
    train = base.get_config()
    c = ml_collections.ConfigDict()
    c.run_dir = "runs/eval"
    c.seed = 0
    # Rows of the results table: "label=HF folder" (served by our engine behind the SGLang API) or
    # "label=http://host:port" (a running SGLang server; "|/hf/folder" after the URL names its tokenizer).
    c.proposers = ()
    c.proposer = dict(max_batch=16, max_seq_len=8192, dtype="float32")
    c.solver = train.solver.to_dict()  # solver.path "" = the first proposer's folder.
    c.tasks = train.tasks.to_dict()
    c.tasks.role = "heldout"
    c.adapt = dict(rounds=5, proposals=1, policy="keep_if_better", runs=1, scoring_questions=16,
                   max_new_tokens=1024, temperature=0.7, top_p=1.0, top_k=-1)
    c.evaluation = dict(protocol="rounds", eval_questions=64)
    c.sandbox = train.sandbox.to_dict()
    c.reward = train.reward.to_dict()
    c.prompt = train.prompt.to_dict()
    c.mesh = train.mesh.to_dict()
    c.distributed = train.distributed.to_dict()
    c.report = dict(html=True, plots=True)
    return c
