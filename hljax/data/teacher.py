"""The teacher that proposes revisions for SFT data: any OpenAI-compatible chat endpoint, or SGLang.

`OpenAIChatGenerator` speaks `/v1/chat/completions` (OpenAI, vLLM, SGLang, our embedded server):
the endpoint applies its own chat template, so no tokenizer is needed here. `SGLangGenerator`
(hljax.generate.client) covers SGLang's native `/generate` with a local tokenizer. Both offer
`chat(conversations, sampling, n=...)`, the only call the collector makes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from typing import Any, Protocol, Sequence

from hljax.generate.client import ClientConfig, ServerError
from hljax.generate.types import Completion, Message, SamplingParams

log = logging.getLogger(__name__)

# A thinking model's reasoning, when the endpoint leaves it in the content: not part of the edit.
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", flags=re.DOTALL)


class ChatModel(Protocol):
    def chat(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, *, n: int = 1,
             return_logprobs: bool = False, enable_thinking: bool = False) -> list[list[Completion]]: ...


@dataclasses.dataclass(frozen=True)
class OpenAIOptions:
    model: str  # The "model" field of each request (the served model's name).
    api_key: str = ""  # Sent as a Bearer token when set.
    # Send SGLang/vLLM's chat_template_kwargs={"enable_thinking": ...}; off for endpoints that refuse
    # unknown fields (api.openai.com).
    template_kwargs: bool = True


class OpenAIChatGenerator:
    """`chat` over `/v1/chat/completions`. The `n` copies of a prompt come from one request with
    `n` and the sampling seed, so a seeded rerun asks for exactly the same thing."""

    def __init__(self, url: str, options: OpenAIOptions, config: ClientConfig = ClientConfig()):
        self.url = url.rstrip("/")
        self.options = options
        self.config = config

    def _post(self, path: str, body: dict) -> Any:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        delay, attempts = self.config.backoff_s, 1 + self.config.max_retries
        for attempt in range(attempts):
            req = urllib.request.Request(self.url + path, data=data, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:2000]
                if e.code < 500 and e.code != 429:  # 429: rate limited, worth waiting for.
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

    def chat(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, *, n: int = 1,
             return_logprobs: bool = False, enable_thinking: bool = False) -> list[list[Completion]]:
        if return_logprobs:
            raise ValueError("OpenAIChatGenerator does not return logprobs (the teacher needs none)")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return [self._one(list(c), sampling, n, enable_thinking) for c in conversations]

    def _one(self, messages: list, sampling: SamplingParams, n: int, enable_thinking: bool) -> list[Completion]:
        body: dict = {"model": self.options.model, "messages": [dict(m) for m in messages],
                      "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                      "top_p": sampling.top_p, "n": n}
        if sampling.top_k != -1:
            body["top_k"] = sampling.top_k  # Not OpenAI's; SGLang and vLLM take it.
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if self.options.template_kwargs:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        out = self._post("/v1/chat/completions", body)
        choices = out.get("choices") if isinstance(out, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise ServerError(f"{self.url}/v1/chat/completions: expected {n} choices, got {str(out)[:300]}")
        prompt_tokens = int((out.get("usage") or {}).get("prompt_tokens") or 0)
        done = []
        for c in sorted(choices, key=lambda c: c.get("index", 0)):
            content = (c.get("message") or {}).get("content")
            if not isinstance(content, str):
                raise ServerError(f"{self.url}/v1/chat/completions: a choice has no text content: {str(c)[:300]}")
            reason = c.get("finish_reason")
            done.append(Completion(text=_THINK.sub("", content), token_ids=(), logprobs=None,
                                   finish_reason=reason if reason in ("stop", "length") else "abort",
                                   prompt_tokens=prompt_tokens, weight_version=str(out.get("model", ""))))
        return done


def api_key_from_env(name: str) -> str:
    """The key in environment variable `name` ("" = no key); an error naming it when it is unset."""
    if not name:
        return ""
    if name not in os.environ:
        raise ValueError(f"teacher.api_key_env names {name!r}, which is not set in the environment")
    return os.environ[name]
