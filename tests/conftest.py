"""Shared fixtures. 8 forced CPU devices so sharding tests run anywhere; single-device tests use a 1x1x1 mesh."""

import atexit
import os
import shutil
import tempfile

# Must precede the first jax import anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One XLA compilation cache per test session, inherited by the subprocesses the end-to-end tests start
# (they compile the same tiny programs again and again). Fresh each session: nothing carries between runs.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="hljax-test-xla-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)

import pytest  # noqa: E402

from tests import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_h32(tmp_path_factory):
    """A tiny random Qwen3 whose head_dim (32) the CPU attention kernel takes (24 is not a lane multiple)."""
    return tiny.save_hf_qwen3(tmp_path_factory.mktemp("qwen3_h32"), head_dim=32)


@pytest.fixture(scope="session")
def tiny_untied(tmp_path_factory):
    """A tiny random Qwen3 with untied head, head_dim != hidden/heads and yarn RoPE, saved to disk."""
    return tiny.save_hf_qwen3(tmp_path_factory.mktemp("untied"), tie=False, rope="yarn")


@pytest.fixture(scope="session")
def tiny_tied(tmp_path_factory):
    """A tiny random Qwen3 with tied embeddings and default RoPE."""
    return tiny.save_hf_qwen3(tmp_path_factory.mktemp("tied"), tie=True, rope="default")
