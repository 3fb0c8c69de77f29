"""Multi-hop QA test-time adaptation (the paper's protocol): 4 runs of 10 rounds with 8 proposals
per round, `BestOfG` (advance to the best candidate even when worse; invalid ones score 0), exact
match on HotpotQA, MuSiQue and 2WikiMultihopQA (official dev files). Qwen3-4B proposer, Qwen3-8B solver;
the solver, the report and the sandbox limit are the QA setup's (configs/setups.py), as in
configs/qa_grpo.py. Thinking mode is off for proposer and solver:

    python -m sglang.launch_server --model-path runs/qa_grpo/export --port 30000   # proposer
    python -m sglang.launch_server --model-path /models/Qwen3-8B --port 30001      # solver
    python -m launch.adapt --config configs/adapt_qa.py --config.solver.path=/models/Qwen3-8B \
        --config.proposers='("rl=http://127.0.0.1:30000|runs/qa_grpo/export",)' \
        --config.tasks.qa_files='("hotpotqa:/data/hotpot_dev_distractor_v1.json", "musique:/data/musique_ans_v1.0_dev.jsonl", "2wikimultihopqa:/data/2wiki_dev.json")'
"""

from configs import adapt_rg, setups


def get_config():
    c = adapt_rg.get_config()
    c.run_dir = "runs/adapt_qa"
    c.tasks.suite = "multihop_qa"
    c.tasks.qa_files = ()  # Required: "dataset:path" entries.
    c.adapt.runs = 4
    c.adapt.rounds = 10
    c.adapt.proposals = 8
    c.adapt.policy = "best_of_g"
    c.adapt.scoring_questions = 64
    c.evaluation.eval_questions = 200
    setups.apply(c, "multihop_qa")
    return c
