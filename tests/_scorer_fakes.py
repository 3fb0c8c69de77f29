"""Test-only scorer factories for the scorer process (SandboxConfig.scorer_packages must name "tests").

Imported inside the scorer sandbox: standard library only.
"""

import os
import signal
import time


def misbehaving_scorer():
    """Scores answer == payload, except that some answers make the scorer hang, spin or die."""

    def score(answer: str, payload: str) -> float:
        if answer == "hang":
            time.sleep(3600)
        elif answer == "spin":
            while True:
                pass
        elif answer == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        return float(answer == payload)

    return score
