"""An HTTP server that speaks the subset of SGLang's API hljax uses, over our JAX engine.

Batching is *step batching*: a scheduler thread takes every request queued while the previous
batch ran, generates them together (the engine splits them into `max_batch` rows), then repeats.
Rows of one batch finish together, so a short request may wait for a long one in the same batch.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from concurrent.futures import Future
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from hljax.generate import api
from hljax.generate.engine import Output, Request, RequestError
from hljax.generate.local import LocalGenerator, expand, load_engine_weights, render_chat
from hljax.generate.types import SamplingParams

log = logging.getLogger(__name__)


class Scheduler:
    """Collects engine requests from many HTTP threads and runs them in shared batches."""

    def __init__(self, generator: LocalGenerator):
        self.engine = generator.engine
        self._queue: queue.Queue[tuple[list[Request], Future]] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="hljax-scheduler", daemon=True)
        self._thread.start()

    def submit(self, requests: list[Request]) -> list[Output]:
        self.engine.validate(requests)  # Fail this request alone, before it joins a batch.
        future: Future = Future()
        self._queue.put((requests, future))
        return future.result()

    def _loop(self):
        while True:
            pending = [self._queue.get()]
            while True:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            flat = [r for reqs, _ in pending for r in reqs]
            try:
                outputs = self.engine.generate(flat)
            except Exception as e:  # noqa: BLE001 - every waiting client must hear about it.
                log.exception("batch of %d rows failed", len(flat))
                for _, fut in pending:
                    fut.set_exception(e)
                continue
            start = 0
            for reqs, fut in pending:
                fut.set_result(outputs[start : start + len(reqs)])
                start += len(reqs)


class App:
    """Routes and handlers; one per server."""

    def __init__(self, generator: LocalGenerator, model_path: str):
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.model_path = model_path
        self.model_name = os.path.basename(os.path.normpath(model_path))
        self.scheduler = Scheduler(generator)
        self._weights_lock = threading.Lock()
        self.routes: dict[tuple[str, str], Callable[[dict | None], tuple[int, object]]] = {
            ("POST", "/generate"): self.generate,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("GET", "/health"): self.health,
            ("GET", "/health_generate"): self.health,
            ("GET", "/model_info"): self.model_info,
            ("GET", "/get_model_info"): self.model_info,
            ("POST", "/update_weights_from_disk"): self.update_weights_from_disk,
            ("POST", "/flush_cache"): self.flush_cache,
            ("GET", "/flush_cache"): self.flush_cache,
        }

    @property
    def version(self) -> str:
        return self.generator.engine.weight_version

    def _run(self, prompt_ids: list[list[int]], sampling: list[tuple[SamplingParams, int]]) -> list[Output]:
        requests = [r for ids, (sp, n) in zip(prompt_ids, sampling) for r in expand([ids], sp, n)]
        return self.scheduler.submit(requests)

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
        self.scheduler.submit([Request((0,), SamplingParams(max_new_tokens=1, temperature=0.0))])
        return HTTPStatus.OK, {"status": "ok", "weight_version": self.version}

    def model_info(self, body):
        return HTTPStatus.OK, {"model_path": self.model_path, "tokenizer_path": self.model_path,
                               "is_generation": True, "weight_version": self.version}

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
            route = app.routes.get((method, self.path.split("?", 1)[0]))
            if route is None:
                return self._send(HTTPStatus.NOT_FOUND, {"error": {"message": f"no route {method} {self.path}"}})
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

    def __init__(self, generator: LocalGenerator, model_path: str, host: str = "127.0.0.1", port: int = 0):
        self.app = App(generator, model_path)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self.app))
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
