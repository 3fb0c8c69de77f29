"""sglang-jax started, and restarted on new weights, by hljax: the weight sync for a server that cannot
load weights in place.

sglang-jax (the JAX SGLang) has no `/update_weights_from_disk`. `ManagedSGLangJax` runs it as a child
process from its own venv (`scripts/sglang_jax.sh setup` makes it: its pins conflict with hljax's) and
syncs weights by restarting it on the new export: tens of seconds a sync on CPU, against about a second
for a server that loads in place. Requests go through the SGLang client unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import shutil
import subprocess
import tempfile
import time
from typing import Sequence

import hljax
from hljax.generate.client import SGLangGenerator
from hljax.generate.http import ClientConfig
from hljax.generate.types import Completion, Message, SamplingParams
from hljax.signals import stop_point

log = logging.getLogger(__name__)

VENV_ENV = "HLJAX_SGLANG_JAX_VENV"
READY_S = 600.0  # Start-up compiles its programs: 33-53 s on 2 idle CPU cores, minutes on loaded ones.


# sglang-jax 0.1.0rc0 crashes its scheduler ("'NoneType' object is not subscriptable" in
# process_batch_result_prefill) on a prefill batch that mixes requests with and without log-probs, and
# on one that asks for log-probs and hits its prefix cache (measured here, 2026-12-05). So: no radix
# cache, no warm-up request (it asks none) and every request of ours asks for them (`_finish`). Its
# replies also carry the log-probs of every 50-token flush before the whole list (160 tokens came with
# 50 + 100 + 150 + 160 entries, whatever --stream-interval says): the client keeps the last entries, whose
# token ids it checks against the reply's.
SERVE_FLAGS = ("--disable-radix-cache", "--skip-server-warmup")
# Every server hljax starts or `scripts/sglang_jax.sh serve` starts has these (seeded sampling, copy_seed
# per row, is honoured only with --enable-deterministic-sampling).
REQUIRED_FLAGS = ("--page-size", "1", "--disable-overlap-schedule", "--enable-deterministic-sampling", *SERVE_FLAGS)


# A request asking log-probs with nothing else goes down sglang-jax's "output log-probs only" path
# (tokenizer_manager), which never advances its send offset (each 50-token flush's entries come back
# again) and pairs entries with the wrong requests in merged batches. Asking top-1 log-probs as well
# takes the main path, whose offsets are kept.
LOGPROB_REQUEST = {"top_logprobs_num": 1}


class SGLangJaxUnavailable(RuntimeError):
    """sglang-jax cannot be started here (no venv, or a model it cannot serve)."""


def venv_python() -> str:
    """The sglang-jax venv's interpreter: `$HLJAX_SGLANG_JAX_VENV`, else .venv-sglang-jax in the repository."""
    venv = os.environ.get(VENV_ENV) or os.path.join(os.path.dirname(os.path.dirname(hljax.__file__)), ".venv-sglang-jax")
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        raise SGLangJaxUnavailable(f"no sglang-jax venv at {venv}: run scripts/sglang_jax.sh setup (or set {VENV_ENV})")
    return python


