"""XLA options a run needs before its backend starts (XLA reads XLA_FLAGS once, when the first device
is made), chosen from the config.

On CPU, XLA's default concurrency-optimised scheduler runs each layer's rematerialised forward as early
as its inputs allow, i.e. all of them before the backward pass starts, so `model.remat` saves nothing
(Qwen3-0.6B's GRPO loss + gradient, one prompt of 1,664 tokens shared by 2 rows of 128, fp32: 22.3 GB
of temporaries with remat, 22.8 GB without). Its memory-minimising scheduler keeps the recomputes in
the backward's order: 1.7 GB (docs/benchmarks.md, issue 39). The flag is CPU-only; other backends
ignore it.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

MEMORY_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
_SCHEDULER_FLAG = MEMORY_SCHEDULER.split("=")[0]


def _backend_started() -> bool:
    from jax._src import xla_bridge  # No public query; this one creates nothing.

    return xla_bridge.backends_are_initialized()


def for_remat(remat: bool) -> bool:
    """With `remat`, add the CPU memory-minimising scheduler to XLA_FLAGS. -> whether it was added.
    A scheduler flag the user set already is left as it is; raises if a JAX backend already exists,
    since the flag would then be ignored without a word."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not remat or _SCHEDULER_FLAG in flags:
        return False
    if _backend_started():
        raise RuntimeError("model.remat needs XLA's CPU memory-minimising scheduler, which XLA reads only "
                           "before the first JAX device exists; call xla_options.for_remat first")
    os.environ["XLA_FLAGS"] = f"{flags} {MEMORY_SCHEDULER}".strip()
    log.info("model.remat: XLA's CPU memory-minimising scheduler on (%s)", MEMORY_SCHEDULER)
    return True


def warn_if_remat_saves_nothing(remat: bool) -> None:
    """For a trainer started without launch.train (its backend already up): one warning when `remat`
    runs on CPU under the default scheduler, where it costs compute and saves no memory."""
    import jax

    if remat and jax.default_backend() == "cpu" and _SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
        log.warning("model.remat on CPU saves no memory under XLA's default scheduler; set XLA_FLAGS=%s before "
                    "JAX starts (launch.train does)", MEMORY_SCHEDULER)
