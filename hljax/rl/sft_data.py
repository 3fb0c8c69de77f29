"""SFT rows: the JSONL schema the teacher collector writes and the bundled tiny set uses.

One row per kept revision:
    {"id": str, "task": str, "harness": str (the code the edit applies to),
     "messages": [{"role", "content"}, ...] (the proposer prompt), "completion": str (edit blocks),
     "scores": {"parent": float, "candidate": float} | null, "filters": {name: bool}, "source": str}
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from hljax.generate.types import render_chat
from hljax.rl.batching import bucket_length, pack
from hljax.rl.logprobs import Sequences

REQUIRED = ("id", "task", "harness", "messages", "completion")


@dataclasses.dataclass(frozen=True)
class SFTRow:
    id: str
    task: str
    harness: str
    messages: tuple[dict, ...]
    completion: str


def load_rows(path: str) -> list[SFTRow]:
    """Read and validate a JSONL file; a bad row is an error naming the file and line."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
            missing = [k for k in REQUIRED if k not in obj]
            if missing:
                raise ValueError(f"{path}:{n}: missing field(s) {missing}")
            msgs = obj["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                      for m in msgs):
                raise ValueError(f"{path}:{n}: messages must be a list of {{role, content}} objects")
            rows.append(SFTRow(obj["id"], obj["task"], obj["harness"], tuple(msgs), obj["completion"]))
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def encode(tokenizer, row: SFTRow, enable_thinking: bool) -> tuple[list[int], list[int]]:
    """-> (prompt ids: the chat-rendered messages, completion ids ending with the end-of-turn token).
    `enable_thinking`: the proposer's chat template, as GRPO renders its prompts (model.enable_thinking)."""
    prompt = tokenizer.encode(render_chat(tokenizer, row.messages, enable_thinking=enable_thinking))
    completion = tokenizer.encode(row.completion, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt, completion


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Row indices of global step `step`: epochs are seeded permutations of the n rows, so a resumed
    run at step k sees exactly what an uninterrupted one does (the cursor is the step)."""
    start = step * batch_size
    idx = []
    while len(idx) < batch_size:
        epoch, offset = divmod(start + len(idx), n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        idx.append(int(order[offset]))
    return idx


def batches(encoded: Sequence[tuple[list[int], list[int]]], batch_size: int, max_len: int, seed: int, step: int,
            pad_id: int, rows: Sequence[int] | None = None) -> Sequences:
    """The batch of global step `step`, or only its positions `rows` (this process's share, see
    train_step.process_rows). The padded length comes from the whole batch, so every process packs
    to the same shape."""
    idx = batch_indices(len(encoded), batch_size, seed, step)
    longest = max(len(encoded[i][0]) + len(encoded[i][1]) for i in idx)
    if longest > max_len:
        raise ValueError(f"an SFT row has {longest} tokens, over sft.max_len={max_len}")
    length = min(max_len, bucket_length(longest))
    mine = idx if rows is None else [idx[r] for r in rows]
    return pack([encoded[i][0] for i in mine], [encoded[i][1] for i in mine], length, pad_id)
