"""The JAX engine and server on Qwen3.5 against transformers, and sharded against one device."""

import json
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Request
from hljax.generate.local import LocalGenerator
from hljax.generate.server import Server
from hljax.generate.types import SamplingParams
from hljax.mesh import MeshConfig
from tests import tiny
from tests import tiny_qwen3_5 as tq
from tests.test_generate import _hf_logprobs

# Prompt widths cross the 16-token bucket and the chunk size below (so chunks are split unevenly).
LENGTHS = [5, 17, 9, 1, 30]
CHUNK = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tq.save(tmp_path_factory.mktemp("q35gen"), vision=True)
    ref = tq.causal_lm(path)
    mesh = shd.single_device_mesh()
    engine = Engine(hf.load_hf(path, mesh, linear_chunk_size=CHUNK), mesh, EngineConfig(max_batch=8, max_seq_len=128))
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(3, 160, n).tolist()) for n in LENGTHS]
    return path, ref, engine, prompts


def _hf_greedy(ref, prompt, n):
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_matches_transformers_in_a_left_padded_batch(setup):
    _, ref, engine, prompts = setup
    sp = SamplingParams(max_new_tokens=20, temperature=0.0)
    for p, o in zip(prompts, engine.generate([Request(p, sp) for p in prompts])):
        want = _hf_greedy(ref, p, 20)
        if 2 in want:  # The model's EOS stops us but not transformers (eos_token_id=None).
            want = want[: want.index(2) + 1]
        assert o.token_ids == want


def test_sampled_logprobs_equal_teacher_forced_transformers(setup):
    _, ref, engine, prompts = setup
    sp = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, seed=5)
    for p, o in zip(prompts, engine.generate([Request(p, sp) for p in prompts])):
        assert len(o.token_ids) > 0
        np.testing.assert_allclose(o.logprobs, _hf_logprobs(ref, p, o.token_ids, 0.8), atol=1e-4)


@pytest.mark.slow
def test_eight_device_mesh_equals_one_device(setup):
    path, _, engine, prompts = setup
    tokens, mask, positions = tiny.left_padded_batch(160, [37, 5, 20, 1, 9, 14, 2, 30])
    args = (jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    forward = nnx.jit(lambda m, *a: m(*a))
    one = hf.load_hf(path, shd.single_device_mesh(), linear_chunk_size=CHUNK)
    with shd.use_mesh(shd.single_device_mesh()):
        want = np.asarray(forward(one, *args))
    mesh = shd.make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    model = hf.load_hf(path, mesh, linear_chunk_size=CHUNK)
    with shd.use_mesh(mesh):
        batch = jax.device_put(args[0], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"))))
        got = forward(model, batch, *args[1:])
    assert len(got.sharding.device_set) == 8
    # Sharded contractions sum in another order: 1.5e-5 measured on logits of size ~2.5.
    np.testing.assert_allclose(np.asarray(got), want, atol=5e-5, rtol=0)

    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    sharded = Engine(model, mesh, EngineConfig(max_batch=8, max_seq_len=128))
    assert [o.token_ids for o in sharded.generate([Request(p, sp) for p in prompts])] == \
        [o.token_ids for o in engine.generate([Request(p, sp) for p in prompts])]


@pytest.mark.slow
def test_server_generates_and_reloads_weights(setup):
    path, _, engine, prompts = setup
    gen = LocalGenerator.from_pretrained(path, shd.single_device_mesh(), EngineConfig(max_seq_len=64))
    with Server(gen, path) as server:
        body = {"input_ids": list(prompts[1]), "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        req = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
        want = engine.generate([Request(prompts[1], SamplingParams(max_new_tokens=8, temperature=0.0))])[0]
        assert out["output_ids"] == want.token_ids
        gen.update_weights_from_disk(path, "1")  # Same architecture: accepted.
        assert gen.weight_version == "1"
