"""`SandboxPool`: the trusted supervisor that runs many (harness, question) jobs at once.

Layers, outermost first:
1. this supervisor (trusted, in the caller's process): wall-clock deadlines, output caps, the
   solver/tool broker with per-job budgets and counts. References never reach a harness. Answers
   are scored in the scorer process (`sandbox.scoring`, another sandbox), never here, unless the
   caller passes a plain callable scorer (tests comparing text).
2. fork servers (`sandbox.worker`), each a long-lived process under bubblewrap (`isolation.py`), started
   and replaced in the background by `sandbox.fork_servers`.
3. one forked child per job, confined by rlimits and a seccomp filter (`jail.py`) before it runs
   the harness (`runner.py`).
Each job child talks to this supervisor over its own four pipes (requests, replies, stdout,
stderr), handed to the fork server as descriptors; the fork server only forks, kills and reports
exits. Pipes rather than a socketpair: closing a unix socket while others are in flight between
processes runs the kernel's unix-socket garbage collector, which cost ~30 us per job here.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import selectors
import time
from typing import Sequence

from hljax.generate.types import Generator
from sandbox import protocol
from sandbox.broker import Broker, Budget, CallRefused, make_call, prompts_charged
from sandbox.config import SandboxConfig, SolverConfig
from sandbox.fork_servers import ForkServer, ForkServers
from sandbox.job_run import JobRun
from sandbox.results import IsolatedScorer, Job, JobResult, Scorer
from sandbox.scoring import ScorerProcess

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20
# What one pass of the supervisor loop takes from one job's channel at most: a job that writes
# faster than the supervisor handles gets no more than this before deadlines are checked and the
# other jobs are served again. Messages read beyond it wait in the job's inbox for the next pass.
# Decoding costs up to ~0.1 us a byte (a frame of empty lists), so the byte bound is what bounds one
# job's share of a pass: ~25 ms at 256 KiB.
_MESSAGES_PER_PASS = 32
_MESSAGE_BYTES_PER_PASS = 256 << 10
_MAX_REFUSAL_CHARS = 1000  # A tool's exception may quote its (job-chosen) arguments.
# How many times a job is run again from the start because its fork server died under it through no
# fault of its own (a neighbour's, or the machine's); past that, it is an infra_error.
_MAX_RERUNS = 2


class SandboxPool:
    """Runs harness code on many jobs at once and returns one `JobResult` per job, always.

    `generator` serves the harnesses' solver calls (see `SolverConfig` for how a call maps onto it).
    A job's `tools` are run here, in the supervisor's thread, when its harness calls them.

    A fork server that dies is replaced in the background: its replacement is started at once and
    tried again with backoff until one reports ready, while the others keep serving; the pool logs one
    warning line for each start that fails. Jobs it held that had neither finished nor caused it are
    run again elsewhere (`_MAX_RERUNS`).
    """

    def __init__(self, config: SandboxConfig, generator: Generator, solver: SolverConfig = SolverConfig()):
        self.config = config
        self.solver = solver
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._broker = Broker(generator, solver, self._wake_w)
        self._next_key = 0
        self._runs: dict[int, JobRun] = {}
        self._servers = ForkServers(config, self._selector)
        self._workers = self._servers.slots  # The same list: a slot's fork server, or None while it starts.
        self._queued: collections.deque | None = None  # The running run()'s queue, for jobs run again.
        self._reruns: dict[int, int] = {}  # Job index -> times run again, in the running run().
        self._run_started = 0.0
        self._scorer = ScorerProcess(config)  # Started by the first run with an IsolatedScorer.
        self._closed = False
        try:
            self._servers.start_all()
        except BaseException:
            self.close()
            raise

    # ----- lifecycle -------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Fork servers ready to take jobs."""
        return self._servers.capacity

    def await_capacity(self, timeout_s: float) -> bool:
        """Wait until every fork server is ready (a replacement started in the background), at most
        `timeout_s`; whether they all are. run() does the same work as it goes."""
        deadline = time.monotonic() + timeout_s
        while self.capacity < self.config.workers and not self._closed:
            now = time.monotonic()
            self._servers.tend(now)
            if now >= deadline:
                break
            wait = min(deadline - now, self._servers.next_event(now), 1.0)
            self._select([], wait)
        return self.capacity == self.config.workers

    def close(self) -> None:
        """Stop the fork servers and the broker thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._servers.close()
        self._broker.close()
        self._scorer.shutdown()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def generator(self) -> Generator:
        """What serves the harnesses' solver calls."""
        return self._broker.generator

    @property
    def worker_pids(self) -> list[int]:
        """Host pids of the ready fork servers' outermost processes (bwrap or python)."""
        return [w.proc.pid for w in self._workers if w is not None and w.ready]

    # ----- running jobs ----------------------------------------------------------------------

    def run(self, jobs: Sequence[Job], scorer: Scorer | None = None) -> list[JobResult]:
        """Run every job; results in job order. `scorer` scores each "ok" result: an
        `IsolatedScorer` in the scorer process, all answers in one round trip; a callable here."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        for job in jobs:
            for name in job.tools or {}:
                if not name.isidentifier() or name == "solve":
                    raise ValueError(f"tool name {name!r} must be an identifier other than 'solve'")
        queued = collections.deque(range(len(jobs)))
        self._queued, self._reruns = queued, {}
        self._run_started = time.monotonic()
        results: list[JobResult | None] = [None] * len(jobs)
        calls = []  # Calls waiting for the broker.
        try:
            while queued or self._runs:
                self._servers.tend(time.monotonic())
                self._fill_slots(jobs, queued, results)
                handled = self._select(calls)
                for run in list(self._runs.values()):  # Messages left over from earlier passes.
                    if run.key not in handled and self._has_backlog(run):
                        self._on_messages(run, calls)
                now = time.monotonic()
                for run in list(self._runs.values()):
                    self._check_deadlines(run, now)
                self._dispatch(calls, now)
                for key in [k for k, r in self._runs.items() if r.has_exited]:
                    run = self._runs.pop(key)
                    run.worker.runs.discard(key)
                    results[run.index] = run.finish()
        except BaseException:  # A bug or KeyboardInterrupt: leave no job running behind us.
            self._queued = None  # Nothing is run again.
            for w in list(self._workers):
                if w is not None and w.runs:
                    self._replace_worker(w, "run() was interrupted")
            self._runs.clear()
            raise
        finally:
            self._queued = None
        if isinstance(scorer, IsolatedScorer):
            return self._score_isolated(results, jobs, scorer)
        return [self._score(r, jobs[i], scorer) for i, r in enumerate(results)]

    def _fill_slots(self, jobs: Sequence[Job], queued: collections.deque, results: list) -> None:
        if not self.capacity:
            # Counted from this run's start at the earliest: a replacement may have become ready between
            # runs, its READY not read yet.
            down_since = self._servers.down_since
            since = max(down_since, self._run_started) if down_since is not None else math.inf
            down_s = max(0.0, time.monotonic() - since)
            if queued and down_s > self.config.start_timeout_s:
                reason = f"no sandbox worker has been running for {down_s:.0f}s: {self._servers.last_failure}"
                while queued:
                    i = queued.popleft()
                    results[i] = JobResult(jobs[i].tag, "infra_error", None, None, reason=reason)
            return
        for i in range(len(self._workers)):
            # Re-read the slot each time: a failed spawn replaces the worker.
            while (queued and (w := self._workers[i]) is not None and w.ready
                   and len(w.runs) < self.config.slots_per_worker):  # fmt: skip
                self._spawn(w, queued.popleft(), jobs)

    def _spawn(self, worker: ForkServer, index: int, jobs: Sequence[Job]) -> None:
        key, self._next_key = self._next_key, self._next_key + 1
        to_job_r, to_job_w = os.pipe2(os.O_CLOEXEC)
        from_job_r, from_job_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours = {"to": to_job_w, "from": from_job_r, "out": out_r, "err": err_r}
        for fd in ours.values():
            os.set_blocking(fd, False)
        job = jobs[index]
        run = JobRun(key, index, job, worker, ours, Budget.of(self.solver), self.config)
        self._runs[key] = run
        worker.runs.add(key)
        for kind in ("from", "out", "err"):
            self._selector.register(ours[kind], selectors.EVENT_READ, (kind, run))
        theirs = (to_job_r, from_job_w, out_w, err_w)  # The order jail.confine expects.
        try:
            protocol.send_control(worker.control, protocol.Control(protocol.SPAWN, key), theirs)
        except OSError as e:
            self._replace_worker(worker, f"spawn request failed: {e}")  # Runs this job again.
            return
        finally:
            for fd in theirs:
                os.close(fd)
        run.send({"t": "job", "code": job.code, "question": job.question, "tools": sorted(job.tools or {})})
        self._watch_writes(run)

    def _select(self, calls: list, timeout: float | None = None) -> set[int]:
        """Handle the events of one select (waiting at most `timeout`, by default until the next thing
        due); return the keys of the runs whose messages were handled."""
        handled = set()
        for key, mask in self._selector.select(self._select_timeout(calls) if timeout is None else timeout):
            kind, obj = key.data
            # An earlier event of this batch may have closed this one's descriptor (a job's exit).
            if kind == "wake":
                self._on_wake()
            elif kind == "control":
                if self._workers[obj.index] is obj:
                    self._on_control(obj)
            elif key.fd != obj.fds[kind]:
                continue
            elif kind == "from":
                handled.add(obj.key)
                self._on_messages(obj, calls)
            elif kind == "to":
                obj.flush()
                self._watch_writes(obj)
            else:
                self._on_output(obj, kind)
        return handled

    @staticmethod
    def _has_backlog(run: JobRun) -> bool:
        return bool(run.inbox) and not run.has_exited and not run.kill_sent

    def _select_timeout(self, calls: list) -> float:
        now = time.monotonic()
        waits = [1.0, self._servers.next_event(now)]
        for run in self._runs.values():
            if self._has_backlog(run):
                return 0.0
            waits.append(run.next_event(now))
        if calls and not self._broker.busy:
            waits.append(calls[0][1] + self.solver.batch_window_s - now)
        return max(0.0, min(waits))

    def _on_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        for served in self._broker.collect():
            run = self._runs.get(served.call.key)
            if run is None or run.has_exited:
                continue  # Killed or finished while its call was served.
            if served.failure:
                run.fail_infra(f"the Generator failed: {served.failure}")
                self._kill(run)
            elif served.refused:  # The harness's own call: it gets a SolverError, like a bad argument.
                run.refuse_call(f"the Generator refused this call: {served.refused}"[:_MAX_REFUSAL_CHARS],
                                len(served.call.prompts))
            else:
                run.answer_call(served.completions)
            if run.violation and not run.kill_sent:  # It left earlier replies unread.
                self._kill(run)
            self._watch_writes(run)

    def _on_control(self, worker: ForkServer) -> None:
        while self._workers[worker.index] is worker:
            try:
                packet, _ = protocol.recv_control(worker.control)
            except BlockingIOError:
                return
            except (OSError, protocol.ProtocolError) as e:
                self._worker_lost(worker, f"bad control channel: {e}")
                return
            if packet is None:
                self._worker_lost(worker, "control channel closed")
                return
            if not worker.ready:
                if packet.kind != protocol.READY:
                    self._servers.abandon_start(worker, f"it sent {packet.kind!r} before it was ready")
                    return
                self._servers.on_ready(worker)
                continue
            run = self._runs.get(packet.job)
            if run is None or run.worker is not worker:
                continue
            if packet.kind == protocol.EXITED:
                self._end(run, packet.a, packet.b)
            elif packet.kind == protocol.SPAWN_FAILED:  # The job never ran: run it again, elsewhere if need be.
                self._end(run, None, 0)
                self._rerun(run, f"fork failed in the sandbox worker: {os.strerror(packet.a)}")

    def _worker_lost(self, worker: ForkServer, why: str) -> None:
        if worker.ready:
            self._replace_worker(worker, why)
        else:
            self._servers.abandon_start(worker, why)

    def _on_messages(self, run: JobRun, calls: list) -> None:
        """Handle at most one pass's worth of the job's messages, checking its deadline between them."""
        decoded_before = run.decode_s
        msgs = run.read_messages(_MESSAGES_PER_PASS, _MESSAGE_BYTES_PER_PASS)
        spent = run.decode_s - decoded_before  # Charged to `run`; the others' clocks stop for it.
        for other in self._runs.values():
            if other is not run:
                other.credit(spent)
        for msg in msgs:
            self._handle(run, msg, calls)
            if run.violation or run.has_exited or run.kill_sent:
                break
            self._check_deadlines(run, time.monotonic())
            if run.kill_sent:
                break
        if run.violation and not run.kill_sent:
            self._kill(run)
        if run.channel_eof and run.fds["from"] >= 0:  # Nothing more will come (EOF stays readable forever).
            self._selector.unregister(run.fds["from"])
            run.close("from")
        self._watch_writes(run)

    def _handle(self, run: JobRun, msg: dict, calls: list) -> None:
        t = msg["t"]
        if t == "result":
            run.set_result(msg)
        elif run.waiting:
            run.violate("sent a request while another was outstanding")
        elif t == "generate":
            try:
                call = make_call(run.key, msg, self.solver, run.budget)
            except CallRefused as e:
                if e.kind != "budget":  # Nothing is left to charge a budget refusal to.
                    run.charge_refused(prompts_charged(msg))
                run.send({"t": "refused", "kind": e.kind, "message": str(e)})
                return
            run.pause()
            calls.append((call, time.monotonic()))
        elif t == "tool":
            reply = self._call_tool(run, msg)
            try:
                json.dumps(reply)  # The contract: tools return JSON values.
            except (TypeError, ValueError) as e:  # The tool's fault, not the harness's.
                run.fail_infra(f"tool {msg.get('name')!r} returned a value that is not JSON: {e}")
                self._kill(run)
                return
            run.send(reply)
        else:
            run.violate(f"unknown message type {t!r}")

    def _call_tool(self, run: JobRun, msg: dict) -> dict:
        tools = run.job.tools or {}
        name, args, kwargs = msg.get("name"), msg.get("args"), msg.get("kwargs")
        if name not in tools or not isinstance(args, list) or not isinstance(kwargs, dict):
            # Never the name back: a refusal must not echo what the job sent (1 MiB names, say).
            return {"t": "refused", "kind": "invalid", "message": "no such tool, or malformed arguments"}
        if run.budget.tool_calls < 1:
            return {"t": "refused", "kind": "budget", "message": "tool call budget spent"}
        run.budget.tool_calls -= 1
        run.tool_calls += 1
        try:
            value = tools[name](*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - bad arguments from the harness land here; it sees the error.
            message = f"{name} raised {type(e).__name__}: {e}"
            return {"t": "refused", "kind": "tool", "message": message[:_MAX_REFUSAL_CHARS]}
        return {"t": "reply", "value": value}

    def _on_output(self, run: JobRun, kind: str) -> bool:
        """One read of a job's stdout or stderr; False when there is nothing more to read now."""
        try:
            data = os.read(run.fds[kind], _READ_CHUNK)
        except BlockingIOError:
            return False
        if not data:
            self._selector.unregister(run.fds[kind])
            run.close(kind)
            return False
        run.add_output(kind, data)
        return True

    def _end(self, run: JobRun, status: int | None, maxrss_kb: int) -> None:
        """The job process is gone: read what it left in its pipes, record the exit, close up."""
        for msg in run.read_messages():
            if msg["t"] == "result":
                run.set_result(msg)
        for kind in ("out", "err"):
            while run.fds[kind] >= 0 and self._on_output(run, kind):
                pass
        run.exited(status, maxrss_kb)
        self._unregister(run)

    def _unregister(self, run: JobRun) -> None:
        for kind, fd in run.fds.items():
            if fd >= 0:
                try:
                    self._selector.unregister(fd)
                except KeyError:  # "to" is registered only while replies wait to be written.
                    pass
                run.close(kind)

    def _watch_writes(self, run: JobRun) -> None:
        """Watch the "to" pipe for writability exactly while replies are waiting to go out."""
        fd = run.fds["to"]
        if fd < 0:
            return
        watched = fd in self._selector.get_map()
        if run.wants_write and not watched:
            self._selector.register(fd, selectors.EVENT_WRITE, ("to", run))
        elif not run.wants_write and watched:
            self._selector.unregister(fd)

    def _check_deadlines(self, run: JobRun, now: float) -> None:
        if run.has_exited:
            return
        if not run.kill_sent and run.over_deadline(now):
            run.time_out()
            self._kill(run)
        elif run.kill_sent and now - run.kill_sent_at > self.config.kill_grace_s and run.worker is not None:
            self._replace_worker(run.worker, f"job {run.key} did not die within {self.config.kill_grace_s}s of a kill",
                                 culprit=run)

    def _kill(self, run: JobRun) -> None:
        run.kill_sent_at = time.monotonic()
        try:
            protocol.send_control(run.worker.control, protocol.Control(protocol.KILL, run.key))
        except OSError as e:
            self._replace_worker(run.worker, f"kill request failed: {e}", culprit=run)

    def _dispatch(self, calls: list, now: float) -> None:
        """Send waiting calls to the broker when it is idle and the batch is worth sending."""
        if not calls or self._broker.busy:
            return
        live = [(c, t) for c, t in calls if c.key in self._runs and not self._runs[c.key].has_exited]
        if not live:
            calls.clear()
            return
        everyone_waits = all(r.waiting or r.has_exited for r in self._runs.values())
        if everyone_waits or now - live[0][1] >= self.solver.batch_window_s:
            self._broker.submit([c for c, _ in live])
            calls.clear()

    def _replace_worker(self, worker: ForkServer, why: str, culprit: JobRun | None = None) -> None:
        """Kill a fork server and start its replacement in the background. Of the jobs it held, those
        that finished keep their results, those being killed (`culprit`, the one that would not die,
        among them) keep the fault they were killed for, and the others, innocent, run again (`_rerun`)."""
        if self._workers[worker.index] is not worker:
            return
        reason = f"sandbox worker died ({why})"
        self._selector.unregister(worker.control)
        worker.kill()
        tail = worker.log_tail()
        if tail:
            reason += f"; its log: {tail[-500:]}"
        log.error("%s; replacing it", reason)
        for key in list(worker.runs):
            run = self._runs[key]
            self._end(run, None, 0)  # Reads what it left: a result sent before the server died counts.
            # A killed job (the culprit is one) was killed for its own fault, which it keeps: a timeout,
            # a protocol violation, or a tool's or the Generator's failure.
            if not (run.kill_sent or run.result is not None):
                self._rerun(run, reason)
        worker.runs.clear()
        self._servers.retire(worker)
        if not self._closed:
            self._servers.begin_start(worker.index)

    def _rerun(self, run: JobRun, reason: str) -> None:
        """A job lost through no fault of its own: queue it again from the start, at most `_MAX_RERUNS`
        times; after that (or outside run()), it is an infra_error with `reason`."""
        reruns = self._reruns.get(run.index, 0)
        if self._queued is None or reruns >= _MAX_RERUNS:
            run.fail_infra(reason if reruns == 0 else f"{reason} (run {reruns + 1} times, lost each time)")
            return
        self._reruns[run.index] = reruns + 1
        self._runs.pop(run.key)
        run.worker.runs.discard(run.key)
        self._queued.appendleft(run.index)
        log.info("sandbox: job %r runs again (%s)", run.job.tag, reason[:200])

    @property
    def scorer_pid(self) -> int | None:
        """Host pid of the scorer process's outermost process, None until it is started."""
        return self._scorer.pid

    def _score_isolated(self, results: list[JobResult], jobs: Sequence[Job], scorer: IsolatedScorer) -> list[JobResult]:
        payload_index: dict[str, int] = {}
        payloads, items, where = [], [], []
        for i, r in enumerate(results):
            if r.status != "ok":
                continue
            tag = jobs[i].tag
            if tag not in payload_index:
                payload_index[tag] = len(payloads)
                payloads.append(scorer.payloads[tag])
            items.append((payload_index[tag], r.answer))
            where.append(i)
        out = list(results)
        for i, scored in zip(where, self._scorer.score(scorer.spec, payloads, items)):
            if scored.failure:  # The scorer process failed, not the answer: never a reward.
                out[i] = dataclasses.replace(results[i], status="infra_error", reason=scored.failure)
            else:
                out[i] = dataclasses.replace(results[i], score=0.0 if scored.error else scored.value,
                                             scorer_error=scored.error)  # fmt: skip
        return out

    @staticmethod
    def _score(result: JobResult, job: Job, scorer: Scorer | None) -> JobResult:
        if scorer is None or result.status != "ok":
            return result
        try:
            score = float(scorer(result.answer, job))
            if not math.isfinite(score):
                raise ValueError(f"score {score} is not finite")
        except Exception as e:  # noqa: BLE001 - untrusted answers make scorers raise; that scores 0.
            return dataclasses.replace(result, score=0.0, scorer_error=f"{type(e).__name__}: {e}")
        return dataclasses.replace(result, score=score)
