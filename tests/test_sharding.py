"""The same model on 1 device and on 8 forced CPU devices under two meshes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.mesh import MeshConfig
from tests import tiny

MESHES = {
    "fsdp4-tensor2": MeshConfig(data=1, fsdp=4, tensor=2),
    "data2-fsdp2-tensor2": MeshConfig(data=2, fsdp=2, tensor=2),
}


@pytest.fixture(scope="module")
def reference(tiny_untied):
    tokens, mask, positions = tiny.left_padded_batch(160, [11, 3, 7, 16, 1, 9, 5, 12])
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_untied, mesh)
    with shd.use_mesh(mesh):
        logits = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    return (tokens, mask, positions), logits


@pytest.mark.parametrize("name", list(MESHES))
def test_sharded_logits_equal_single_device(name, tiny_untied, reference):
    assert jax.device_count() == 8, "conftest forces 8 CPU devices"
    (tokens, mask, positions), want = reference
    mesh = shd.make_mesh(MESHES[name])
    model = hf.load_hf(tiny_untied, mesh)

    fsdp = "fsdp"
    attn, mlp = model.layers[0].attn, model.layers[0].mlp
    assert attn.q_proj[...].sharding.spec == P(fsdp, "tensor", None)
    assert attn.k_proj[...].sharding.spec == P(fsdp, "tensor", None)
    assert attn.v_proj[...].sharding.spec == P(fsdp, "tensor", None)
    assert attn.o_proj[...].sharding.spec == P("tensor", None, fsdp)
    assert mlp.gate_proj[...].sharding.spec == P(fsdp, "tensor")
    assert mlp.down_proj[...].sharding.spec == P("tensor", fsdp)
    assert model.embed[...].sharding.spec == P("tensor", fsdp)
    assert model.lm_head[...].sharding.spec == P(fsdp, "tensor")
    # Really split: each device holds 1/(fsdp*tensor) of the embedding.
    shard = model.embed[...].addressable_shards[0].data
    assert shard.size * MESHES[name].fsdp * MESHES[name].tensor == model.embed[...].size

    with shd.use_mesh(mesh):
        batch = jax.device_put(jnp.asarray(tokens), jax.sharding.NamedSharding(mesh, P(("data", "fsdp"))))
        forward = nnx.jit(lambda m, t, p, a: m(t, p, a))
        got = forward(model, batch, jnp.asarray(positions), jnp.asarray(mask))
    cfg = MESHES[name]
    # Activations stay sharded: batch over data x fsdp, vocab over tensor.
    assert got.sharding.shard_shape(got.shape) == (8 // (cfg.data * cfg.fsdp), got.shape[1], 160 // cfg.tensor)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_every_parameter_resolves_to_mesh_axes(tiny_untied):
    model = hf.load_hf(tiny_untied, shd.make_mesh(MESHES["fsdp4-tensor2"]))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = var.get_metadata()["out_sharding"]
        assert len(names) == var.shape.__len__(), path
        for axes in shd.logical_to_spec(names):
            for a in (axes,) if isinstance(axes, str) else axes or ():
                assert a in shd.MESH_AXES, (path, a)


def test_unknown_logical_name_and_bad_meshes_are_errors():
    with pytest.raises(KeyError, match="'embedd' has no rule"):
        shd.logical_to_spec(("embedd",))
    with pytest.raises(ValueError, match="needs 6 devices, have 8"):
        MeshConfig(data=1, fsdp=3, tensor=2).shape(8)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        MeshConfig(data=-1, fsdp=-1, tensor=1).shape(8)
    assert MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == (2, 2, 2)
    mesh = shd.make_mesh(MeshConfig(1, 1, 8))
    with pytest.raises(ValueError, match="dimension 2 of shape .* not divisible by mesh axes tensor of size 8"):
        shd.named_sharding(mesh, (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), (64, 2, 24))
