"""Opening the generators a run talks to: the proposer, the solver, the SFT collector's teacher.

The one place a generator is built. A config block names a backend; `to_generator_spec` turns its
fields into a `GeneratorSpec` (the rules of which backend takes which field live here, once), and
`Endpoint` opens it through `BACKENDS`, the registry every backend is in:

- `embedded_server`: our JAX engine behind the SGLang HTTP API in this process, spoken to through the
  SGLang client (the code path used against a real SGLang server) or, with `api="openai"`, through
  `/v1/chat/completions`.
- `embedded`: the in-process engine without HTTP (an embedded solver).
- `colocated`: the in-process engine without HTTP whose callers share one continuous batch, and which
  takes a trainer's weights as arrays (GRPO's rollout backend without a disk round trip:
  hljax/generate/colocated.py).
- `sglang`: a running server at `url` (SGLang's native API, or any OpenAI-compatible one with
  `api="openai"`); its tokenizer (for the chat template) is read from `path`, or from the folder the
  server reports in `/model_info` when `path` is empty.
- `sglang_jax`: sglang-jax (the JAX SGLang) on `path`, started by hljax from its own venv
  (`scripts/sglang_jax.sh setup`) and restarted on each weight sync, as it cannot load weights in place
  (hljax/generate/sglang_jax.py).
- `simulated`: the CPU stand-in for an LLM solver (hljax/tasks/simulated_solver.py): no weights, so it
  takes neither path nor url.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import transformers

from hljax.config import ServingSpec, SolverSpec
from hljax.generate.client import SGLangGenerator
from hljax.generate.colocated import ColocatedGenerator
from hljax.generate.engine import EngineConfig
from hljax.generate.http import ClientConfig
from hljax.generate.local import LocalGenerator
from hljax.generate.openai_chat import OpenAIChatGenerator, OpenAIOptions
from hljax.generate.server import Server
from hljax.generate.sglang_jax import ManagedSGLangJax
from hljax.tasks.simulated_solver import SimulatedSolver

log = logging.getLogger(__name__)

WAIT_S = 300.0  # For a server to answer /health: a loading SGLang server, or ours compiling its first step.
SERVER_BACKENDS = ("embedded_server", "sglang")  # Spoken to over HTTP: they take an `api`.


@dataclasses.dataclass(frozen=True)
class GeneratorSpec:
    backend: str  # A key of BACKENDS.
    path: str = ""  # HF folder: the weights (embedded) or the tokenizer (sglang).
    url: str = ""  # sglang only.
    serving: ServingSpec = ServingSpec()  # Embedded engines: batch, KV-cache length, dtype.
    seed: int = 0  # simulated only: the seed of its accuracy model.
    api: Literal["sglang", "openai"] = "sglang"  # How a server backend is spoken to.
    openai: OpenAIOptions | None = None  # api="openai": the request's model name, key, template kwargs.
    timeout_s: float = ClientConfig.timeout_s  # Per HTTP request.

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown generator backend {self.backend!r}; valid: {sorted(BACKENDS)}")
        if self.backend == "simulated":
            if self.path or self.url:
                raise ValueError("the simulated backend is a stand-in for an LLM and loads no model: give it "
                                 f"neither a path nor a url (got path={self.path!r}, url={self.url!r})")
            return
        if self.backend == "sglang" and not self.url:
            raise ValueError("the sglang backend needs a url")
        if self.backend != "sglang" and not self.path:
            raise ValueError(f"the {self.backend} backend needs path (an HF folder)")
        if self.backend == "sglang_jax" and self.api != "sglang":
            raise ValueError("the sglang_jax backend speaks SGLang's native API only (api='sglang')")
        if self.api == "openai" and (self.backend not in SERVER_BACKENDS or self.openai is None):
            raise ValueError(f"api='openai' needs a server backend {SERVER_BACKENDS} and its openai options "
                             f"(got backend {self.backend!r}, openai={self.openai})")


def to_generator_spec(backend: str, *, path: str = "", url: str = "", serving: ServingSpec = ServingSpec(),
                      default_path: str = "", seed: int = 0, api: Literal["sglang", "openai"] = "sglang",
                      openai: OpenAIOptions | None = None, timeout_s: float = ClientConfig.timeout_s
                      ) -> GeneratorSpec:
    """A config block's generator: `default_path` serves (embedded) or renders the chat template of
    (sglang) a block whose `path` is ""; a url counts only for a backend that connects (sglang), a
    path and url not at all for the simulated solver (its config refuses them earlier)."""
    if backend == "simulated":
        return GeneratorSpec("simulated", seed=seed)
    return GeneratorSpec(backend, path or default_path, url=url if backend == "sglang" else "", serving=serving,
                         api=api, openai=openai, timeout_s=timeout_s)


def solver_spec(solver: SolverSpec, default_path: str, seed: int) -> GeneratorSpec:
    """The solver block's generator; `default_path` (the proposer's initial weights) when it names none."""
    return to_generator_spec(solver.backend, path=solver.path, url=solver.url, serving=solver.serving,
                             default_path=default_path, seed=seed)


@dataclasses.dataclass
class Opened:
    generator: Any  # A Generator (hljax/generate/types.py), or a chat-only one (api="openai").
    # What this process runs for it (a server, a batch thread): stopped with the endpoint.
    server: Server | ManagedSGLangJax | ColocatedGenerator | None = None


def _client(spec: GeneratorSpec, url: str, tokenizer) -> Any:
    if spec.api == "openai":
        return OpenAIChatGenerator(url, spec.openai, ClientConfig(timeout_s=spec.timeout_s))
    return SGLangGenerator(url, tokenizer, ClientConfig(timeout_s=spec.timeout_s))


def _simulated(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    return Opened(SimulatedSolver(seed=spec.seed))


def _sglang(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    if spec.api == "openai":  # Any compatible endpoint (api.openai.com has no /health); it renders the template.
        return Opened(_client(spec, spec.url, None))
    probe = _client(spec, spec.url, tokenizer)
    probe.wait_until_ready(WAIT_S, name=name)
    if ignoring := probe.servers_ignoring_seeds():
        log.warning("%s: %s ignore sampling seeds (start sglang-jax with --enable-deterministic-sampling, SGLang "
                    "with --enable-deterministic-inference): seeded samples will not reproduce", name,
                    ", ".join(ignoring))
    if tokenizer is None:
        tokenizer_path = spec.path or probe.model_info().get("model_path", "")
        try:
            probe.tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{spec.url}: cannot load the tokenizer from {tokenizer_path!r} (set path to "
                             f"the model's HF folder): {e}") from None
    return Opened(probe)


def _local(spec: GeneratorSpec, mesh) -> LocalGenerator:
    s = spec.serving
    return LocalGenerator.from_pretrained(spec.path, mesh, EngineConfig(max_batch=s.max_batch, max_seq_len=s.max_seq_len),
                                          dtype=getattr(jnp, s.dtype))


def _embedded(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    return Opened(_local(spec, mesh))


def _embedded_server(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    local = _local(spec, mesh)
    server = Server(local, spec.path).start()
    try:
        # /health generates a token: the first one compiles the engine's step.
        SGLangGenerator(server.url, local.tokenizer).wait_until_ready(WAIT_S, name=name)
    except BaseException:  # A stop signal or a timeout: no one else holds the server to stop it.
        server.stop()
        raise
    return Opened(_client(spec, server.url, tokenizer if tokenizer is not None else local.tokenizer), server)


def _colocated(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    generator = ColocatedGenerator(_local(spec, mesh))
    return Opened(generator, generator)


def _sglang_jax(spec: GeneratorSpec, mesh, tokenizer, name: str) -> Opened:
    tokenizer = tokenizer if tokenizer is not None else transformers.AutoTokenizer.from_pretrained(spec.path)
    s = spec.serving
    managed = ManagedSGLangJax(spec.path, tokenizer, max_batch=s.max_batch, max_seq_len=s.max_seq_len, dtype=s.dtype,
                               client=ClientConfig(timeout_s=spec.timeout_s), name=name)
    return Opened(managed, managed)


# name -> opener(spec, mesh, tokenizer, name). A new backend registers here and nowhere else.
BACKENDS: dict[str, Callable[[GeneratorSpec, jax.sharding.Mesh, Any, str], Opened]] = {
    "embedded_server": _embedded_server, "embedded": _embedded, "colocated": _colocated, "sglang": _sglang,
    "sglang_jax": _sglang_jax, "simulated": _simulated,
}


class Endpoint:
    """A generator and whatever must be stopped with it (`server`: the embedded one, if any)."""

    def __init__(self, spec: GeneratorSpec, mesh: jax.sharding.Mesh, tokenizer=None, name: str = "server"):
        """`tokenizer`: one already loaded from `spec.path` (the trainer's, for its proposer), which the
        SGLang client of an `embedded_server` or `sglang` endpoint then renders chats with. `name`: what
        it is to the run ("proposer", "solver"), as the wait for its server says."""
        self.spec = spec
        opened = BACKENDS[spec.backend](spec, mesh, tokenizer, name)
        self.generator = opened.generator
        self.server: Server | ManagedSGLangJax | ColocatedGenerator | None = opened.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
