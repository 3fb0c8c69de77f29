"""Build data/sft_tiny.jsonl: hand-written revisions of the seed reasoning harness, one per
(SFT family, feedback round), each paired with the proposer prompt the tiny run shows for that state.

    python scripts/make_sft_tiny.py [--rounds 4] [--out data/sft_tiny.jsonl]

The edits below are written for this repo: helpful, neutral and harmful ones in equal shares per
kind's count (see EDITS). The prompts come from running the seed harness on each family's feedback
questions in the sandbox, with configs/tiny.py's solver (the simulated solver, a stand-in for an
LLM) and prompt settings, so SFT and GRPO see the same prompt distribution.
Rows are in the schema the teacher collector writes (hljax/rl/sft_data.py); `scores` is null
because these edits were not scored.
"""

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # noqa: E402
from hljax.harness import edits, seeds  # noqa: E402
from hljax.loop.revision import build_state, candidate  # noqa: E402
from hljax.tasks.suite import split_config  # noqa: E402
from hljax.rl.run_config import RunConfig  # noqa: E402
from hljax.tasks.reasoning_gym import FamilyLists, RGTaskConfig, family_tasks  # noqa: E402
from hljax.tasks.simulated_solver import SimulatedSolver  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402

RETURN = "    return solver.generate(question).strip()"
SIGNATURE = "def solve(question: str, solver) -> str:"


def block(search: str, replace: str) -> str:
    return f"{edits.SEARCH}\n{search}\n{edits.DIVIDER}\n{replace}\n{edits.REPLACE}"


# A mix of helpful, neutral and harmful generic edits (kinds as the simulated solver of configs/tiny.py
# scores them: hljax/tasks/simulated_solver.py), so that what GRPO raises is learned from the reward,
# not copied from SFT. Rows get the edits in equal shares, whatever the prompt says.
EDITS = [
    # helpful
    ("helpful", "Ask for step-by-step reasoning and give the solver room for it.",
     block(RETURN, '    prompt = question + "\\n\\nThink step by step, then give the final answer in the requested format."\n'
                   "    return solver.generate(prompt, max_new_tokens=512, temperature=0.0).strip()")),
    ("helpful", "Draft an answer, then ask the solver to check it.",
     block(RETURN, "    draft = solver.generate(question, temperature=0.0).strip()\n"
                   "    checked = solver.generate(\n"
                   '        question + "\\n\\nProposed answer:\\n" + draft + "\\n\\nIf it is wrong, give the corrected answer in "\n'
                   '        "the same format; otherwise repeat it exactly.",\n'
                   "        temperature=0.0,\n"
                   "    ).strip()\n"
                   "    return checked or draft")),
    ("helpful", "Remind the solver to answer only in the requested format.",
     block(RETURN, '    prompt = question + "\\n\\nReply with the final answer only, exactly in the format asked above."\n'
                   "    return solver.generate(prompt, temperature=0.0).strip()")),
    # neutral
    ("neutral", "Use greedy decoding so the answer is stable.",
     block(RETURN, "    return solver.generate(question, temperature=0.0).strip()")),
    ("neutral", "Frame the solver as a careful expert.",
     block(RETURN, '    prompt = "You are a careful expert. Solve the problem exactly.\\n\\n" + question\n'
                   "    return solver.generate(prompt, temperature=0.0).strip()")),
    ("neutral", "Keep only the last non-empty line, where the final answer usually is.",
     block(RETURN, "    reply = solver.generate(question, temperature=0.0).strip()\n"
                   "    lines = [line for line in reply.splitlines() if line.strip()]\n"
                   '    return lines[-1].strip() if lines else ""')),
    # harmful
    ("harmful", "Ask for step-by-step reasoning before the answer.",
     block(RETURN, '    prompt = question + "\\n\\nThink step by step, then give the final answer in the requested format."\n'
                   "    return solver.generate(prompt).strip()")),
    ("harmful", "Ask for a plain-text answer without formatting.",
     block(RETURN, '    prompt = question + "\\n\\nAnswer in plain text, no formatting."\n'
                   "    return solver.generate(prompt, temperature=0.0).strip()")),
    ("harmful", "Cut the answer-format line to keep the prompt short.",
     block(RETURN, '    lines = [line for line in question.splitlines() if not line.startswith("Answer format:")]\n'
                   '    return solver.generate("\\n".join(lines), temperature=0.0).strip()')),

]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="data/sft_tiny.jsonl")
    args = parser.parse_args()
    cfg = RunConfig.from_config(tiny.get_config())
    harness = seeds.load("reasoning")
    for _, note, completion in EDITS:  # Every bundled edit must apply to the seed harness.
        result = candidate(harness, completion)
        assert isinstance(result, edits.Applied), (note, result)
    lists = FamilyLists.shipped()
    base = RGTaskConfig(family=lists.families("sft")[0], generator_seed=cfg.seed, pool_size=cfg.tasks.pool_size,
                        splits=split_config(cfg.tasks.feedback, cfg.tasks.scoring, cfg.tasks.eval, cfg.seed))
    tasks = family_tasks(lists, "sft", base)
    solver = SimulatedSolver(seed=cfg.seed)
    # Equal shares: row k gets edit order[k % len(EDITS)], the order a fixed shuffle.
    order = sorted(range(len(EDITS)), key=lambda i: hashlib.sha256(f"edit:{i}".encode()).hexdigest())
    rows = []
    with SandboxPool(cfg.sandbox, solver, cfg.solver.budget) as pool:
        for f_index, (family, task) in enumerate(tasks.items()):
            for r in range(args.rounds):
                state = build_state(pool, task, harness, r)
                _, note, completion = EDITS[order[(f_index * args.rounds + r) % len(EDITS)]]
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
