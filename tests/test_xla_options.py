"""model.remat must save memory on CPU: launch.train's XLA options make XLA keep the recomputes in the
backward's order (hljax/xla_options.py). Measured with XLA's own buffer assignment of the compiled
gradient, in a fresh process (XLA reads its flags once)."""

import json
import os
import subprocess
import sys

import pytest

from hljax import xla_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Temporaries of the gradient of a 4-layer model's hidden states over one 1,024-token row, with and
# without remat; `apply` says whether the process first calls xla_options.for_remat(True).
PROBE = r"""
import dataclasses, json, sys
from hljax import xla_options
if sys.argv[1] == "1":
    xla_options.for_remat(True)
import jax, jax.numpy as jnp
from flax import nnx
from hljax import sharding as shd
from hljax.models.config import ModelConfig
from hljax.models.qwen3 import Qwen3

temps = {}
for remat in (False, True):
    cfg = ModelConfig.tiny(512, num_layers=4, remat=remat)
    with shd.use_mesh(shd.make_mesh()):
        graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    tokens = jax.ShapeDtypeStruct((1, 1024), jnp.int32)

    def loss(p, t):
        model = nnx.merge(graphdef, p)
        positions = jnp.arange(t.shape[1])[None]
        return model.hidden_states(t, positions, jnp.ones_like(t)).sum()

    compiled = jax.jit(jax.grad(loss)).lower(params, tokens).compile()
    temps[str(remat)] = compiled.memory_analysis().temp_size_in_bytes
print(json.dumps(temps))
"""


def _temps(apply: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if apply else "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_remat_saves_memory_with_the_options_launch_train_sets():
    temps = _temps(apply=True)
    # Without remat every layer's attention scores stay for the backward; with it, one layer's at a time.
    assert temps["True"] < 0.5 * temps["False"], temps


def test_for_remat_leaves_flags_alone_without_remat_or_when_the_user_chose(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert not xla_options.for_remat(False)
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=true")
    assert not xla_options.for_remat(True)
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=true"


def test_for_remat_refuses_once_a_backend_exists(monkeypatch):
    import jax

    jax.devices()  # This test process has a backend now, as a library caller's would.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with pytest.raises(RuntimeError, match="before the first JAX device"):
        xla_options.for_remat(True)
    assert "XLA_FLAGS" not in os.environ


def test_a_trainer_without_the_options_is_told_remat_saves_nothing(monkeypatch, caplog):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with caplog.at_level("WARNING", logger="hljax.xla_options"):
        xla_options.warn_if_remat_saves_nothing(True)
    assert "saves no memory" in caplog.text
    caplog.clear()
    monkeypatch.setenv("XLA_FLAGS", xla_options.MEMORY_SCHEDULER)
    with caplog.at_level("WARNING", logger="hljax.xla_options"):
        xla_options.warn_if_remat_saves_nothing(True)
        xla_options.warn_if_remat_saves_nothing(False)
    assert caplog.text == ""
