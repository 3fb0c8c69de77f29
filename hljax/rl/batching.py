"""Host-side packing of (prompt, completion) token lists into fixed-shape training arrays."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hljax.rl.logprobs import Sequences


def bucket_length(n: int, multiple: int = 128) -> int:
    """Round a length up to a multiple of `multiple`, so jit compiles once per bucket while padding
    stays small (attention cost grows with the square of the length)."""
    return max(multiple, -(-n // multiple) * multiple)


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], length: int,
         pad_id: int = 0) -> Sequences:
    """Right-padded [B, length] arrays; loss_mask marks positions whose next token is a completion token."""
    B = len(prompts)
    tokens = np.full((B, length), pad_id, np.int32)
    attention = np.zeros((B, length), np.int32)
    loss_mask = np.zeros((B, length), np.float32)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        n = len(p) + len(c)
        if n > length:
            raise ValueError(f"row {b}: prompt {len(p)} + completion {len(c)} tokens exceed length {length}")
        if not p or not c:
            raise ValueError(f"row {b}: prompt and completion must be non-empty")
        tokens[b, :n] = list(p) + list(c)
        attention[b, :n] = 1
        loss_mask[b, len(p) - 1 : n - 1] = 1.0
    return Sequences(tokens=tokens, attention_mask=attention, loss_mask=loss_mask)


def shared_prompts(prompts: Sequence[Sequence[int]], group_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """A step's prompts, each run of `group_size` rows sharing one -> (each group's prefix: its prompt
    but the last token; each row's own start: its prompt's last token, whose position predicts the
    first completion token). With `pack(starts, completions, ...)` and `pack_prefixes`, the layout of
    `logprobs.Prefix`."""
    if len(prompts) % group_size:
        raise ValueError(f"{len(prompts)} rows do not split into groups of {group_size}")
    prefixes = []
    for g in range(0, len(prompts), group_size):
        for r in range(g + 1, g + group_size):
            if list(prompts[r]) != list(prompts[g]):
                raise ValueError(f"rows {g} and {r} of one group have different prompts ({len(prompts[g])} and "
                                 f"{len(prompts[r])} tokens): a group's rows must share their prompt")
        prefixes.append(list(prompts[g][:-1]))
    return prefixes, [list(p[-1:]) for p in prompts]


def pack_prefixes(prefixes: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """LEFT-padded [P, length] (tokens, attention mask) of token lists (an empty one: all padding), as
    `qwen3.SharedPrefix` takes them."""
    tokens = np.full((len(prefixes), length), pad_id, np.int32)
    attention = np.zeros((len(prefixes), length), np.int32)
    for i, p in enumerate(prefixes):
        if len(p) > length:
            raise ValueError(f"prefix {i}: {len(p)} tokens exceed length {length}")
        if len(p):
            tokens[i, length - len(p):] = p
            attention[i, length - len(p):] = 1
    return tokens, attention


def completion_logprobs(per_position: np.ndarray, prompt_len: int, completion_len: int) -> np.ndarray:
    """[L] per-position log-probs -> [completion_len] log-probs of the completion tokens."""
    return per_position[prompt_len - 1 : prompt_len - 1 + completion_len]


def place_completion_logprobs(completion_lps: Sequence[Sequence[float]], prompt_lens: Sequence[int],
                              completion_lens: Sequence[int], fallback: np.ndarray) -> np.ndarray:
    """Per-completion log-probs (the sampler's, one per completion token) -> [B, L] per-position
    log-probs laid out as `pack` lays out the loss mask (completion token k at position
    prompt_len - 1 + k), the inverse of `completion_logprobs`. Elsewhere, and for a row with none,
    `fallback` ([B, L], e.g. the trainer's own log-probs, so a weight exp(fallback - placed) is 1)."""
    out = np.array(fallback, np.float32, copy=True)
    for b, (lps, p, n) in enumerate(zip(completion_lps, prompt_lens, completion_lens)):
        if not len(lps):
            continue
        if len(lps) != n:
            raise ValueError(f"row {b}: the sampler returned {len(lps)} log-probs for {n} completion tokens")
        out[b, p - 1 : p - 1 + n] = lps
    return out


def split_micro(x: np.ndarray, n_micro: int) -> np.ndarray:
    """[B, ...] -> [n_micro, B / n_micro, ...]."""
    if x.shape[0] % n_micro:
        raise ValueError(f"batch of {x.shape[0]} rows does not split into {n_micro} micro-batches")
    return x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:])
