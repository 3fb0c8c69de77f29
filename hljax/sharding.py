"""Device mesh, logical axis names and the rules that map them onto mesh axes.

Every parameter is created with logical names (`EMBED`, `MLP`, ...); every large activation is
constrained with logical names (`ACT_BATCH`, ...). `LOGICAL_RULES` is the one table that turns them
into mesh axes, so a new parallelism strategy is a new table, not an edit to the layers.
The same code runs on 1 device and on N: a 1x1x1 mesh makes every rule trivially satisfied.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hljax.mesh import MeshConfig

# Mesh axes.
DATA = "data"  # Pure data parallelism: parameters replicated.
FSDP = "fsdp"  # Data parallelism with parameters and optimizer state sharded (ZeRO-3 style).
TENSOR = "tensor"  # Megatron-style tensor parallelism inside each layer.
MESH_AXES = (DATA, FSDP, TENSOR)

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
NORM = "norm"

# Activation axes.
ACT_BATCH = "activation_batch"
ACT_LENGTH = "activation_length"
ACT_EMBED = "activation_embed"
ACT_HEADS = "activation_heads"
ACT_KV_HEADS = "activation_kv_heads"
ACT_HEAD_DIM = "activation_head_dim"
ACT_MLP = "activation_mlp"
ACT_VOCAB = "activation_vocab"

MeshAxes = str | tuple[str, ...] | None

# One entry per logical name: NNX resolves rules with a dict, so a duplicate would silently win.
LOGICAL_RULES: tuple[tuple[str, MeshAxes], ...] = (
    (VOCAB, TENSOR),
    (EMBED, FSDP),
    (HEADS, TENSOR),
    (KV_HEADS, TENSOR),
    (HEAD_DIM, None),
    (MLP, TENSOR),
    (NORM, None),
    (ACT_BATCH, (DATA, FSDP)),
    (ACT_LENGTH, None),
    (ACT_EMBED, None),
    (ACT_HEADS, TENSOR),
    (ACT_KV_HEADS, TENSOR),
    (ACT_HEAD_DIM, None),
    (ACT_MLP, TENSOR),
    (ACT_VOCAB, TENSOR),
)


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = config.shape(len(devices))
    # Auto axes: GSPMD propagates shardings from parameters and our constraints.
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def single_device_mesh() -> Mesh:
    return make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Sequence[tuple[str, MeshAxes]] = LOGICAL_RULES) -> Iterator[Mesh]:
    """Context in which models are built and run: the mesh plus the logical rules."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules)):
        yield mesh


def logical_to_spec(names: Sequence[str | None], rules: Sequence[tuple[str, MeshAxes]] = LOGICAL_RULES) -> P:
    """Logical names -> PartitionSpec; an unknown name is an error (NNX would pass it through)."""
    table = dict(rules)
    if len(table) != len(rules):
        raise ValueError("logical axis rules name an axis twice")
    out = []
    for name in names:
        if name is None:
            out.append(None)
        elif name in table:
            out.append(table[name])
        else:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
    return P(*out)


def named_sharding(mesh: Mesh, names: Sequence[str | None], shape: Sequence[int] | None = None) -> NamedSharding:
    """NamedSharding for logical `names`, checking divisibility when `shape` is given."""
    spec = logical_to_spec(names)
    if shape is not None:
        for dim, axes in zip(shape, spec):
            size = axes_size(mesh, axes)
            if dim % size:
                raise ValueError(
                    f"dimension {dim} of shape {tuple(shape)} (logical {tuple(names)}) is not divisible by "
                    f"mesh axes {axes} of size {size}"
                )
    return NamedSharding(mesh, spec)


def axes_size(mesh: Mesh, axes: MeshAxes) -> int:
    """Devices along `axes` (a mesh axis name, a tuple of them, or None)."""
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return int(np.prod([mesh.shape[a] for a in axes]))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrain an activation's sharding by logical names under the ambient mesh.

    Outside any mesh context there is nothing to constrain against, so `x` is returned as is. A
    dimension that its mesh axes do not divide (batch 1 in decode, say) stays replicated.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = [axes if dim % axes_size(mesh, axes) == 0 else None for dim, axes in zip(x.shape, logical_to_spec(names))]
    return jax.lax.with_sharding_constraint(x, P(*spec))


def param_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """NamedSharding for every variable of an (abstract) NNX state, from its logical names."""

    def one(var):
        names = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        return var.replace(named_sharding(mesh, names, var.shape))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
