"""`SGLangGenerator`: the `Generator` protocol over a real SGLang server's native API (or ours).

Parallel samples are expanded here, one `sampling_params` entry per copy, so each copy carries its
own seed; SGLang's own `n` would give every copy the same `sampling_seed`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from hljax.generate.local import copy_seed, render_chat
from hljax.generate.types import Completion, Message, SamplingParams

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """A server answered with an error, or could not be reached after all retries; names the URL."""


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    timeout_s: float = 600.0  # Per HTTP request; a long generation batch needs minutes.
    max_retries: int = 5  # On connection errors, timeouts and 5xx; never on 4xx.
    backoff_s: float = 0.5  # First retry delay; doubles each time up to max_backoff_s.
    max_backoff_s: float = 30.0
    batch_size: int = 64  # Prompt copies per /generate request.
    concurrency: int = 4  # /generate requests in flight at once.


class SGLangGenerator:
    def __init__(self, url: str, tokenizer=None, config: ClientConfig = ClientConfig()):
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer  # Needed by chat(): the template is rendered here, as for generate().
        self.config = config

    # -- HTTP --

    def _request(self, method: str, path: str, body: Any = None, retry: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        delay = self.config.backoff_s
        attempts = 1 + (self.config.max_retries if retry else 0)
        for attempt in range(attempts):
            req = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:2000]
                if e.code < 500:
                    raise ServerError(f"{self.url}{path}: HTTP {e.code}: {detail}") from None
                why = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                why = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt + 1 < attempts:
                log.warning("%s%s failed (%s); retry %d/%d in %.1fs", self.url, path, why, attempt + 1,
                            attempts - 1, delay)
                time.sleep(delay)
                delay = min(delay * 2, self.config.max_backoff_s)
        raise ServerError(f"{self.url}{path}: failed after {attempts} attempt(s): {why}")

    def wait_until_ready(self, timeout_s: float = 300.0, poll_s: float = 1.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                self._request("GET", "/health", retry=False)
                return
            except ServerError as e:
                last = e
                time.sleep(poll_s)
        raise ServerError(f"{self.url} not ready after {timeout_s:.0f}s: {last}")

    # -- Generator protocol --

    def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int = 1, return_logprobs: bool = False
    ) -> list[list[Completion]]:
        return self._generate("text", list(prompts), sampling, n, return_logprobs)

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, *, n: int = 1,
        return_logprobs: bool = False,
    ) -> list[list[Completion]]:
        return self._generate("input_ids", [list(p) for p in prompt_ids], sampling, n, return_logprobs)

    def chat(
        self,
        conversations: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        *,
        n: int = 1,
        return_logprobs: bool = False,
        enable_thinking: bool = False,
    ) -> list[list[Completion]]:
        if self.tokenizer is None:
            raise ValueError("SGLangGenerator.chat needs a tokenizer to render the chat template")
        prompts = [render_chat(self.tokenizer, c, enable_thinking) for c in conversations]
        return self.generate(prompts, sampling, n=n, return_logprobs=return_logprobs)

    def _generate(self, field: str, prompts: list, sampling: SamplingParams, n: int, logprobs: bool):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = [(i, {**sampling.to_sglang(), **_seed(copy_seed(sampling.seed, j))}) for i in range(len(prompts))
                for j in range(n)]
        chunks = [rows[k : k + self.config.batch_size] for k in range(0, len(rows), self.config.batch_size)]

        def send(chunk):
            body = {field: [prompts[i] for i, _ in chunk], "sampling_params": [sp for _, sp in chunk],
                    "return_logprob": logprobs}
            out = self._request("POST", "/generate", body)
            if not isinstance(out, list) or len(out) != len(chunk):
                raise ServerError(f"{self.url}/generate: expected {len(chunk)} outputs, got {str(out)[:200]}")
            return out

        with ThreadPoolExecutor(self.config.concurrency) as pool:
            outputs = [o for chunk_out in pool.map(send, chunks) for o in chunk_out]
        done = [_completion(o, logprobs) for o in outputs]
        return [done[i * n : (i + 1) * n] for i in range(len(prompts))]

    # -- weights --

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> None:
        body = {"model_path": path}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        try:
            out = self._request("POST", "/update_weights_from_disk", body)
        except ServerError as e:
            raise ServerError(f"{self.url} did not take the weights at {path}: {e}") from None
        if not out.get("success"):
            raise ServerError(f"{self.url} did not take the weights at {path}: {out.get('message')}")

    def model_info(self) -> dict:
        return self._request("GET", "/model_info")


def _seed(seed: int | None) -> dict:
    return {} if seed is None else {"sampling_seed": seed}


def _completion(o: dict, logprobs: bool) -> Completion:
    meta = o["meta_info"]
    reason = meta["finish_reason"]
    kind = reason.get("type") if isinstance(reason, dict) else reason
    lps = tuple(float(x[0]) for x in meta.get("output_token_logprobs", [])) if logprobs else None
    return Completion(
        text=o["text"],
        token_ids=tuple(o.get("output_ids", ())),
        logprobs=lps,
        finish_reason=kind if kind in ("stop", "length") else "abort",
        prompt_tokens=meta.get("prompt_tokens", 0),
        weight_version=str(meta.get("weight_version", "")),
    )
