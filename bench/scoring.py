"""Cost of scoring answers in the isolated scorer process vs in-process `Task.score`.

    python bench/scoring.py [--answers 200] [--family gcd] [--parallel 2] [--isolation bwrap]

Scores the same answers (each question's reference, so every scorer path runs to the end) both
ways: `task.score` in this process, and `ScorerProcess.score`, one round trip with one forked,
confined child per answer. Also reports the scorer process's cold start (launch, reasoning-gym
import, dataset build), paid once per pool.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hljax.tasks.reasoning_gym import RGTaskConfig, ReasoningGymTask  # noqa: E402
from hljax.tasks.splits import SplitConfig  # noqa: E402
from sandbox.config import SandboxConfig  # noqa: E402
from sandbox.scoring import ScorerProcess  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--family", default="gcd")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits_only"])
    args = parser.parse_args()
    n = args.answers
    task = ReasoningGymTask(RGTaskConfig(args.family, splits=SplitConfig(seed=0, feedback_size=n)))
    questions = task.feedback_round(0)
    payloads = [task.score_payload(q) for q in questions]
    items = [(i, q.answer) for i, q in enumerate(questions)]

    t0 = time.perf_counter()
    local = [task.score(q.answer, q).value for q in questions]
    t_local = time.perf_counter() - t0

    scorer = ScorerProcess(SandboxConfig(isolation=args.isolation, scorer_parallel=args.parallel))
    try:
        t0 = time.perf_counter()
        scorer.score(task.scorer_spec(), payloads[:1], items[:1])
        t_cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        isolated = scorer.score(task.scorer_spec(), payloads, items)
        t_iso = time.perf_counter() - t0
    finally:
        scorer.shutdown()
    assert [s.value for s in isolated] == local, "isolated and in-process scores differ"
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {args.family}, {n} answers:")
    print(f"in-process task.score: {t_local * 1e3:8.1f} ms total, {t_local * 1e3 / n:6.3f} ms per answer")
    print(f"isolated, warm:        {t_iso * 1e3:8.1f} ms total, {t_iso * 1e3 / n:6.3f} ms per answer "
          f"({args.parallel} children at a time)")  # fmt: skip
    print(f"scorer process cold start (launch, import, build, 1 answer): {t_cold * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
