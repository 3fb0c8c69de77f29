"""Shared fixtures. 8 forced CPU devices so sharding tests run anywhere; single-device tests use a 1x1x1 mesh."""

import os

# Must precede the first jax import anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_untied(tmp_path_factory):
    """A tiny random Qwen3 with untied head, head_dim != hidden/heads and yarn RoPE, saved to disk."""
    return tiny.save_hf_qwen3(tmp_path_factory.mktemp("untied"), tie=False, rope="yarn")


@pytest.fixture(scope="session")
def tiny_tied(tmp_path_factory):
    """A tiny random Qwen3 with tied embeddings and default RoPE."""
    return tiny.save_hf_qwen3(tmp_path_factory.mktemp("tied"), tie=True, rope="default")
