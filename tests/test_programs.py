"""The engine's ahead-of-time programs: one compile per signature, no trace kept."""

import gc
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from hljax import sharding as shd
from hljax.generate.programs import Program


def test_a_program_compiles_once_per_signature_and_keeps_no_trace():
    traces = []

    def scale(n, x):
        traces.append(x.shape)
        return x * n

    program = Program(scale, static_argnums=(0,))
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(program(2, x), [0.0, 2.0, 4.0])
    program(2, x + 1)
    assert len(traces) == 1 and program.cache_size() == 1
    np.testing.assert_array_equal(program(3, x), [0.0, 3.0, 6.0])  # A new static value,
    program(2, jnp.ones(4))  # a new shape: compiled anew.
    assert len(traces) == 3 and program.cache_size() == 3
    # What jit traced from is gone (with it, jit's trace cache entries): no function or jitted
    # function wrapping `scale` is left.
    gc.collect()
    assert not [o for o in gc.get_objects() if (type(o) is types.FunctionType or type(o).__name__ == "PjitFunction")
                and getattr(o, "__wrapped__", None) is scale]


def test_equivalent_shardings_share_a_program():
    """On a mesh of size-1 axes P() and P('tensor') place an array alike: one executable serves both."""
    mesh = shd.single_device_mesh()
    program = Program(lambda x: x + 1, static_argnums=())
    x = jnp.arange(4.0)
    a = jax.device_put(x, NamedSharding(mesh, P()))
    b = jax.device_put(x, NamedSharding(mesh, P("tensor")))
    np.testing.assert_array_equal(program(a), program(b))
    assert program.cache_size() == 1
