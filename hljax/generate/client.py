"""`SGLangGenerator`: the `Generator` protocol over a real SGLang server's native API (or ours).

Parallel samples are expanded here, one `sampling_params` entry per copy, so each copy carries its
own seed; SGLang's own `n` would give every copy the same `sampling_seed`.

Several servers: give a list of URLs (or one comma-separated string). Requests are split into chunks
spread round-robin across them; every row carries its own seed, so which server answers does not
change what is sampled. Weight updates go to every server, and a server that does not take them is an
error naming it. One `sglang-router` URL is one server here: the router spreads requests itself.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from hljax.generate.http import ClientConfig, ServerError, request_json
from hljax.generate.types import Completion, Message, SamplingParams, copy_seed, render_chat
from hljax.signals import stop_point

log = logging.getLogger(__name__)


def parse_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """"http://a:1,http://b:2" or a list -> ("http://a:1", "http://b:2"); empty entries are an error."""
    parts = url.split(",") if isinstance(url, str) else list(url)
    urls = tuple(u.strip().rstrip("/") for u in parts)
    if not urls or not all(urls):
        raise ValueError(f"server URL list {url!r} is empty or has an empty entry")
    if len(set(urls)) != len(urls):
        raise ValueError(f"server URL list {url!r} names a server twice")
    return urls


class SGLangGenerator:
    def __init__(self, url: str | Sequence[str], tokenizer=None, config: ClientConfig = ClientConfig(),
                 logprob_request: Mapping[str, Any] | None = None):
        """`logprob_request`: more /generate fields for a request that asks log-probs (a server's quirk)."""
        self.logprob_request = dict(logprob_request or {})
        self.urls = parse_urls(url)
        self.url = self.urls[0] if len(self.urls) == 1 else ",".join(self.urls)  # For messages and logs.
        self.tokenizer = tokenizer  # Needed by chat(): the template is rendered here, as for generate().
        self.config = config
        self._next = itertools.count()  # Round-robin cursor over servers, shared by threads.
        self._lock = threading.Lock()

    def _pick(self) -> str:
        with self._lock:
            return self.urls[next(self._next) % len(self.urls)]

    # -- HTTP --

    def _request(self, method: str, path: str, body: Any = None, retry: bool = True, url: str | None = None) -> Any:
        """One HTTP call to server `url` (default: the next one round-robin)."""
        return request_json((url or self._pick()) + path, method, body, config=self.config, retry=retry)

    def wait_until_ready(self, timeout_s: float = 300.0, poll_s: float = 1.0, *, name: str = "server",
                         stop: Callable[[str], None] = stop_point, report_every_s: float = 10.0) -> None:
        """Until every server answers /health; the error names the ones that never did. `name` (e.g.
        "solver") says what is waited for in the countdown logged every `report_every_s`. `stop` is
        called every 0.2 s with what is under way and raises to end the wait (by default once SIGTERM or
        SIGINT arrived, hljax.signals). Probes run in daemon threads: a slow first /health (an embedded
        server compiling its step) is not re-sent, and never holds up a stop."""
        start = time.monotonic()
        deadline = start + timeout_s
        errors: dict[str, str] = {}
        probes: dict[str, tuple[threading.Thread, list]] = {}
        retry_at = {u: start for u in self.urls}
        waiting = set(self.urls)
        next_report = start + min(2.0, report_every_s)  # A server that answers at once is not worth a line.
        while waiting:
            now = time.monotonic()
            what = f"{name} at {', '.join(sorted(waiting))}"
            stop(f"stopped while waiting for {what}")
            if now >= deadline:
                raise ServerError(f"{name}: server(s) {sorted(waiting)} not ready after {timeout_s:.0f}s: "
                                  + "; ".join(errors.get(u, "no answer yet") for u in sorted(waiting)))
            if now >= next_report:
                left = f"{deadline - now:.0f} s left"
                log.info("waiting for %s: %s%s", what, left, f" (last: {errors[min(waiting)]})"
                         if min(waiting) in errors else "")
                next_report = now + report_every_s
            for u in sorted(waiting):
                if u in probes:
                    thread, result = probes[u]
                    if thread.is_alive():
                        continue
                    del probes[u]
                    if result and result[0] is None:
                        waiting.discard(u)
                        continue
                    errors[u] = result[0] if result else "no answer"
                    retry_at[u] = time.monotonic() + poll_s
                elif time.monotonic() >= retry_at[u]:
                    box: list = []
                    thread = threading.Thread(target=self._probe, args=(u, deadline - now, box), daemon=True)
                    thread.start()
                    probes[u] = (thread, box)
            if waiting:
                time.sleep(0.2)
        if time.monotonic() - start > report_every_s:
            log.info("%s ready after %.0f s", name, time.monotonic() - start)

    def _probe(self, url: str, timeout_s: float, result: list) -> None:
        """One GET /health of `url`; appends None when it answered 200, else why not."""
        try:
            with urllib.request.urlopen(url + "/health", timeout=max(timeout_s, 1.0)):
                result.append(None)
        except urllib.error.HTTPError as e:
            result.append(f"{url}/health: HTTP {e.code}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            result.append(f"{url}/health: {getattr(e, 'reason', e)}")

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
        # Enough chunks that every server gets work, none over batch_size.
        size = max(1, min(self.config.batch_size, -(-len(rows) // len(self.urls))))
        chunks = [rows[k : k + size] for k in range(0, len(rows), size)]

        def send(chunk):
            body = {field: [prompts[i] for i, _ in chunk], "sampling_params": [sp for _, sp in chunk],
                    "return_logprob": logprobs, **(self.logprob_request if logprobs else {})}
            url = self._pick()
            out = self._request("POST", "/generate", body, url=url)
            if not isinstance(out, list) or len(out) != len(chunk):
                raise ServerError(f"{url}/generate: expected {len(chunk)} outputs, got {str(out)[:200]}")
            return out

        with ThreadPoolExecutor(max(self.config.concurrency, len(self.urls))) as pool:
            outputs = [o for chunk_out in pool.map(send, chunks) for o in chunk_out]
        done = [_completion(o, logprobs) for o in outputs]
        return [done[i * n : (i + 1) * n] for i in range(len(prompts))]

    # -- weights --

    def update_weights_from_disk(self, path: str, weight_version: str | None = None) -> None:
        """Every server loads `path` (concurrently); any that did not is an error naming it. `path`
        must be readable by the servers (a shared filesystem when they run on other hosts)."""
        body = {"model_path": path}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)

        def push(url):
            try:
                out = self._request("POST", "/update_weights_from_disk", body, url=url)
            except ServerError as e:
                return f"{url} did not take the weights at {path}: {e}"
            if not isinstance(out, dict) or not out.get("success"):
                message = out.get("message") if isinstance(out, dict) else out
                return f"{url} did not take the weights at {path}: {message}"
            return None

        with ThreadPoolExecutor(len(self.urls)) as pool:
            failures = [f for f in pool.map(push, self.urls) if f]
        if failures:
            ok = len(self.urls) - len(failures)
            raise ServerError("; ".join(failures) + (f" ({ok} other server(s) did take them)" if ok else ""))

    def model_info(self, url: str | None = None) -> dict:
        """The model info of server `url` (default: the first): `/model_info` (SGLang since 0.5, ours), or
        `/get_model_info` where that is absent (sglang-jax, older SGLang)."""
        url = url or self.urls[0]
        try:
            return self._request("GET", "/model_info", url=url)
        except ServerError as e:
            if e.status != 404:
                raise
        return self._request("GET", "/get_model_info", url=url)

    def servers_ignoring_seeds(self) -> list[str]:
        """The servers that do not sample by `sampling_seed` (started without their deterministic flag):
        seeded runs (resumed evaluations, reproducible rollouts) then do not reproduce on them."""
        return [u for u in self.urls if not _honours_seeds(self._request("GET", "/get_server_info", url=u))]

    def servers_without_weight_updates(self) -> list[str]:
        """The servers without `/update_weights_from_disk` (sglang-jax has none); [] when all have it.
        Asked with a GET, which a server that has the (POST) route answers 405 and one without it 404."""
        missing = []
        for url in self.urls:
            try:
                self._request("GET", "/update_weights_from_disk", url=url, retry=False)
            except ServerError as e:
                if e.status == 404:
                    missing.append(url)
                elif e.status != 405:
                    raise
        return missing


def _honours_seeds(info: dict) -> bool:
    """From /get_server_info: sglang-jax samples by `sampling_seed` only with
    --enable-deterministic-sampling, mainline SGLang with --enable-deterministic-inference."""
    return bool(info.get("enable_deterministic_sampling") or info.get("enable_deterministic_inference"))


def _seed(seed: int | None) -> dict:
    return {} if seed is None else {"sampling_seed": seed}


def _completion(o: dict, logprobs: bool) -> Completion:
    meta = o["meta_info"]
    reason = meta["finish_reason"]
    kind = reason.get("type") if isinstance(reason, dict) else reason
    ids = tuple(o.get("output_ids", ()))
    n = meta.get("completion_tokens", len(ids))
    entries = meta.get("output_token_logprobs", []) if logprobs else []  # [logprob, token id, text] per token.
    # sglang-jax 0.1.0rc0 can repeat a 50-token partial flush: before the whole list in the log-probs
    # (on its "output log-probs only" path, SERVE_FLAGS in hljax/generate/sglang_jax.py), and inside
    # output_ids (measured: 170 ids for 120 tokens, ids[100:150] repeating ids[50:100], the log-probs'
    # 120 ids the ones the text decodes to). So the reply's tokens are the last `completion_tokens`
    # log-prob entries when output_ids has more than that; without log-probs they cannot be recovered.
    # Token ids must match where both are whole, so a server bug never pairs a token with another's log-prob.
    entries = entries[len(entries) - n:] if len(entries) > n else entries
    if len(ids) > n:
        if not logprobs or len(entries) != n:
            raise ServerError(f"/generate: {len(ids)} output ids for {n} completion tokens and "
                              f"{len(entries)} log-prob entries: the server repeated part of its reply")
        ids = tuple(int(x[1]) for x in entries)
    lps = None
    if logprobs:
        got = [int(x[1]) for x in entries]
        if got != list(ids):
            at = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
            raise ServerError(f"/generate: the log-probs' token ids do not match the {len(ids)} output ids "
                              f"({len(entries)} entries; first difference at {at}: {got[at:at + 5]} vs "
                              f"{list(ids[at:at + 5])}): the server returned inconsistent log-probs")
        lps = tuple(float(x[0]) for x in entries)
    return Completion(
        text=o.get("text", ""),  # None come back from a server started with --skip-tokenizer-init.
        token_ids=ids,
        logprobs=lps,
        finish_reason=kind if kind in ("stop", "length") else "abort",
        prompt_tokens=meta.get("prompt_tokens", 0),
        weight_version=str(meta.get("weight_version", "")),
    )
