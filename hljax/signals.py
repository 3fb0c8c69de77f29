"""Stop signals: SIGTERM (a scheduler) and SIGINT (Ctrl-C) ask a long run to stop at its next safe
point (a checkpoint after the current step, a persisted round or row), and the run then ends with
exit code 128 + the signal (143, 130); a second Ctrl-C quits at once (KeyboardInterrupt), unsaved.

A `StopSignals` around the run installs the handlers; code with safe points calls `stop_point()`,
which raises `Stopped` once a signal arrived (and does nothing outside a `StopSignals`, as in tests
and library use). Waits call it too, so a signal ends them at once.
"""

from __future__ import annotations

import signal
import threading

_ACTIVE: list[StopSignals] = []  # Innermost last.
HANDLED = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """A stop signal arrived and the run stopped at a safe point. `exit_code`: 128 + the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """SIGTERM / SIGINT handlers for the duration of a `with` block. `what`: what happens next, as the
    one line printed when the first signal arrives says ("checkpointing after the current step").
    `announce`: print that line (one process of a multi-process run speaks for all)."""

    def __init__(self, what: str, announce: bool = True):
        self.what = what
        self.announce = announce
        self.signum: int | None = None  # The first stop signal received.
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def stopped(self, detail: str, signum: int | None = None) -> Stopped:
        """The exception that ends the run after `detail` (e.g. "saved step 41")."""
        sig = signal.Signals(signum or self.signum or signal.SIGTERM)
        return Stopped(f"{sig.name}: {detail}; rerun the same command to resume", sig)

    def __enter__(self) -> StopSignals:
        # Handlers can only be set from the main thread; elsewhere the signals keep their defaults.
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in HANDLED}
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        _ACTIVE.remove(self)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # A second Ctrl-C: quit now, unsaved.
            return
        self.signum = signum
        if self.announce:
            hint = " (Ctrl-C again to quit at once, unsaved)" if signum == signal.SIGINT else ""
            print(f"\n{signal.Signals(signum).name} received: {self.what}{hint}", flush=True)


def requested() -> bool:
    """Whether the innermost `StopSignals` received a signal (False outside any)."""
    return bool(_ACTIVE) and _ACTIVE[-1].requested


def stop_point(detail: str = "stopped at a safe point") -> None:
    """Raise `Stopped` (naming `detail`) if a stop signal arrived; a no-op otherwise."""
    if requested():
        raise _ACTIVE[-1].stopped(detail)
