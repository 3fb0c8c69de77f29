"""Continuous batching: rows join a running batch of decode slots between chunks and leave when done.

A `Batcher` owns one `DecodeState` (`hljax.generate.steps`): `max_batch` slots at most, a cache
length and a token buffer, each grown to a bucket when a joining row needs more, dropped when the
batch empties (so the next batch is sized to its own rows). Each `step()`:
1. admits waiting rows, first come first served, into free slots: the distinct prompts among them are
   prefilled together once (a prompt whose prefill is still held for waiting rows is not prefilled
   again), and each row's slot gets a copy of its prompt's cache and samples its first token;
2. runs one decode chunk (`decode_chunk` steps) over all slots;
3. retires the finished rows, freeing their slots, and returns the callers whose rows are all done.
A row's tokens depend only on its prompt, its params and its seed (each row samples at its own step
with its own key), never on its neighbours or the step it joined at.

A batch keeps the weights it started with; after a weight swap new rows wait until it drains, so each
completion comes from one weight version.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hljax import sharding as shd
from hljax.generate import steps
from hljax.generate.steps import DecodeState, Output, Request, RowParams

log = logging.getLogger(__name__)


class Ticket:
    """One caller's rows; `outputs` fill in, in request order, as rows finish."""

    def __init__(self, n: int):
        self.outputs: list[Output | None] = [None] * n
        self.remaining = n
        self.weight_version: str | None = None  # Of the batch that generated the rows.

    @property
    def done(self) -> bool:
        return self.remaining == 0


@dataclasses.dataclass
class _Row:
    ticket: Ticket
    index: int  # In the ticket's outputs.
    request: Request
    seed: int
    joined_at: int = -1


@dataclasses.dataclass
class _Prefill:
    """Prefilled distinct prompts: cache rows, last-token logits and padding mask, one row per prompt."""

    cache: list
    logits: jax.Array  # [U, V]
    kv_valid: jax.Array  # [U, W]
    row: dict[tuple[int, ...], int]  # prompt -> its row

    @property
    def width(self) -> int:
        return self.kv_valid.shape[1]


