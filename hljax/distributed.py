"""JAX's multi-controller runtime for hljax: start it once, then shard every batch by process.

One identical command runs on every host (TPU pod worker, SLURM task, or a process started by hand);
`initialize` joins them into one JAX job whose global mesh spans all their devices. After that:
- each process builds only its own rows of a batch and `global_array` assembles the global array
  (`jax.make_array_from_process_local_data`); `local_rows` says which rows those are, from the
  sharding itself, so the split always matches the device layout;
- small per-row host values (rewards, lengths) travel with `allgather`;
- files that exist once (metrics, plots, exports) are written by `is_main()`.
Single process (the default) is the same code with process_count() == 1.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from hljax import sharding as shd
from hljax.mesh import MeshConfig

log = logging.getLogger(__name__)

# Standard variables, read when the matching DistributedSpec field is unset. JAX itself reads only
# JAX_COORDINATOR_ADDRESS; the other two are the common convention (and what docs/scaling.md uses).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class DistributedError(RuntimeError):
    pass


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve(spec) -> dict:
    """The keyword arguments for jax.distributed.initialize: config fields first, then the
    environment; what is left unset JAX auto-detects (TPU pods, SLURM, Open MPI)."""
    kw = {}
    coordinator = spec.coordinator or os.environ.get(ENV_COORDINATOR, "").strip()
    num = spec.num_processes if spec.num_processes > 0 else _env_int(ENV_NUM_PROCESSES)
    pid = spec.process_id if spec.process_id >= 0 else _env_int(ENV_PROCESS_ID)
    if coordinator:
        kw["coordinator_address"] = coordinator
    if num is not None:
        kw["num_processes"] = num
    if pid is not None:
        kw["process_id"] = pid
    if num is not None and pid is not None and not 0 <= pid < num:
        raise DistributedError(f"process_id={pid} is not in [0, num_processes={num})")
    given = {k for k in ("coordinator_address", "num_processes", "process_id") if k in kw}
    if given and given != {"coordinator_address", "num_processes", "process_id"} and not _cluster_detected():
        missing = sorted({"coordinator_address", "num_processes", "process_id"} - given)
        raise DistributedError(
            f"distributed: got {sorted(given)} but not {missing}, and no TPU pod / SLURM / MPI environment to "
            f"detect them from; set distributed.coordinator, distributed.num_processes and distributed.process_id "
            f"(or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})")
    kw["initialization_timeout"] = spec.init_timeout_s
    kw["heartbeat_timeout_seconds"] = spec.heartbeat_timeout_s
    kw["shutdown_timeout_seconds"] = spec.shutdown_timeout_s
    return kw


def _cluster_detected() -> bool:
    from jax._src import clusters  # JAX's own detectors: the same ones initialize() consults.

    return any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types
               if not getattr(env, "opt_in_only_method", False))


def wanted(spec) -> bool:
    """Multi-process when the config asks for it, or the standard variables name a job."""
    return bool(spec.initialize or spec.coordinator or spec.num_processes > 0
                or os.environ.get(ENV_COORDINATOR) or os.environ.get(ENV_NUM_PROCESSES))


def initialize(spec) -> bool:
    """Join the multi-process JAX job `spec` describes (a `DistributedSpec`); -> True if this is a
    multi-process run. Idempotent: a second call with the job already up checks and returns.

    Must run before anything touches a JAX device (the backend is created with the job's devices).
    On CPU the cross-process collectives use gloo. A peer that stops sending heartbeats for
    `spec.heartbeat_timeout_s` makes the others fail with an error instead of waiting forever.
    """
    if jax.distributed.is_initialized():
        num = spec.num_processes if spec.num_processes > 0 else _env_int(ENV_NUM_PROCESSES)
        if num is not None and num != jax.process_count():
            raise DistributedError(f"JAX distributed is already up with {jax.process_count()} processes, "
                                   f"but the config asks for {num}")
        return jax.process_count() > 1
    if not wanted(spec):
        return False
    kw = resolve(spec)
    # Cross-process CPU collectives (the CPU backend exists on every host, also beside GPUs/TPUs).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = f"{kw.get('coordinator_address', 'auto-detected coordinator')}"
    log.info("joining JAX job at %s as process %s of %s", where, kw.get("process_id", "?"),
             kw.get("num_processes", "?"))
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # noqa: BLE001 - re-raised with what we tried, whatever JAX raised.
        if "must be called before" in str(e):
            raise DistributedError(
                f"process {kw.get('process_id', '?')}: the JAX backend was created before "
                "hljax.distributed.initialize; call it first, before importing modules that run JAX at import "
                "time (bm25s does, via hljax.tasks.retrieval; launch/train.py imports the trainer after it)") from e
        raise DistributedError(
            f"jax.distributed.initialize failed (process_id={kw.get('process_id', 'auto')}, "
            f"num_processes={kw.get('num_processes', 'auto')}, coordinator={where}): {type(e).__name__}: {e}. "
            "It must run before any JAX computation, every process must reach the coordinator, and "
            f"all must start within distributed.init_timeout_s={spec.init_timeout_s}s") from e
    log.info("process %d of %d: %d local / %d global devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return jax.process_count() > 1


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main() -> bool:
    """True on the one process that writes run-level files (metrics, plots, exports, logs)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all arrive (no-op for one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def allgather(x) -> np.ndarray:
    """[n, ...] host values of every process, stacked by process -> [P, n, ...] (n equal everywhere)."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    return np.asarray(multihost_utils.process_allgather(x))


def gather_rows(rows: np.ndarray, local: np.ndarray, total: int) -> np.ndarray:
    """Every process's rows `local` ([n, ...], at positions `rows` of a [total] batch) -> the whole
    [total, ...] batch, on every process. For small per-row host values (rewards, statistics)."""
    out = np.full((total, *np.shape(local)[1:]), np.nan)
    positions = allgather(np.asarray(rows)).reshape(-1)
    values = allgather(local).reshape(len(positions), *np.shape(local)[1:])
    out[positions] = values
    if np.bincount(positions, minlength=total).tolist() != [1] * total:
        raise DistributedError(f"processes' rows do not cover the {total}-row batch exactly once: {sorted(positions)}")
    return out


# ----- batch sharding by process -----


def local_rows(sharding: jax.sharding.Sharding, global_shape: Sequence[int], axis: int) -> np.ndarray:
    """Global indices along `axis` that this process's devices hold, in order: the rows this
    process must supply. They must form one contiguous block (what make_array_from_process_local_data
    expects) owned by this process alone, so that rollouts are generated exactly once."""
    index_map = sharding.devices_indices_map(tuple(global_shape))
    spans: dict[int, set] = {}
    for device, idx in index_map.items():
        rows = range(*idx[axis].indices(global_shape[axis]))
        spans.setdefault(device.process_index, set()).add((rows.start, rows.stop))
    blocks = {p: (min(a for a, _ in s), max(b for _, b in s)) for p, s in spans.items()}
    mine = blocks[jax.process_index()]
    covered = sorted({r for a, b in spans[jax.process_index()] for r in range(a, b)})
    if covered != list(range(*mine)):
        raise DistributedError(f"process {jax.process_index()} holds rows {covered} of axis {axis}: not one block")
    for p, block in blocks.items():
        if p != jax.process_index() and max(block[0], mine[0]) < min(block[1], mine[1]):
            raise DistributedError(
                f"processes {jax.process_index()} and {p} both hold rows {block} / {mine} of the batch axis: the "
                "mesh places a non-batch axis (tensor) across hosts; keep mesh.tensor within one host")
    return np.arange(*mine)


def global_array(local: np.ndarray, sharding: jax.sharding.Sharding, global_shape: Sequence[int]) -> jax.Array:
    """This process's block of a global array -> the global array (single process: a device_put)."""
    return jax.make_array_from_process_local_data(sharding, np.asarray(local), tuple(global_shape))


def local_part(x: jax.Array, rows: np.ndarray, axis: int = 0) -> np.ndarray:
    """Rows `rows` (one contiguous block, e.g. from `local_rows`) of global array `x` along `axis`,
    read from this process's shards (whatever sharding the computation gave `x`)."""
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if x.is_fully_addressable:
        return np.asarray(x).take(np.arange(lo, hi), axis=axis)
    shape = list(x.shape)
    shape[axis] = hi - lo
    out = np.empty(shape, x.dtype)
    filled = np.zeros(hi - lo, bool)
    for s in x.addressable_shards:
        r = range(*s.index[axis].indices(x.shape[axis]))
        a, b = max(lo, r.start), min(hi, r.stop)
        if a >= b:
            continue
        piece = np.asarray(s.data).take(np.arange(a - r.start, b - r.start), axis=axis)
        index = [slice(None)] * x.ndim
        index[axis] = slice(a - lo, b - lo)
        # Other axes: a shard may hold only part of them; place it where its index says.
        for d in range(x.ndim):
            if d != axis:
                index[d] = s.index[d]
        out[tuple(index)] = piece
        filled[a - lo : b - lo] = True
    if not filled.all():
        raise DistributedError(f"process {jax.process_index()} does not hold rows {lo}..{hi - 1} of an array "
                               f"sharded {x.sharding}")
    return out


# ----- a process-local copy of a global model -----


def local_copy(model, mesh: jax.sharding.Mesh):
    """The model's parameters gathered from all processes and placed on `mesh` (this process's
    devices), for work one process does alone (its rollout engine, an export). Collective: every
    process must call it at the same point. Single process and a model already on `mesh`: returned as is."""
    graphdef, state = nnx.split(model)
    leaves = jax.tree.leaves(state)
    if all(x.is_fully_addressable for x in leaves if isinstance(x, jax.Array)) and jax.process_count() == 1:
        return model
    shardings = shd.param_shardings(state, mesh)

    def place(var, sharding_var):
        value = var.get_value()
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            value = multihost_utils.process_allgather(value, tiled=True)
        return var.replace(jax.device_put(np.asarray(value), sharding_var.get_value()))

    placed = jax.tree.map(place, state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, placed)


def local_mesh(mesh_cfg: MeshConfig) -> jax.sharding.Mesh:
    """A mesh over this process's devices only, keeping the configured tensor parallelism, for the
    engines each process runs for itself (embedded proposer server, embedded solver)."""
    return shd.make_mesh(MeshConfig(1, -1, mesh_cfg.tensor), jax.local_devices())