def check_model(path: str) -> None:
    """One line naming what stops sglang-jax from serving the HF folder `path`, raised before a start."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise SGLangJaxUnavailable(f"{path}: no readable config.json ({e})") from None
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if head_dim % 128:
        raise SGLangJaxUnavailable(f"{path}: head_dim {head_dim} is not a multiple of 128, which sglang-jax's "
                                   "attention needs: serve this model with the embedded_server backend")


# Tokenizer classes of transformers 5 that sglang-jax's transformers (4.57) does not have.
_NEW_TOKENIZER_CLASSES = ("TokenizersBackend",)


def served_view(path: str, root: str) -> str:
    """A folder under `root` that sglang-jax loads as the HF folder `path`: every file linked, except
    config.json and tokenizer_config.json, rewritten with the keys its transformers (4.57) reads where
    transformers 5 writes others: `rope_theta` (5.x nests it in `rope_parameters`), `torch_dtype` (5.x:
    `dtype`), and a tokenizer class 4.57 has. `path` itself is never changed."""
    check_model(path)
    os.makedirs(root, exist_ok=True)
    view = tempfile.mkdtemp(prefix="view-", dir=root)
    for name in os.listdir(path):
        if name not in ("config.json", "tokenizer_config.json"):
            os.symlink(os.path.abspath(os.path.join(path, name)), os.path.join(view, name))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default" and "rope_scaling" not in cfg:
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "torch_dtype" not in cfg and "dtype" in cfg:
        cfg["torch_dtype"] = cfg["dtype"]
    with open(os.path.join(view, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tok_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(tok_path):
        with open(tok_path) as f:
            tok = json.load(f)
        if tok.get("tokenizer_class") in _NEW_TOKENIZER_CLASSES:
            tok["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json carries the whole tokenizer.
        with open(os.path.join(view, "tokenizer_config.json"), "w") as f:
            json.dump(tok, f, indent=2)
    return view


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedSGLangJax:
    """A `Generator` served by an sglang-jax child process; `stop()` ends it.

    max_batch: --max-running-requests; max_seq_len: --context-length; its KV pool holds `pool_tokens`
    (its CPU attention reads the whole pool each step: keep it small). `log_path`: the server's output;
    `extra_args`: more launch_server flags."""

    def __init__(self, path: str, tokenizer, *, max_batch: int = 8, max_seq_len: int = 4096,
                 pool_tokens: int = 16384, dtype: str = "float32", log_path: str = "",
                 client: ClientConfig = ClientConfig(), name: str = "sglang-jax", extra_args: Sequence[str] = ()):
        self.python = venv_python()
        self.tokenizer = tokenizer
        self.name = name
        self.log_path = log_path or os.path.join("/tmp", f"hljax-sglang-jax-{os.getpid()}.log")
        self._args = ["--device", "cpu", "--dtype", dtype, "--context-length", str(max_seq_len),
                      "--max-total-tokens", str(max(pool_tokens, max_seq_len)), "--max-running-requests",
                      str(max_batch), *REQUIRED_FLAGS, *extra_args]
        # One prompt copy per request: batched requests come back with log-probs of other rows' tokens
        # in GRPO rollouts (SERVE_FLAGS); the server still batches the concurrent requests itself.
        self._client_config = dataclasses.replace(client, batch_size=1, concurrency=max(client.concurrency, max_batch))
        self._proc: subprocess.Popen | None = None
        self.client: SGLangGenerator | None = None
        self.path = ""
        self.weight_version = ""
        self.restart_s: list[float] = []  # Wall seconds of each start, the first included.
        self._views = tempfile.mkdtemp(prefix="hljax-sglang-jax-")
        self._start(path)

    @property
    def url(self) -> str:
        return self.client.url if self.client else ""

    def _start(self, path: str) -> None:
        view = served_view(path, self._views)
        port = _free_port()
        cmd = [self.python, "-m", "sgl_jax.launch_server", "--model-path", view, "--host", "127.0.0.1",
               "--port", str(port), *self._args]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "XLA_", "JAX_"))}
        env["JAX_PLATFORMS"] = "cpu"
        t = time.monotonic()
        with open(self.log_path, "ab") as out:
            out.write(f"\n$ {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True)
        self.client = SGLangGenerator(f"http://127.0.0.1:{port}", self.tokenizer, self._client_config,
                                      logprob_request=LOGPROB_REQUEST)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.path = path
        self.restart_s.append(time.monotonic() - t)
        log.info("%s: serving %s at %s (started in %.0f s)", self.name, path, self.url, self.restart_s[-1])

    def _wait_ready(self) -> None:
        proc = self._proc

        def stop_if_dead(what: str) -> None:
            stop_point(what)
            if proc.poll() is not None:
                raise SGLangJaxUnavailable(f"{self.name} exited with code {proc.returncode} while starting: "
                                           f"{_tail(self.log_path)} (whole log: {self.log_path})")

        self.client.wait_until_ready(READY_S, name=self.name, stop=stop_if_dead)

    def stop(self) -> None:
        """End the server; the folder of its served views goes with it."""
        self._stop_process()
        shutil.rmtree(self._views, ignore_errors=True)

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # -- weights --

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> None:
        """Restart the server on the HF folder `path` (the old one is stopped first: one copy in memory)."""
        self._stop_process()
        for old in os.listdir(self._views):  # Links and two small files: the old view is not needed again.
            shutil.rmtree(os.path.join(self._views, old), ignore_errors=True)
        self._start(path)
        self.weight_version = "" if weight_version is None else str(weight_version)

    def servers_without_weight_updates(self) -> list[str]:
        return []  # A restart takes any checkpoint of the served architecture.

    # -- Generator protocol: the SGLang client's, with the weight version the restart set --

    def _finish(self, out: list[list[Completion]], return_logprobs: bool) -> list[list[Completion]]:
        """Log-probs were asked for in any case (SERVE_FLAGS); drop them when the caller did not."""
        version = self.weight_version
        return [[dataclasses.replace(c, logprobs=c.logprobs if return_logprobs else None,
                                     weight_version=version or c.weight_version) for c in row] for row in out]

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, *, n: int = 1,
                 return_logprobs: bool = False) -> list[list[Completion]]:
        return self._finish(self.client.generate(prompts, sampling, n=n, return_logprobs=True), return_logprobs)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, *, n: int = 1,
                     return_logprobs: bool = False) -> list[list[Completion]]:
        return self._finish(self.client.generate_ids(prompt_ids, sampling, n=n, return_logprobs=True), return_logprobs)

    def chat(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, *, n: int = 1,
             return_logprobs: bool = False, enable_thinking: bool = False) -> list[list[Completion]]:
        out = self.client.chat(conversations, sampling, n=n, return_logprobs=True, enable_thinking=enable_thinking)
        return self._finish(out, return_logprobs)

    def model_info(self) -> dict:
        return self.client.model_info()


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-lines:])
    except OSError:
        return "(no log)"



if __name__ == "__main__":  # scripts/sglang_jax.sh serve: the folder to give --model-path, and the flags.
    import sys

    if sys.argv[1:] == ["flags"]:  # One list of the flags the server needs, for this module and the script.
        print(" ".join(REQUIRED_FLAGS))
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] != "view":
        sys.exit("usage: python -m hljax.generate.sglang_jax view HF_FOLDER | flags")
    try:
        print(served_view(sys.argv[2], os.path.join(tempfile.gettempdir(), "hljax-sglang-jax-views")))
    except SGLangJaxUnavailable as e:
        sys.exit(str(e))
