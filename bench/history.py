"""The tiny proposer with and without history (issue 23), at CPU scale with the simulated solver.

For each seed, configs/eval_tiny_history.py evaluates one exported tiny proposer twice on the same
questions and sampling seeds: row `tiny` with the paper's prompt, row `tiny+history` with the run's
earlier candidates in its prompt (prompt.history). Protocols: `rg`, the paper's Reasoning Gym
multistep protocol (5 rounds, 1 proposal, keep_if_better); optionally `qa`, the paper's QA selection
protocol (10 rounds, best of 8, BestOfG) run on the same Reasoning Gym families (the tiny proposer
knows no QA). Prints one table (mean ± spread over seeds of the mean over families) and, with
--write, puts it in docs/benchmarks.md. Needs a trained export; it trains nothing:

    python -m launch.train --config configs/tiny.py          # runs/tiny/export, about 9 min
    python bench/history.py --export runs/tiny/export --seeds 0,1,2 [--protocols rg,qa] [--write]

`--export` may hold `{seed}` (e.g. runs/bench_learning/train-seed{seed}/export, bench/learning.py's
per-seed proposers). Resumable: a finished evaluation's results.csv is reused.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MARK_BEGIN = "<!-- bench/history.py: begin -->"
MARK_END = "<!-- bench/history.py: end -->"
PROTOCOLS = {  # name -> (rounds, proposals, policy): the paper's two multistep protocols.
    "rg": (5, 1, "keep_if_better"),
    "qa": (10, 8, "best_of_g"),
}
ROWS = ("seed", "tiny", "tiny+history")


def evaluate(export: str, seed: int, protocol: str, out: str, args) -> dict[str, float]:
    """Mean held-out score over families of each row of one evaluation."""
    from configs import eval_tiny_history
    from hljax.loop import evaluate as ev
    from hljax.loop.run_config import EvalRunConfig

    c = eval_tiny_history.get_config()
    c.run_dir = os.path.join(out, f"seed{seed}-{protocol}")
    c.seed = seed
    c.proposers = (f"tiny={export}",)
    c.adapt.rounds, c.adapt.proposals, c.adapt.policy = PROTOCOLS[protocol]
    c.evaluation.eval_questions = args.eval_questions
    c.adapt.scoring_questions = args.scoring_questions
    if args.families:
        c.tasks.families = tuple(args.families.split(","))
    done = os.path.join(c.run_dir, "results.csv")
    if not os.path.exists(done):
        ev.run(EvalRunConfig.from_config(c))
    return mean_by_row(open(done).read())


def mean_by_row(results_csv: str) -> dict[str, float]:
    """results.csv (hljax/loop/tables.py) -> {proposer row: mean over its tasks of `mean`}."""
    rows: dict[str, list[float]] = {}
    for r in csv.DictReader(results_csv.splitlines()):
        rows.setdefault(r["proposer"], []).append(float(r["mean"]))
    return {label: statistics.fmean(v) for label, v in rows.items()}


def spread(xs: list[float]) -> str:
    if not xs:
        return "–"
    if len(xs) < 2:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def table(results: dict[tuple[str, str], list[float]], protocols: list[str], seeds: list[int], header: str) -> str:
    """Markdown: one row per proposer row, one column per protocol."""
    names = {"rg": "5 rounds keep_if_better (G=1)", "qa": "10 rounds best of 8"}
    lines = [header, "", "| proposer | " + " | ".join(names[p] for p in protocols) + " |",
             "|---" * (len(protocols) + 1) + "|"]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(spread(results.get((p, row), [])) for p in protocols) + " |")
    lines += ["", "Per seed (" + ", ".join(f"seed {s}" for s in seeds) + "): "
              + "; ".join(f"{p} {row}: " + " / ".join(f"{x:.3f}" for x in results.get((p, row), []))
                          for p in protocols for row in ROWS[1:]) + "."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True, help="the tiny proposer's HF folder; may contain {seed}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--protocols", default="rg", help="rg, qa or rg,qa")
    parser.add_argument("--out", default="runs/bench_history")
    parser.add_argument("--families", default="", help="held-out families (default: configs/adapt_tiny.py's)")
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--scoring-questions", type=int, default=8)
    parser.add_argument("--write", action="store_true", help="replace the table in docs/benchmarks.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    protocols = args.protocols.split(",")
    if set(protocols) - set(PROTOCOLS):
        parser.error(f"--protocols: {sorted(set(protocols) - set(PROTOCOLS))} unknown; valid: {sorted(PROTOCOLS)}")
    t0 = time.time()
    results: dict[tuple[str, str], list[float]] = {}
    for seed in seeds:
        export = args.export.format(seed=seed)
        for protocol in protocols:
            means = evaluate(export, seed, protocol, args.out, args)
            for row, value in means.items():
                results.setdefault((protocol, row), []).append(value)
            print(f"seed {seed} {protocol}: " + ", ".join(f"{k} {v:.3f}" for k, v in means.items()), flush=True)
    header = (
        f"Measured with the **simulated solver** (hljax/tasks/simulated_solver.py, a stand-in for an LLM on CPU; "
        f"not a real model's scores), the tiny proposer `{args.export}` (trained without history), seeds {seeds}: "
        f"mean ± standard deviation over seeds of the held-out score of the final harness, mean over families. "
        f"{args.eval_questions} held-out questions and {args.scoring_questions} scoring questions per family; "
        f"`python bench/history.py {' '.join(sys.argv[1:])}` ({(time.time() - t0) / 60:.0f} min, "
        f"{time.strftime('%Y-%m-%d')}).")
    text = table(results, protocols, seeds, header)
    print("\n" + text)
    if args.write:
        path = os.path.join(ROOT, "docs", "benchmarks.md")
        doc = open(path).read()
        block = f"{MARK_BEGIN}\n{text}\n{MARK_END}"
        if MARK_BEGIN not in doc:
            raise SystemExit(f"{path} has no {MARK_BEGIN} ... {MARK_END} block to replace")
        doc = re.sub(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), lambda _: block, doc, flags=re.S)
        with open(path, "w") as f:
            f.write(doc)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
