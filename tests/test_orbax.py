"""Train-state checkpoints: exact round trip, keep-N, restore onto another mesh, the model alone."""

import os

import jax
import numpy as np
import optax
from flax import nnx

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.checkpoint.orbax import TrainCheckpointer
from hljax.mesh import MeshConfig


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.to_pure_dict(nnx.state(tree)))]


def test_round_trip_keep_n_and_other_mesh(tiny_tied, tmp_path):
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_tied, mesh)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        grads = jax.tree.map(lambda p: p * 0 + 1.0, nnx.state(model, nnx.Param))
        opt.update(model, grads)  # Non-trivial Adam moments and step count.
    ckpt = TrainCheckpointer(str(tmp_path / "ckpt"), keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, model, opt, {"step": step, "cursor": {"epoch": 0, "index": step * 4}})
    ckpt.wait()
    assert ckpt.latest_step() == 3 and ckpt.all_steps() == [2, 3]

    mesh8 = shd.make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    fresh = hf.load_hf(tiny_tied, mesh8)
    with shd.use_mesh(mesh8):
        fresh_opt = nnx.Optimizer(fresh, optax.adam(1e-2), wrt=nnx.Param)
    meta = TrainCheckpointer(str(tmp_path / "ckpt")).restore(fresh, fresh_opt)
    assert meta == {"step": 3, "cursor": {"epoch": 0, "index": 12}}
    for a, b in zip(_leaves(model), _leaves(fresh)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_leaves(opt), _leaves(fresh_opt)):
        np.testing.assert_array_equal(a, b)
    assert fresh.layers[0].attn.q_proj[...].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert int(fresh_opt.step[...]) == 1
    ckpt.close()


def test_no_checkpoint_restores_nothing(tiny_tied, tmp_path):
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_tied, mesh)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    assert TrainCheckpointer(str(tmp_path / "empty")).restore(model, opt) is None


def test_the_model_restores_alone(tiny_tied, tmp_path):
    """An export reads the weights without building the optimiser their state was saved with."""
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_tied, mesh)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        opt.update(model, jax.tree.map(lambda p: p * 0 + 1.0, nnx.state(model, nnx.Param)))
    ckpt = TrainCheckpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(7, model, opt, {"step": 7, "stage": "grpo", "seed": 0})
    ckpt.close()
    assert {"model", "optimizer", "meta"} <= set(os.listdir(tmp_path / "ckpt" / "7"))

    fresh = hf.load_hf(tiny_tied, mesh)
    meta = TrainCheckpointer(str(tmp_path / "ckpt")).restore_model(fresh)
    assert meta == {"step": 7, "stage": "grpo", "seed": 0}
    for a, b in zip(_leaves(model), _leaves(fresh)):
        np.testing.assert_array_equal(a, b)
    assert TrainCheckpointer(str(tmp_path / "empty")).restore_model(fresh) is None
