"""Opening the generators a run talks to: the proposer behind the SGLang API, and the frozen solver.

`embedded_server` starts our JAX engine behind the SGLang HTTP API in this process and returns the
SGLang client pointed at it, so the code path is the one used against a real SGLang server.
`embedded` is the in-process engine without HTTP (the solver's default). `sglang` connects to a
running server; its tokenizer (for the chat template) is read from `path`, or from the folder the
server reports in `/model_info` when `path` is empty. `simulated` is the CPU stand-in for an LLM
solver (hljax/tasks/simulated_solver.py): no weights, so it takes neither path nor url.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import jax
import jax.numpy as jnp
import transformers

from hljax.generate.client import SGLangGenerator
from hljax.generate.engine import EngineConfig
from hljax.generate.local import LocalGenerator
from hljax.generate.server import Server

Backend = Literal["embedded_server", "embedded", "sglang", "simulated"]
WAIT_S = 300.0  # For a server to answer /health: a loading SGLang server, or ours compiling its first step.


@dataclasses.dataclass(frozen=True)
class GeneratorSpec:
    backend: Backend
    path: str = ""  # HF folder: the weights (embedded) or the tokenizer (sglang).
    url: str = ""  # sglang only.
    max_batch: int = 16
    max_seq_len: int = 4096
    dtype: Literal["float32", "bfloat16"] = "float32"
    seed: int = 0  # simulated only: the seed of its accuracy model.

    def __post_init__(self):
        if self.backend not in typing.get_args(Backend):
            raise ValueError(f"unknown generator backend {self.backend!r}; valid: {typing.get_args(Backend)}")
        if self.backend == "simulated":
            if self.path or self.url:
                raise ValueError("the simulated backend is a stand-in for an LLM and loads no model: give it "
                                 f"neither a path nor a url (got path={self.path!r}, url={self.url!r})")
            return
        if self.backend == "sglang" and not self.url:
            raise ValueError("the sglang backend needs a url")
        if self.backend != "sglang" and not self.path:
            raise ValueError(f"the {self.backend} backend needs path (an HF folder)")


class Endpoint:
    """A generator and whatever must be stopped with it (`server`: the embedded one, if any)."""

    def __init__(self, spec: GeneratorSpec, mesh: jax.sharding.Mesh, tokenizer=None, name: str = "server"):
        """`tokenizer`: one already loaded from `spec.path` (the trainer's, for its proposer), which the
        SGLang client of an `embedded_server` or `sglang` endpoint then renders chats with. `name`: what
        it is to the run ("proposer", "solver"), as the wait for its server says."""
        self.spec = spec
        self.server: Server | None = None
        if spec.backend == "simulated":
            from hljax.tasks.simulated_solver import SimulatedSolver

            self.generator = SimulatedSolver(seed=spec.seed)
            return
        if spec.backend == "sglang":
            client = SGLangGenerator(spec.url, tokenizer)
            client.wait_until_ready(WAIT_S, name=name)
            if tokenizer is None:
                tokenizer_path = spec.path or client.model_info().get("model_path", "")
                try:
                    client.tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
                except (OSError, ValueError) as e:
                    raise ValueError(f"{spec.url}: cannot load the tokenizer from {tokenizer_path!r} (set path to "
                                     f"the model's HF folder): {e}") from None
            self.generator = client
            return
        local = LocalGenerator.from_pretrained(spec.path, mesh, EngineConfig(
            max_batch=spec.max_batch, max_seq_len=spec.max_seq_len), dtype=getattr(jnp, spec.dtype))
        if spec.backend == "embedded":
            self.generator = local
            return
        self.server = Server(local, spec.path).start()
        client = SGLangGenerator(self.server.url, tokenizer if tokenizer is not None else local.tokenizer)
        try:
            # /health generates a token: the first one compiles the engine's step.
            client.wait_until_ready(WAIT_S, name=name)
        except BaseException:  # A stop signal or a timeout: no one else holds the server to stop it.
            self.close()
            raise
        self.generator = client

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
