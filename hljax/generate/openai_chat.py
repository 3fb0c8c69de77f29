"""`OpenAIChatGenerator`: chat over any OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI,
vLLM, SGLang, our embedded server), the SFT collector's teacher.

The endpoint applies its own chat template, so no tokenizer is needed here. `SGLangGenerator`
(hljax/generate/client.py) covers SGLang's native `/generate` with a local tokenizer. Both offer
`chat(conversations, sampling, n=...)`, the only call the collector makes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Protocol, Sequence

from hljax.generate.http import ClientConfig, ServerError, request_json
from hljax.generate.types import Completion, Message, SamplingParams

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
        headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}
        return request_json(self.url + path, "POST", body, config=self.config, headers=headers)

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
