"""Build data/sft_tiny.jsonl: hand-written revisions of the seed reasoning harness, one per
(SFT family, feedback round), each paired with the proposer prompt the tiny run shows for that state.

    python scripts/make_sft_tiny.py [--rounds 4] [--out data/sft_tiny.jsonl]

The edits below are written for this repo. The prompts come from running the seed harness on each
family's feedback questions in the sandbox, with the tiny model (preset "tiny", seed 0) as solver,
rendered with configs/tiny.py's prompt settings, so SFT and GRPO see the same prompt distribution.
Rows are in the schema the teacher collector writes (hljax/rl/sft_data.py); `scores` is null
because these edits were not scored.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import rg_families, tiny  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.generate.engine import EngineConfig  # noqa: E402
from hljax.generate.local import LocalGenerator  # noqa: E402
from hljax.harness import edits, seeds  # noqa: E402
from hljax.loop.revision import build_state, candidate  # noqa: E402
from hljax.tasks.suite import split_config  # noqa: E402
from hljax.rl.run_config import RunConfig  # noqa: E402
from hljax.tasks.reasoning_gym import FamilyLists, RGTaskConfig, family_tasks  # noqa: E402
from hljax.models.presets import init_model  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402

RETURN = "    return solver.generate(question).strip()"
SIGNATURE = "def solve(question: str, solver) -> str:"


def block(search: str, replace: str) -> str:
    return f"{edits.SEARCH}\n{search}\n{edits.DIVIDER}\n{replace}\n{edits.REPLACE}"


EDITS = [
    ("Ask for step-by-step reasoning before the answer.",
     block(RETURN, '    prompt = question + "\\n\\nThink step by step, then give the final answer in the requested format."\n'
                   "    return solver.generate(prompt).strip()")),
    ("Use greedy decoding so the answer is stable.",
     block(RETURN, "    return solver.generate(question, temperature=0.0).strip()")),
    ("Give the solver more room and decode greedily.",
     block(RETURN, "    return solver.generate(question, max_new_tokens=512, temperature=0.0).strip()")),
    ("Sample three answers and keep the most common one.",
     block(RETURN, "    answers = [a.strip() for a in solver.generate_batch([question] * 3, temperature=0.7)]\n"
                   "    answers = [a for a in answers if a]\n"
                   "    if not answers:\n"
                   '        return ""\n'
                   "    return max(set(answers), key=answers.count)")),
    ("Draft an answer, then ask the solver to check it.",
     block(RETURN, "    draft = solver.generate(question, temperature=0.0).strip()\n"
                   "    checked = solver.generate(\n"
                   '        question + "\\n\\nProposed answer:\\n" + draft + "\\n\\nIf it is wrong, give the corrected answer in "\n'
                   '        "the same format; otherwise repeat it exactly.",\n'
                   "        temperature=0.0,\n"
                   "    ).strip()\n"
                   "    return checked or draft")),
    ("Remind the solver to answer only in the requested format.",
     block(RETURN, '    prompt = question + "\\n\\nReply with the final answer only, exactly in the format asked above."\n'
                   "    return solver.generate(prompt, temperature=0.0).strip()")),
    ("Retry once when the solver returns nothing.",
     block(RETURN, "    reply = solver.generate(question, temperature=0.0).strip()\n"
                   "    if not reply:\n"
                   "        reply = solver.generate(question, temperature=0.7).strip()\n"
                   "    return reply")),
    ("Frame the solver as a careful expert.",
     block(RETURN, '    prompt = "You are a careful expert. Solve the problem exactly.\\n\\n" + question\n'
                   "    return solver.generate(prompt, temperature=0.0).strip()")),
    ("Collapse whitespace in the reply, which some formats trip over.",
     block(f"{SIGNATURE}\n{RETURN}", f"import re\n\n\n{SIGNATURE}\n"
                                     "    reply = solver.generate(question, temperature=0.0).strip()\n"
                                     '    return re.sub(r"\\s+", " ", reply)')),
    ("Keep only the last non-empty line, where the final answer usually is.",
     block(RETURN, "    reply = solver.generate(question, temperature=0.0).strip()\n"
                   "    lines = [line for line in reply.splitlines() if line.strip()]\n"
                   '    return lines[-1].strip() if lines else ""')),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="data/sft_tiny.jsonl")
    args = parser.parse_args()
    cfg = RunConfig.from_config(tiny.get_config())
    harness = seeds.load("reasoning")
    for note, completion in EDITS:  # Every bundled edit must apply to the seed harness.
        result = candidate(harness, completion)
        assert isinstance(result, edits.Applied), (note, result)
    lists = FamilyLists.from_config(rg_families.get_config())
    base = RGTaskConfig(family=lists.families("sft")[0], generator_seed=cfg.seed, pool_size=cfg.tasks.pool_size,
                        splits=split_config(cfg.tasks.feedback, cfg.tasks.scoring, cfg.tasks.eval, cfg.seed))
    tasks = family_tasks(lists, "sft", base)
    with tempfile.TemporaryDirectory() as tmp:
        path = init_model("tiny", os.path.join(tmp, "tiny"), seed=0)
        solver = LocalGenerator.from_pretrained(path, shd.single_device_mesh(), EngineConfig(max_batch=16,
                                                                                             max_seq_len=1024))
        rows = []
        with SandboxPool(cfg.sandbox, solver, cfg.solver.budget) as pool:
            for family, task in tasks.items():
                for r in range(args.rounds):
                    state = build_state(pool, task, harness, r)
                    key = int(hashlib.sha256(f"{family}:{r}".encode()).hexdigest(), 16)
                    note, completion = EDITS[key % len(EDITS)]
                    rows.append({
                        "id": f"tiny-{family}-{r}",
                        "task": task.name,
                        "harness": harness,
                        "messages": state.messages(cfg.prompt),
                        "completion": f"{note}\n\n{completion}\n",
                        "scores": None,
                        "filters": {"valid_edit": True, "runs": None},
                        "source": "handwritten",
                    })
                print(f"{family}: {args.rounds} rows", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
