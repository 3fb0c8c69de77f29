"""The SGLang / OpenAI request and response schemas our server speaks, with strict validation.

Every malformed field raises `BadRequest` naming the field, which the server answers with a 400.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from hljax.generate.engine import Output
from hljax.generate.types import SamplingParams


class BadRequest(ValueError):
    pass


_SAMPLING_KEYS = {
    "max_new_tokens": int,
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "stop": (str, list),
    "stop_token_ids": list,
    "n": int,
    "sampling_seed": int,
    "ignore_eos": bool,
    "min_new_tokens": int,
}
# Accepted for compatibility with SGLang clients; they do not change what we compute.
_INERT_SAMPLING = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "no_stop_trim": False}
_GENERATE_KEYS = {"text", "input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len",
                  "top_logprobs_num", "return_text_in_logprobs"}


def _typed(obj: dict, key: str, types, where: str):
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"{where}.{key} must be {_names(types)}, got a boolean")
    if not isinstance(value, types):
        raise BadRequest(f"{where}.{key} must be {_names(types)}, got {type(value).__name__}")
    return value


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def sampling_from_sglang(params: Any, where: str = "sampling_params") -> tuple[SamplingParams, int]:
    """SGLang `sampling_params` dict -> (SamplingParams, n)."""
    params = params or {}
    if not isinstance(params, dict):
        raise BadRequest(f"{where} must be an object")
    for key, value in params.items():
        if key in _INERT_SAMPLING:
            if value != _INERT_SAMPLING[key]:
                raise BadRequest(f"{where}.{key}={value!r} is not supported by the hljax engine")
        elif key not in _SAMPLING_KEYS:
            raise BadRequest(f"{where}.{key} is not a supported sampling parameter ({sorted(_SAMPLING_KEYS)})")
        else:
            _typed(params, key, _SAMPLING_KEYS[key], where)
    stop = params.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop):
        raise BadRequest(f"{where}.stop must be a string or a list of strings")
    stop_ids = params.get("stop_token_ids") or []
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise BadRequest(f"{where}.stop_token_ids must be a list of integers")
    n = params.get("n", 1)
    if n < 1:
        raise BadRequest(f"{where}.n must be >= 1")
    try:
        sampling = SamplingParams(
            max_new_tokens=params.get("max_new_tokens", 128),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=params.get("top_k", -1),
            stop=tuple(stop),
            stop_token_ids=tuple(stop_ids),
            seed=params.get("sampling_seed"),
            ignore_eos=params.get("ignore_eos", False),
            min_new_tokens=params.get("min_new_tokens", 0),
        )
    except ValueError as e:
        raise BadRequest(f"{where}: {e}") from None
    return sampling, n


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """POST /generate."""

    texts: list[str] | None
    input_ids: list[list[int]] | None
    sampling: list[tuple[SamplingParams, int]]  # One per prompt.
    return_logprob: bool
    single: bool  # A single prompt with n == 1 answers with an object, otherwise a list.

    @classmethod
    def parse(cls, body: Any) -> GenerateRequest:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        unknown = set(body) - _GENERATE_KEYS
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}")
        if body.get("stream"):  # No client hljax supports streams; SGLangGenerator waits for whole outputs.
            raise BadRequest("stream=true is not supported by the hljax server")
        if body.get("top_logprobs_num"):
            raise BadRequest("top_logprobs_num is not supported by the hljax server")
        if ("text" in body) == ("input_ids" in body):
            raise BadRequest("give exactly one of 'text' and 'input_ids'")
        texts = ids = None
        if "text" in body:
            texts = body["text"]
            single = isinstance(texts, str)
            texts = [texts] if single else texts
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise BadRequest("text must be a string or a non-empty list of strings")
            count = len(texts)
        else:
            ids = body["input_ids"]
            single = isinstance(ids, list) and bool(ids) and all(isinstance(t, int) for t in ids)
            ids = [ids] if single else ids
            ok = isinstance(ids, list) and ids and all(
                isinstance(row, list) and row and all(isinstance(t, int) and not isinstance(t, bool) for t in row)
                for row in ids
            )
            if not ok:
                raise BadRequest("input_ids must be a non-empty list of ints or a list of such lists")
            count = len(ids)
        raw = body.get("sampling_params")
        if isinstance(raw, list):
            if len(raw) != count:
                raise BadRequest(f"sampling_params has {len(raw)} entries for {count} prompts")
            sampling = [sampling_from_sglang(p, f"sampling_params[{i}]") for i, p in enumerate(raw)]
        else:
            sampling = [sampling_from_sglang(raw)] * count
        if len({n for _, n in sampling}) != 1:
            raise BadRequest("every prompt of a batch must ask for the same n")
        return_logprob = body.get("return_logprob", False)
        if not isinstance(return_logprob, bool):
            raise BadRequest("return_logprob must be a boolean")
        return cls(texts, ids, sampling, return_logprob, single and sampling[0][1] == 1)


def sglang_output(o: Output, prompt_tokens: int, weight_version: str, return_logprob: bool) -> dict:
    finish = {"type": "stop", "matched": o.matched} if o.finish_reason == "stop" else {
        "type": "length", "length": len(o.token_ids)}
    meta = {
        "id": uuid.uuid4().hex,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(o.token_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(o.logprobs, o.token_ids)]
    return {"text": o.text, "output_ids": list(o.token_ids), "meta_info": meta}


def openai_sampling(body: dict, where: str) -> tuple[SamplingParams, int, bool]:
    """OpenAI completions/chat fields (+ SGLang's top_k) -> (SamplingParams, n, logprobs?)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 128))
    params = {"max_new_tokens": max_tokens}
    for ours, theirs in [("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("stop", "stop"),
                         ("n", "n"), ("sampling_seed", "seed"), ("stop_token_ids", "stop_token_ids"),
                         ("ignore_eos", "ignore_eos"), ("min_new_tokens", "min_tokens")]:
        if body.get(theirs) is not None:
            params[ours] = body[theirs]
    sampling, n = sampling_from_sglang(params, where)
    logprobs = body.get("logprobs")
    return sampling, n, bool(logprobs)


def openai_response(kind: str, model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
