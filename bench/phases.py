"""Where a training run's time went, from its metrics.jsonl: SFT steps and each GRPO phase, one
stacked bar per run, with the seconds printed.

    python bench/phases.py RUN_DIR[=LABEL] [RUN_DIR[=LABEL] ...] [--out docs/tiny_phases.png] [--skip N]

Reads only what the trainer wrote (`time/train_s` of SFT rows, `time/<phase>_s` of GRPO rows, the
phases of hljax.rl.trainer.PHASES); start-up, the validity checks and the final export are not in
the rows and are not drawn. `--skip N` leaves out each run's first N GRPO steps (where a large shape
compiles), for its steady state.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hljax.rl.trainer import PHASES  # noqa: E402


def phase_seconds(run_dir: str, skip: int = 0) -> dict[str, float]:
    """-> {"SFT steps": s, "GRPO <phase>": s, ...} summed over the run's metrics rows (GRPO's after its
    first `skip` steps)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = {"SFT steps": sum(r.get("time/train_s", 0.0) for r in rows if r.get("stage") == "sft")}
    grpo = [r for r in rows if r.get("stage") == "grpo"][skip:]
    for phase in PHASES:
        out[f"GRPO {phase}"] = sum(r.get(f"time/{phase}_s", 0.0) for r in grpo)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    parser.add_argument("--out", default="", help="a PNG to draw (matplotlib); else only the table")
    parser.add_argument("--title", default="Where the run's time went")
    parser.add_argument("--skip", type=int, default=0, help="leave out each run's first N GRPO steps (compiles)")
    args = parser.parse_args()
    runs = [(r.split("=", 1) + [os.path.basename(r.rstrip("/"))])[:2] for r in args.runs]
    data = {label: phase_seconds(path, args.skip) for path, label in runs}
    names = list(next(iter(data.values())))
    print("| phase | " + " | ".join(data) + " |")
    print("|---|" + "---|" * len(data))
    for name in names + ["total"]:
        cells = [sum(d.values()) if name == "total" else d[name] for d in data.values()]
        print(f"| {name} | " + " | ".join(f"{c:.1f} s" for c in cells) + " |")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(10, 1.6 + 0.7 * len(data)))
        labels = list(data)[::-1]
        left = [0.0] * len(labels)
        colors = plt.get_cmap("tab10")
        for i, name in enumerate(names):
            widths = [data[label][name] for label in labels]
            ax.barh(labels, widths, left=left, color=colors(i), label=name)
            for y, (x0, w) in enumerate(zip(left, widths)):
                if w > 8:
                    ax.text(x0 + w / 2, y, f"{w:.0f}", ha="center", va="center", fontsize=8, color="white")
            left = [a + w for a, w in zip(left, widths)]
        ax.set_xlabel("seconds (sum over the run's steps)")
        ax.set_title(args.title)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(args.out, dpi=110, bbox_inches="tight")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
