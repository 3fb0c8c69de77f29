"""The paper's proposer comparison at CPU scale, with the simulated solver (a stand-in for an LLM).

For each seed: the tiny default (configs/tiny.py: SFT, then GRPO on the 5 RL families) is trained,
its proposer exported after SFT and after GRPO; then the seed harness, the SFT proposer and the RL
proposer are evaluated on (a) the RL families and (b) the 21 held-out families, with
- the single-step protocol of configs/eval_rg_single.py: 8 proposals from the seed harness per
  family, scored on held-out questions; the mean over proposals is the headline, best-of-8 an oracle;
- a 5-round `keep_if_better` adaptation (configs/eval_rg_multistep.py): one proposal per round, the
  kept harness after the last round scored on held-out questions.
Prints one table (mean and spread over seeds) and, with --write, puts it in docs/benchmarks.md.

    python bench/learning.py --seeds 0,1,2 [--write] [--out runs/bench_learning]

Everything is resumable: a finished training run or evaluation is reused when its files exist.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MARK_BEGIN = "<!-- bench/learning.py: begin -->"
MARK_END = "<!-- bench/learning.py: end -->"


def train(seed: int, out: str, extra: list[str]) -> tuple[str, float | None]:
    """The tiny default for `seed`; -> (run dir, wall seconds, None when an earlier run is reused)."""
    run_dir = os.path.join(out, f"train-seed{seed}")
    seconds = None
    if not os.path.exists(os.path.join(run_dir, "export", "config.json")):
        cmd = [sys.executable, "-m", "launch.train", "--config", "configs/tiny.py", f"--config.seed={seed}",
               f"--config.run_dir={run_dir}", "--config.export.after_sft=True", *extra]
        print("$", " ".join(cmd), flush=True)
        t = time.time()
        subprocess.run(cmd, cwd=ROOT, check=True)
        seconds = time.time() - t
    return run_dir, seconds


def evaluate(run_dir: str, seed: int, role: str, protocol: str, out: str, args) -> dict:
    """Mean over tasks of each row (seed, sft, rl): {'mean', 'oracle'} per label."""
    from configs import adapt_tiny
    from hljax.loop import evaluate as ev
    from hljax.loop.run_config import EvalRunConfig

    c = adapt_tiny.get_config()
    c.run_dir = os.path.join(out, f"eval-seed{seed}-{role}-{protocol}")
    c.seed = seed
    c.proposers = (f"sft={run_dir}/export-sft", f"rl={run_dir}/export")
    c.tasks.role = role
    if role == "heldout":
        # Some held-out families' task texts make prompts past 2,048 tokens (configs/adapt_tiny.py's
        # engine context, kept for the RL families); the tiny model takes 4,096 positions.
        c.proposer.max_seq_len = 4096
    c.tasks.families = ()
    c.evaluation.eval_questions = args.eval_questions
    c.adapt.scoring_questions = args.scoring_questions
    c.adapt.temperature = 0.5  # The tiny default's GRPO sampling temperature.
    c.report.html = False
    c.report.plots = False
    if protocol == "single":
        c.evaluation.protocol = "single"
        c.adapt.proposals = 8
    else:
        c.evaluation.protocol = "rounds"
        c.adapt.rounds = 5
        c.adapt.proposals = 1
        c.adapt.runs = 1
        c.adapt.policy = "keep_if_better"
    cfg = EvalRunConfig.from_config(c)
    done = os.path.join(c.run_dir, "results.csv")
    if not os.path.exists(done):
        ev.run(cfg)
    rows: dict[str, dict[str, list[float]]] = {}
    with open(done) as f:
        header = f.readline().strip().split(",")
        for line in f:
            r = dict(zip(header, line.strip().split(",")))
            d = rows.setdefault(r["proposer"], {"mean": [], "oracle": []})
            d["mean"].append(float(r["mean"]))
            d["oracle"].append(float(r["oracle"]))
    return {label: {k: statistics.fmean(v) for k, v in d.items()} for label, d in rows.items()}


def grpo_rise(run_dir: str) -> tuple[float, float]:
    """score/mean of the sampled candidates: mean of the first and of the last quarter of GRPO steps."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    scores = [r["score/mean"] for r in rows if r.get("stage") == "grpo"]
    q = max(1, len(scores) // 4)
    return statistics.fmean(scores[:q]), statistics.fmean(scores[-q:])


def spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/bench_learning")
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--scoring-questions", type=int, default=8)
    parser.add_argument("--roles", default="rl,heldout")
    parser.add_argument("--write", action="store_true", help="replace the table in docs/benchmarks.md")
    parser.add_argument("train_args", nargs="*", help="extra --config.* overrides for training")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    roles = args.roles.split(",")
    t0 = time.time()
    results = {}  # (role, protocol, label, field) -> [per seed]
    rises = []
    runs, walls = {}, []
    for seed in seeds:  # Every training run first: they are also the tiny default's 3-seed check.
        runs[seed], seconds = train(seed, args.out, args.train_args)
        rises.append(grpo_rise(runs[seed]))
        walls.append(seconds)
        print(f"seed {seed}: tiny default {'reused' if seconds is None else f'{seconds / 60:.1f} min'}; "
              f"GRPO score/mean first quarter {rises[-1][0]:.3f} -> last quarter {rises[-1][1]:.3f}", flush=True)
    for seed in seeds:
        run_dir = runs[seed]
        for role in roles:
            for protocol in ("single", "rounds"):
                table = evaluate(run_dir, seed, role, protocol, args.out, args)
                for label, d in table.items():
                    for field, value in d.items():
                        results.setdefault((role, protocol, label, field), []).append(value)
                print(f"seed {seed} {role} {protocol}: " + ", ".join(f"{k} {v['mean']:.3f}" for k, v in table.items()),
                      flush=True)
    minutes = (time.time() - t0) / 60
    lines = [
        f"Measured with the **simulated solver** (hljax/tasks/simulated_solver.py, a stand-in for an LLM on CPU; "
        f"these are not a real model's scores), the tiny proposer of configs/tiny.py, seeds {seeds}: "
        f"mean ± standard deviation over seeds of the mean over families. "
        f"{args.eval_questions} held-out questions per family; `python bench/learning.py {' '.join(sys.argv[1:])}` "
        f"({minutes:.0f} min on 2 CPU cores, {time.strftime('%Y-%m-%d')}).",
        "",
        "| families | proposer | single step: mean of 8 | single step: best of 8 (oracle) | 5 rounds keep_if_better |",
        "|---|---|---|---|---|",
    ]
    for role in roles:
        for label in ("seed", "sft", "rl"):
            single = results.get((role, "single", label, "mean"), [])
            oracle = results.get((role, "single", label, "oracle"), [])
            rounds = results.get((role, "rounds", label, "mean"), [])
            name = {"rl": "5 RL families", "heldout": "21 held-out families"}[role]
            cell_oracle = "–" if label == "seed" else spread(oracle)
            lines.append(f"| {name} | {label} | {spread(single)} | {cell_oracle} | {spread(rounds)} |")
    lines += ["", "GRPO of the tiny default, `score/mean` of the sampled candidates (first quarter of GRPO steps "
              "-> last quarter): " + "; ".join(f"seed {s}: {a:.3f} -> {b:.3f}" for s, (a, b) in zip(seeds, rises))
              + ". Wall time of each tiny default run: "
              + ", ".join("reused" if w is None else f"{w / 60:.1f} min" for w in walls) + "."]
    table = "\n".join(lines)
    print("\n" + table)
    if args.write:
        path = os.path.join(ROOT, "docs", "benchmarks.md")
        text = open(path).read()
        block = f"{MARK_BEGIN}\n{table}\n{MARK_END}"
        if MARK_BEGIN in text:
            text = re.sub(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), lambda _: block, text, flags=re.S)
        else:
            text += "\n\n## Harness learning at CPU scale (bench/learning.py)\n\n" + block + "\n"
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
