"""Build data/sft_tiny.jsonl: generated revisions of reasoning harnesses of many shapes, each paired
with the proposer prompt the tiny run shows for that harness.

    python scripts/make_sft_tiny.py [--rounds 24] [--seed 0] [--out data/sft_tiny.jsonl]

Each row is one (SFT family, feedback round): a harness (the seed harness in `--seed-share` of the
rows; the seed's shape carrying up to two fixes, the harnesses adaptation reaches, in
`--default-names-share`; else a variant with other names, docstring and layout that may carry up
to two fixes; hljax/data/harness_fixes.py), run on the round's feedback questions in the sandbox with
configs/tiny.py's solver (the simulated solver, a stand-in for an LLM) and prompt settings, and
the edit that adds one fix to it, after a line quoting the first answer the report shows (a habit of
reading, not a diagnosis). The fix is drawn uniformly among those the harness lacks, whatever the
report shows (in `--empty-report-share` of the rows the prompt shows no report at all): SFT
teaches the edit format and the fixes, and any tie between a symptom in the
report and its fix must be learnt by RL from the reward. With `--fixes all` each harness and report
is paired with every fix it lacks, one row each, so nothing in a prompt predicts the fix: the SFT
proposer's best fit is a uniform choice on every prompt, not a drawn fix's chance tie to a prompt.
Every edit copies its SEARCH lines from the harness in its own prompt, and applies to it (checked here). Rows are in the schema the teacher
collector writes (hljax/rl/sft_data.py); `scores` is null because these edits were not scored.
"""

import argparse
import dataclasses
import json
import os
import random
import sys
from types import SimpleNamespace

import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # noqa: E402
from hljax.checkpoint.presets import TOKENIZER_DIR  # noqa: E402
from hljax.data import harness_fixes as hf  # noqa: E402
from hljax.harness import edits  # noqa: E402
from hljax.harness.prompts import EMPTY_REPORT, token_counter  # noqa: E402
from hljax.loop.revision import build_state, candidate  # noqa: E402
from hljax.rl.run_config import RunConfig  # noqa: E402
from hljax.tasks.reasoning_gym import FamilyLists, RGTaskConfig, family_tasks  # noqa: E402
from hljax.tasks.simulated_solver import SimulatedSolver  # noqa: E402
from hljax.tasks.suite import split_config  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=24, help="rows per SFT family (one feedback round each)")
    parser.add_argument("--seed", type=int, default=0, help="draws harness variants and fixes")
    parser.add_argument("--seed-share", type=float, default=0.4, help="share of rows on the seed harness itself")
    parser.add_argument("--default-names-share", type=float, default=0.3,
                        help="share of rows on variants with the seed's names, docstring and layout")
    parser.add_argument("--empty-report-share", type=float, default=0.1,
                        help="share of rows whose prompt shows an empty report (prompt.report='empty'), so that "
                        "bench/learning.py's ablation asks the proposer nothing it has not seen")
    parser.add_argument("--fixes", choices=("one", "all"), default="one",
                        help="one: a fix drawn uniformly per harness; all: a row for every fix the harness lacks")
    parser.add_argument("--out", default="data/sft_tiny.jsonl")
    args = parser.parse_args()
    cfg = RunConfig.from_config(tiny.get_config())
    rng = random.Random(args.seed)
    lists = FamilyLists.shipped()
    base = RGTaskConfig(family=lists.families("sft")[0], generator_seed=cfg.seed, pool_size=cfg.tasks.pool_size,
                        splits=split_config(cfg.tasks.feedback, cfg.tasks.scoring, cfg.tasks.eval, cfg.seed))
    tasks = family_tasks(lists, "sft", base)
    solver = SimulatedSolver(seed=cfg.seed)
    # The tiny proposer's tokenizer: the prompt's budgets in tokens (task_max_tokens) count with it.
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    count = token_counter(cfg.prompt, SimpleNamespace(tokenizer=tokenizer))
    rows = []
    with SandboxPool(cfg.sandbox, solver, cfg.solver.budget) as pool:
        for family, task in tasks.items():
            for r in range(args.rounds):
                draw = rng.random()
                if draw < args.seed_share:
                    variant = hf.Variant()
                else:  # The harnesses adaptation reaches (the seed's names), then any names.
                    variant = hf.random_variant(rng, names=draw > args.seed_share + args.default_names_share)
                kind = rng.choice([k for k in hf.KINDS if k not in variant.fixes])
                harness = hf.render(variant)
                state = build_state(pool, task, harness, r)
                prompt = cfg.prompt
                if rng.random() < args.empty_report_share:
                    prompt = dataclasses.replace(prompt, report="empty")
                shown = EMPTY_REPORT if prompt.report == "empty" else state.report.render(max_chars=prompt.report_max_chars)
                kinds = [kind] if args.fixes == "one" else [k for k in hf.KINDS if k not in variant.fixes]
                for k in kinds:
                    completion = hf.fix_completion(variant, k, shown)
                    applied = candidate(harness, completion)
                    if not isinstance(applied, edits.Applied) or applied.code != hf.render(variant.with_fix(k)):
                        raise AssertionError(f"the {k} edit of {variant} does not apply as written: {applied}")
                    rows.append({
                        "id": f"tiny-{family}-{r}" + ("" if args.fixes == "one" else f"-{k}"),
                        "task": task.name,
                        "harness": harness,
                        "messages": state.messages(prompt, count),
                        "completion": completion,
                        "scores": None,
                        "filters": {"valid_edit": True, "runs": None},
                        "source": f"generated:{k}",
                    })
            print(f"{family}: {args.rounds} harnesses", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