class Batcher:
    """The continuous batch of one engine; not thread-safe (one thread drives it)."""

    def __init__(self, engine):
        """`engine`: an `hljax.generate.engine.Engine`, through its public methods only."""
        self.engine = engine
        self.chunks = 0  # Decode chunks run: the clock of Output.joined_at / finished_at.
        self._waiting: collections.deque[_Row] = collections.deque()
        self._slots: list[_Row | None] = []
        self._st: DecodeState | None = None
        self._weights = None  # engine.snapshot() the running batch decodes with.
        self._held: dict[tuple[int, ...], _Prefill] = {}  # Prefills of prompts that waiting rows still need.

    def add(self, requests: Sequence[Request]) -> Ticket:
        """Queue rows (validated by the caller); they join at the next step with free slots."""
        ticket = Ticket(len(requests))
        for i, r in enumerate(requests):
            seed = r.sampling.seed if r.sampling.seed is not None else self.engine.new_seed()
            self._waiting.append(_Row(ticket, i, r, seed))
        return ticket

    @property
    def idle(self) -> bool:
        return not self._waiting and not any(self._slots)

    @property
    def active(self) -> int:
        """Rows in slots."""
        return sum(s is not None for s in self._slots)

    def step(self) -> list[Ticket]:
        """Admit, decode one chunk, retire; -> the tickets completed by this step."""
        with shd.use_mesh(self.engine.mesh):
            self._admit()
            if self._st is not None and self._live():
                self._run_chunk()
            return self._retire()

    # -- admission --

    def _admit(self) -> None:
        if not self._waiting:
            return
        weights = self.engine.snapshot()
        if self.active and weights[1] is not self._weights[1]:
            return  # New weights: let the running rows finish on the old ones first.
        if not self.active:
            if self._weights is None or weights[1] is not self._weights[1]:
                # The weights a swap or packing replaced are unreferenced by now (unlike in set_model,
                # whose caller still holds the model it passed): return their pages to the OS.
                steps.return_freed_memory()
            self._weights = weights
        ecfg = self.engine.config
        want = self.active + len(self._waiting)
        B = max(len(self._slots), self.engine.batch_size(min(want, ecfg.max_batch)))
        # B is a power of two (and a multiple of the mesh's batch shards): never more rows than max_batch.
        free = [b for b in range(B) if b >= len(self._slots) or self._slots[b] is None]
        free = free[: max(0, ecfg.max_batch - self.active)]
        rows = [self._waiting.popleft() for _ in range(min(len(free), len(self._waiting)))]
        if not rows:
            return  # Every slot is busy.
        prefill = self._prefill([r.request.prompt_ids for r in rows if r.request.prompt_ids not in self._held])
        groups: dict[int, tuple[_Prefill, list[tuple[int, _Row]]]] = {}
        for slot, row in zip(free, rows):
            pre = self._held.get(row.request.prompt_ids) or prefill
            groups.setdefault(id(pre), (pre, []))[1].append((slot, row))
            row.joined_at = self.chunks
        self._hold(prefill)
        self._fit(B, [(pre.width, r.request.sampling.max_new_tokens) for pre, g in groups.values() for _, r in g])
        for pre, group in groups.values():
            self._insert(pre, group)
        self.engine.count(prompt_tokens_received=sum(len(r.request.prompt_ids) for r in rows))

    def _prefill(self, prompts: list[tuple[int, ...]]) -> _Prefill | None:
        """Prefill the distinct prompts (every one, unshared, when share_prefixes is off)."""
        if not prompts:
            return None
        share = self.engine.config.share_prefixes
        distinct = list(dict.fromkeys(prompts)) if share else prompts
        U = self.engine.batch_size(len(distinct))
        W = self.engine.length_bucket(max(map(len, distinct)))
        tokens = np.zeros((U, W), np.int32)
        positions = np.zeros_like(tokens)
        kv_valid = np.zeros((U, W), bool)
        for u, p in enumerate(distinct):
            tokens[u, W - len(p):] = p
            positions[u, W - len(p):] = np.arange(len(p))
            kv_valid[u, W - len(p):] = True
        kv_valid[len(distinct):] = True  # Padding rows: a real (if meaningless) token 0 everywhere.
        graphdef, params, kernels = self._weights[:3]
        # device_put, not jnp.asarray: the latter compiles (and keeps) a program per host array shape.
        tokens, positions, kv_valid = jax.device_put((tokens, positions, kv_valid))
        cache, logits = steps.prefill(graphdef, params, tokens, positions, kv_valid,
                                     jnp.dtype(self.engine.model_config.dtype), kernels)
        n = sum(map(len, distinct))
        self.engine.count(prompt_tokens_prefilled=n, prefills=1)
        log.debug("prefilled %d prompt(s), %d tokens, width %d", len(distinct), n, W)
        # Unshared, rows with equal prompts still map to one row here: each row of a prompt then holds
        # the same values, so which one a slot copies does not matter.
        return _Prefill(cache, logits, kv_valid, {p: u for u, p in enumerate(distinct)})

    def _hold(self, prefill: _Prefill | None) -> None:
        """Keep prefills that waiting rows will need (when sharing); release the others."""
        needed = {r.request.prompt_ids for r in self._waiting} if self.engine.config.share_prefixes else set()
        if prefill is not None:
            for p in prefill.row:
                self._held[p] = prefill
        self._held = {p: pre for p, pre in self._held.items() if p in needed}

    def _fit(self, B: int, rows: list[tuple[int, int]]) -> None:
        """Grow (or make) the state so it has B slots and room for rows of (prefill width, max_new)."""
        ecfg, st = self.engine.config, self._st
        S = max(self.engine.length_bucket(w + m) for w, m in rows)
        M = self.engine.length_bucket(max(m for _, m in rows))
        if st is None or not self.active:
            self._st = steps.empty_state(self.engine.model_config, B, S, M, ecfg.max_stop_ids)
        else:
            old_B, old_S = st.kv_valid.shape
            S, M = max(S, old_S), max(M, st.tokens.shape[1])
            if (B, S, M) != (old_B, old_S, st.tokens.shape[1]):
                self._st = steps.grow(st, B, S, M)
        self._slots += [None] * (B - len(self._slots))

    def _insert(self, pre: _Prefill, group: list[tuple[int, _Row]]) -> None:
        R = steps.bucket(len(group), 1)
        B = len(self._slots)
        ecfg = self.engine.config
        src = np.zeros(R, np.int32)
        dst = np.full(R, B, np.int32)  # Padding entries point past the last slot: dropped.
        params = {k: [] for k in RowParams.__dataclass_fields__}
        stop_ids = np.full((R, ecfg.max_stop_ids), steps.NO_STOP, np.int32)
        for r, (slot, row) in enumerate(group):
            sp = row.request.sampling
            src[r], dst[r] = pre.row[row.request.prompt_ids], slot
            ids = self.engine.stop_ids(sp)
            stop_ids[r, : len(ids)] = ids
            for k, v in (("prompt_len", len(row.request.prompt_ids)), ("seeds", row.seed),
                         ("temperature", sp.temperature), ("top_k", sp.top_k), ("top_p", sp.top_p),
                         ("max_new", sp.max_new_tokens), ("min_new", sp.min_new_tokens)):
                params[k].append(v)
            self._slots[slot] = row
        pad = R - len(group)
        dtypes = dict(prompt_len=np.int32, seeds=np.uint32, temperature=np.float32, top_k=np.int32,
                      top_p=np.float32, max_new=np.int32, min_new=np.int32)
        rows = RowParams(**{k: np.asarray(v + [0] * pad, dtypes[k]) for k, v in params.items() if k != "stop_ids"},
                         stop_ids=stop_ids)
        self._st = steps.insert(self._weights[2], self._st, pre.cache, pre.logits, pre.kv_valid,
                               *jax.device_put((src, dst, rows)))

    # -- decoding --

    def _live(self) -> bool:
        done = np.asarray(self._st.done)
        return any(s is not None and not done[b] for b, s in enumerate(self._slots))

    def _run_chunk(self) -> None:
        graphdef, params, kernels, _ = self._weights
        self._st = steps.decode_chunk(graphdef, params, kernels, self._st, self.engine.config.decode_chunk)
        self.chunks += 1
        self.engine.count(decode_chunks=1)
        if self.engine.tokenizer is not None and any(s and s.request.sampling.stop for s in self._slots):
            toks, done, n = np.asarray(self._st.tokens), np.asarray(self._st.done), np.asarray(self._st.steps)
            hits = np.zeros(len(self._slots), bool)
            for b, s in enumerate(self._slots):
                if s is not None and s.request.sampling.stop and not done[b]:
                    hits[b] = self.engine.stop_string_hit(toks[b, : n[b]].tolist(), s.request.sampling.stop)
            if hits.any():
                self._st = self._st.replace(done=self._st.done | jax.device_put(hits))

    def _retire(self) -> list[Ticket]:
        if self._st is None:
            return []
        done = np.asarray(self._st.done)
        finished = [b for b, s in enumerate(self._slots) if s is not None and done[b]]
        completed = []
        if finished:
            toks, lps, n = np.asarray(self._st.tokens), np.asarray(self._st.logprobs), np.asarray(self._st.steps)
            for b in finished:
                row = self._slots[b]
                out = self.engine.finish(toks[b, : n[b]], lps[b, : n[b]], row.request)
                row.ticket.outputs[row.index] = dataclasses.replace(out, joined_at=row.joined_at,
                                                                    finished_at=self.chunks)
                row.ticket.weight_version = self._weights[3]
                row.ticket.remaining -= 1
                self._slots[b] = None
                if row.ticket.done:
                    completed.append(row.ticket)
            self.engine.count(rows=len(finished), generated_tokens=int(n[finished].sum()))
        if not self.active:
            self._st, self._slots = None, []  # The next batch is sized to its own rows.
            # The batch's cache and XLA's temporaries are freed now, but glibc would keep their pages:
            # an idle server would stay resident at its largest batch (0.6B bf16, B = 8: 2.04 GB after a
            # generate, 1.60 GB after a trim, for 1.31 GB of weights + KV cache).
            steps.return_freed_memory()
        return completed
