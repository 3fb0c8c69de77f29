"""An HTTP server that speaks the subset of SGLang's API hljax uses, over our JAX engine.

Batching is *continuous*: a runner thread owns the engine's `Batcher`; requests from many HTTP
threads queue up and join the running decode batch at the next chunk boundary (every `decode_chunk`
steps), and each finished row frees its slot at once, so a short request never waits for a long one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
from concurrent.futures import Future
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import jax.numpy as jnp

from hljax.generate import api
from hljax.generate.engine import Output, Request, RequestError
from hljax.generate.local import LocalGenerator, expand, load_engine_weights
from hljax.generate.batcher import Batcher
from hljax.generate.types import SamplingParams, render_chat

log = logging.getLogger(__name__)


class BatchRunner:
    """Feeds requests from many HTTP threads into one continuous batch, run by its own thread."""

    def __init__(self, generator: LocalGenerator):
        self.engine = generator.engine
        self.batcher = Batcher(self.engine)
        self._inbox: queue.Queue[tuple[list[Request], Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="hljax-batch-runner", daemon=True)
        self._thread.start()

    def submit(self, requests: list[Request]) -> list[Output]:
        self.engine.validate(requests)  # Fail this request alone, before it joins a batch.
        future: Future = Future()
        self._inbox.put((requests, future))
        return future.result()

    @property
    def queued(self) -> int:
        """Submissions not yet taken in by the runner thread."""
        return self._inbox.qsize()

    def stop(self) -> None:
        """End the runner thread once the requests already submitted are done."""
        self._inbox.put(None)
        self._thread.join()

    def _loop(self):
        futures: dict[int, Future] = {}
        stopping = False
        while True:
            if stopping and self.batcher.idle:
                return
            # Block only when there is nothing to decode; otherwise take what arrived and go on.
            items = [self._inbox.get()] if self.batcher.idle else []
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                if item is None:  # stop(); the requests queued before it still run.
                    stopping = True
                    continue
                requests, future = item
                futures[id(self.batcher.add(requests))] = future
            if self.batcher.idle:
                continue
            try:
                completed = self.batcher.step()
            except Exception as e:  # noqa: BLE001 - every waiting client must hear about it.
                log.exception("decode batch failed; failing its %d request(s)", len(futures))
                for future in futures.values():
                    future.set_exception(e)
                futures.clear()
                self.batcher = Batcher(self.engine)
                continue
            for ticket in completed:
                futures.pop(id(ticket)).set_result(ticket.outputs)


class App:
    """Routes and handlers; one per server."""

    def __init__(self, generator: LocalGenerator, model_path: str, server_args: dict | None = None):
        """server_args: how the server was started (host, port, ...), reported by /get_server_info."""
        self.generator = generator
        self.server_args = dict(server_args or {})
        self.tokenizer = generator.tokenizer
        self.model_path = model_path
        self.model_name = os.path.basename(os.path.normpath(model_path))
        self.runner = BatchRunner(generator)
        self._weights_lock = threading.Lock()
        self.routes: dict[tuple[str, str], Callable[[dict | None], tuple[int, object]]] = {
            ("POST", "/generate"): self.generate,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("GET", "/health"): self.health,
            ("GET", "/health_generate"): self.health,
            ("GET", "/model_info"): self.model_info,
            ("GET", "/get_model_info"): self.model_info,
            ("GET", "/get_server_info"): self.server_info,
            ("GET", "/server_info"): self.server_info,
            ("POST", "/update_weights_from_disk"): self.update_weights_from_disk,
            ("POST", "/flush_cache"): self.flush_cache,
            ("GET", "/flush_cache"): self.flush_cache,
        }

    @property
    def version(self) -> str:
        return self.generator.engine.weight_version

    def _run(self, prompt_ids: list[list[int]], sampling: list[tuple[SamplingParams, int]]) -> list[Output]:
        requests = [r for ids, (sp, n) in zip(prompt_ids, sampling) for r in expand([ids], sp, n)]
        return self.runner.submit(requests)

    def generate(self, body):
        req = api.GenerateRequest.parse(body)
        ids = req.input_ids if req.input_ids is not None else [self.tokenizer.encode(t) for t in req.texts]
        outputs = self._run(ids, req.sampling)
        n = req.sampling[0][1]
        out = [api.sglang_output(o, len(ids[i // n]), self.version, req.return_logprob) for i, o in enumerate(outputs)]
        return HTTPStatus.OK, out[0] if req.single else out

    def completions(self, body):
        if not isinstance(body, dict):
            raise api.BadRequest("request body must be a JSON object")
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise api.BadRequest("prompt must be a string or a non-empty list of strings")
        sampling, n, logprobs = api.openai_sampling(body, "completions")
        ids = [self.tokenizer.encode(p) for p in prompts]
        outputs = self._run(ids, [(sampling, n)] * len(ids))
        choices = []
        for i, o in enumerate(outputs):
            choice = {"index": i, "text": o.text, "finish_reason": o.finish_reason, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"tokens": self.tokenizer.convert_ids_to_tokens(o.token_ids),
                                      "token_logprobs": o.logprobs}
            choices.append(choice)
        used = sum(len(o.token_ids) for o in outputs)
        return HTTPStatus.OK, api.openai_response("text_completion", self.model_name, choices,
                                                  sum(map(len, ids)), used)

    def chat_completions(self, body):
        if not isinstance(body, dict):
            raise api.BadRequest("request body must be a JSON object")
        messages = body.get("messages")
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not ok:
            raise api.BadRequest("messages must be a non-empty list of {role, content} objects with string content")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
            raise api.BadRequest("chat_template_kwargs supports only enable_thinking")
        sampling, n, logprobs = api.openai_sampling(body, "chat.completions")
        text = render_chat(self.tokenizer, messages, bool(kwargs.get("enable_thinking", True)))
        ids = self.tokenizer.encode(text)
        outputs = self._run([ids], [(sampling, n)])
        choices = []
        for i, o in enumerate(outputs):
            choice = {"index": i, "message": {"role": "assistant", "content": o.text},
                      "finish_reason": o.finish_reason, "logprobs": None}
            if logprobs:
                tokens = self.tokenizer.convert_ids_to_tokens(o.token_ids)
                choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, o.logprobs)]}
            choices.append(choice)
        return HTTPStatus.OK, api.openai_response("chat.completion", self.model_name, choices, len(ids),
                                                  sum(len(o.token_ids) for o in outputs))

    def health(self, body):
        # A real one-token generation, as SGLang's /health does: a wedged engine fails it.
        self.runner.submit([Request((0,), SamplingParams(max_new_tokens=1, temperature=0.0))])
        return HTTPStatus.OK, {"status": "ok", "weight_version": self.version}

    def model_info(self, body):
        # SGLang's fields; hljax serves text-only Qwen3 / Qwen3.5 causal LMs.
        cfg = self.generator.engine.model_config
        return HTTPStatus.OK, {"model_path": self.model_path, "tokenizer_path": self.model_path,
                               "is_generation": True, "preferred_sampling_params": None,
                               "weight_version": self.version, "has_image_understanding": False,
                               "has_audio_understanding": False, "model_type": cfg.model_type,
                               "architectures": _architectures(self.model_path)}

    def server_info(self, body):
        """SGLang's shape: the server arguments, then the engine's limits and internal state."""
        engine = self.generator.engine
        ecfg = engine.config
        return HTTPStatus.OK, {
            **self.server_args,
            "model_path": self.model_path, "tokenizer_path": self.model_path,
            # sglang-jax's name for what SGLang servers need a flag for: our engine always honours sampling_seed.
            "enable_deterministic_sampling": True,
            "context_length": engine.context_length, "max_running_requests": ecfg.max_batch,
            "dtype": jnp.dtype(engine.model_config.param_dtype).name,
            "decode_chunk": ecfg.decode_chunk, "share_prefixes": ecfg.share_prefixes,
            "max_req_input_len": engine.context_length - 1, "weight_version": self.version,
            "internal_states": [{**dataclasses.asdict(engine.stats), "running_rows": self.runner.batcher.active}],
            "version": "hljax",
        }

    def update_weights_from_disk(self, body):
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            raise api.BadRequest("model_path (string) is required")
        version = body.get("weight_version")
        if version is not None and not isinstance(version, (str, int)):
            raise api.BadRequest("weight_version must be a string")
        with self._weights_lock:
            try:
                load_engine_weights(self.generator.engine, body["model_path"], None if version is None else str(version))
            except Exception as e:  # noqa: BLE001 - the old weights keep serving; the caller learns why.
                log.warning("update_weights_from_disk(%s) failed: %s", body["model_path"], e)
                return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{type(e).__name__}: {e}",
                                                "weight_version": self.version}
            self.model_path = body["model_path"]
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to update model weights.",
                               "weight_version": self.version, "num_paused_requests": 0}

    def flush_cache(self, body):
        return HTTPStatus.OK, {"success": True, "message": "Cache flushed (the engine keeps no prefix cache)."}


def _architectures(model_path: str) -> list[str]:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return list(json.load(f).get("architectures") or [])
    except (OSError, ValueError):
        return []


def _handler(app: App):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            route = app.routes.get((method, path))
            if route is None:
                # 405 for a path served under another method, as SGLang's FastAPI does: clients probe
                # with it whether a route exists (SGLangGenerator.servers_without_weight_updates).
                known = any(p == path for _, p in app.routes)
                status = HTTPStatus.METHOD_NOT_ALLOWED if known else HTTPStatus.NOT_FOUND
                return self._send(status, {"error": {"message": f"no route {method} {self.path}"}})
            body = None
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                if raw:
                    try:
                        body = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError) as e:
                        raise api.BadRequest(f"malformed JSON: {e}") from None
                elif method == "POST":
                    raise api.BadRequest("a JSON body is required")
                status, payload = route(body)
            except (api.BadRequest, RequestError) as e:
                status, payload = HTTPStatus.BAD_REQUEST, {"error": {"message": str(e), "code": 400}}
            except Exception as e:  # noqa: BLE001 - report, keep serving.
                log.exception("%s %s failed", method, self.path)
                status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": f"{type(e).__name__}: {e}"}}
            self._send(status, payload)

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

    return Handler


class Server:
    """`with Server(generator, path, port=0) as s: s.url` serves in a background thread."""

    def __init__(self, generator: LocalGenerator, model_path: str, host: str = "127.0.0.1", port: int = 0,
                 server_args: dict | None = None):
        self.httpd = ThreadingHTTPServer((host, port), None)
        args = {"host": host, "port": self.httpd.server_address[1], **(server_args or {})}
        self.app = App(generator, model_path, args)
        self.httpd.RequestHandlerClass = _handler(self.app)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hljax-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
