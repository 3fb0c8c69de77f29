"""SFT data from a teacher: revisions of the seed harness that improve on it and pass quality filters.

The paper's SFT data are a 35B teacher's revisions of the seed harness that improved on the seed
and passed quality filters. Here, for each task family and each feedback round r < `rounds`:
1. the seed harness runs on round r's feedback questions: the revision state and its proposer
   prompt (`loop.revision.build_state`, the prompt GRPO shows for the same state);
2. the teacher samples `proposals` completions for that prompt (seeded by run seed, task, round);
3. each completion becomes a candidate (`loop.revision.candidate`), goes through the static filters
   of hljax/harness/filters.py, and if they pass runs in the sandbox on the round's feedback
   questions and on the task's scoring questions (`scoring_questions` of the scoring split, the
   same for every candidate of the task, disjoint from all feedback questions);
4. it is kept only if every filter passes, including "improves": its scoring mean beats the seed's.

With `history` on, the prompt of (task, round r) also shows the teacher's proposals for that task at
rounds < r (`history_from_rows`, read from the rows on disk, so a resumed collection rebuilds it);
a proposal not written because of an infrastructure error is missing from it.

Output, next to each other:
- `out`: kept rows, the schema of hljax/rl/sft_data.py (directly usable as `sft.data`), plus
  round, proposal, candidate (the new harness), scores, filters (name -> passed), details (name ->
  why not), flags, kept, reason, finish_reason;
- `<out without .jsonl>.rejected.jsonl`: rejected rows, the same fields, `reason` naming the first
  failed filter (details say why);
- `<...>.summary.json` and a printed table: kept / rejected by reason, per task and in total;
- `<...>.config.json`: what the rows were collected with; a rerun with settings that change what a
  row holds is refused (hljax.config.RERUN_CHANGES lists what may change).

Resume: rows are appended and fsynced one at a time, with ids "<task>/r<round>/p<proposal>". A rerun
reads both files, cuts a torn last line (a kill mid-write), and skips every id already written, so
nothing is written twice or lost. A proposal whose runs hit an infrastructure error (the sandbox or
the solver failed, not the harness) is not written: the summary counts it and a rerun retries it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from typing import Sequence

import jax
from tqdm import tqdm

from hljax import jsonl, sharding as shd
from hljax.checkpoint.presets import init_model
from hljax.config import check_rerun, save_config
from hljax.data.collect_config import CollectConfig
from hljax.endpoints import Endpoint, solver_spec, to_generator_spec
from hljax.generate.openai_chat import ChatModel, OpenAIOptions, api_key_from_env
from hljax.harness import filters as fl
from hljax.harness.history import HistoryConfig, HistoryEntry, make_entry
from hljax.loop import rewards
from hljax.loop.records import candidate_id
from hljax.loop.revision import build_state, candidate, score_candidates
from hljax.seeding import derive_seed
from hljax.signals import stop_point
from hljax.tasks.base import Question, Task
from hljax.tasks.multihop_qa import QAPayload
from hljax.tasks.reasoning_gym import RGPayload
from hljax.tasks.suite import tasks_and_seed_harness
from sandbox.pool import SandboxPool
from sandbox.results import JobResult

log = logging.getLogger(__name__)


# ----- rows on disk ---------------------------------------------------------------------------------


def row_id(task: str, round_index: int, proposal: int) -> str:
    return f"{task}/r{round_index}/p{proposal}"


def read_rows(path: str) -> list[dict]:
    """Rows of a collector JSONL. A torn last line (a kill mid-write) is cut off the file; a bad line
    elsewhere is an error naming the file and line (hljax/jsonl.py)."""
    rows = jsonl.read(path, cut_torn=True)
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("id"), str):
            raise ValueError(f"{path}: row {n} has no string id")
    return rows


def _append(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def history_from_rows(rows: Sequence[dict], task: str, round_index: int, seed_harness: str,
                      config: HistoryConfig) -> tuple[HistoryEntry, ...]:
    """The teacher's earlier proposals for `task` (rounds before `round_index`) as history entries, in
    round then proposal order. Every one revised the seed; none was carried forward (each state
    revises the seed), and per-question scores are not in the rows, so only means are compared.
    A proposal that was not run (an invalid edit, or a static filter refused it) shows as invalid."""
    mine = sorted((r for r in rows if r["task"] == task and r["round"] < round_index),
                  key=lambda r: (r["round"], r["proposal"]))
    out = []
    for r in mine:
        ran = r["scores"]["candidate"] is not None
        kind = ("ran" if r["filters"].get("runs_clean", False) else "crashed") if ran else \
            ("invalid" if r["candidate"] is None else f"filtered:{r['reason']}")
        out.append(make_entry(
            id=candidate_id(r["round"], r["proposal"]), parent="seed", round=r["round"], kind=kind, has_code=ran,
            score=r["scores"]["candidate"] or 0.0, scores=(), parent_score=r["scores"]["parent"], parent_scores=(),
            detail="" if ran else r["details"].get(r["reason"], ""), parent_code=seed_harness,
            code=r["candidate"] if ran else None, selected=False, context=config.context_lines))
    return tuple(out)


def references(question: Question) -> list[str]:
    """The reference strings a hard-coded answer would spell: the rendered reference and the raw one(s)."""
    out = [question.answer]
    if isinstance(question.payload, RGPayload):
        out.append(str(question.payload.entry["answer"]))
    elif isinstance(question.payload, QAPayload):
        out += list(question.payload.golds)
    return out


# ----- the collector --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Judged:
    """One proposal on its way to a row."""

    index: int
    text: str
    finish_reason: str
    verdicts: list[fl.Verdict]
    code: str | None = None
    feedback: list[JobResult] | None = None
    scoring: list[JobResult] | None = None
    flags: tuple[str, ...] = ()

    @property
    def failed(self) -> fl.Verdict | None:
        return next((v for v in self.verdicts if not v.ok), None)


class Collector:
    def __init__(self, cfg: CollectConfig):
        self.cfg = cfg
        self._endpoints: list[Endpoint] = []
        self.pool: SandboxPool | None = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        cfg = self.cfg
        m = cfg.mesh
        # Fixed sizes take the first devices; -1 on an axis takes them all (the trainer's convention).
        devices = None if -1 in (m.data, m.fsdp, m.tensor) else jax.devices()[: m.data * m.fsdp * m.tensor]
        mesh = shd.make_mesh(m, devices)
        t = cfg.teacher
        teacher_path = t.path
        if t.backend == "embedded_server" and not teacher_path:
            teacher_path = os.path.join(cfg.run_dir, "teacher-init")
            if not os.path.exists(os.path.join(teacher_path, "config.json")):
                init_model(t.preset, teacher_path, seed=cfg.seed)
        openai = None
        if t.api == "openai":
            openai = OpenAIOptions(model=t.model or os.path.basename(os.path.normpath(teacher_path)),
                                   api_key=api_key_from_env(t.api_key_env), template_kwargs=t.template_kwargs)
        spec = to_generator_spec("embedded_server" if t.backend == "embedded_server" else "sglang", path=teacher_path,
                                 url=t.url, serving=t.serving, api=t.api, openai=openai, timeout_s=t.timeout_s)
        endpoint = Endpoint(spec, mesh, name="teacher")
        self._endpoints.append(endpoint)
        self.teacher: ChatModel = endpoint.generator
        self.source = f"teacher:{openai.model if openai else os.path.basename(os.path.normpath(teacher_path))}"
        solver = Endpoint(solver_spec(cfg.solver, teacher_path, cfg.seed), mesh, name="solver")
        self._endpoints.append(solver)
        self.pool = SandboxPool(cfg.sandbox, solver.generator, cfg.solver.budget)
        self.tasks, self.seed_harness = tasks_and_seed_harness(cfg.tasks, cfg.seed)
        self._parent: dict[str, tuple[float, list[Question]]] = {}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        for e in self._endpoints:
            e.close()
        self._endpoints = []

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- run --------------------------------------------------------------------------------

    def run(self) -> dict:
        """Collect every missing row; returns the summary (also written to <stem>.summary.json)."""
        cfg = self.cfg
        os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
        self._check_config()
        done = {r["id"] for r in read_rows(cfg.out)}
        rejected = {r["id"] for r in read_rows(cfg.rejected_path)}
        if done & rejected:
            raise ValueError(f"ids both kept and rejected: {sorted(done & rejected)[:5]} "
                             f"({cfg.out}, {cfg.rejected_path})")
        done |= rejected
        units = [(task, r) for task in self.tasks for r in range(cfg.rounds)]
        total = len(units) * cfg.proposals
        wanted = {row_id(task.name, r, k) for task, r in units for k in range(cfg.proposals)}
        infra = collections.Counter()
        bar = tqdm(total=total, initial=len(wanted & done), desc="collect", unit="proposal")
        for task, r in units:
            ids = [row_id(task.name, r, k) for k in range(cfg.proposals)]
            if all(i in done for i in ids):
                continue
            stop_point(f"{bar.n} of {total} proposals written")  # Between states: every row so far is on disk.
            for row in self._unit(task, r, skip={k for k, i in enumerate(ids) if i in done}):
                if row is None:
                    infra[task.name] += 1
                else:
                    _append(cfg.out if row["kept"] else cfg.rejected_path, row)
                bar.update(1)
        bar.close()
        summary = summarize(read_rows(cfg.out) + read_rows(cfg.rejected_path), wanted, infra)
        with open(cfg.stem + ".summary.json", "w") as f:
            json.dump(summary, f, indent=2)
        return summary

    def _check_config(self) -> None:
        # Checked at start-up too (preflight); again here, before the file is written, for direct callers.
        path = self.cfg.stem + ".config.json"
        changes = check_rerun(path, self.cfg, "collect")
        if changes:
            log.info("%s: rerun with %s (allowed: they change only where or how much it collects)", self.cfg.out,
                     "; ".join(map(str, changes)))
        save_config(path, self.cfg)

    def parent(self, task: Task) -> tuple[float, list[Question]]:
        """The seed harness's mean on the task's scoring questions, and those questions (cached)."""
        if task.name not in self._parent:
            questions = task.take("scoring", self.cfg.scoring_questions)
            results = score_candidates(self.pool, task, [self.seed_harness], questions)[0]
            if any(r.is_infra_error for r in results):
                raise RuntimeError(f"{task.name}: infrastructure errors while scoring the seed harness: "
                                   f"{[r.reason for r in results if r.is_infra_error][:3]}")
            self._parent[task.name] = (sum(r.score or 0.0 for r in results) / len(results), questions)
        return self._parent[task.name]

    def _unit(self, task: Task, round_index: int, skip: set[int]) -> list[dict | None]:
        """Rows for the proposals of one state not in `skip`, in proposal order (None: infrastructure error)."""
        cfg, t = self.cfg, self.cfg.teacher
        parent_score, scoring_qs = self.parent(task)
        history = history_from_rows(read_rows(cfg.out) + read_rows(cfg.rejected_path), task.name, round_index,
                                    self.seed_harness, cfg.prompt.history) if cfg.history else ()
        state = build_state(self.pool, task, self.seed_harness, round_index, history)
        messages = state.messages(cfg.prompt)
        sampling = t.sampling.params(seed=derive_seed(cfg.seed, task.name, round_index))
        completions = self.teacher.chat([messages], sampling, n=cfg.proposals, enable_thinking=t.enable_thinking)[0]
        feedback_qs = task.feedback_round(round_index)
        refs = [s for q in feedback_qs + scoring_qs for s in references(q)]
        judged = [self._static(k, c.text, c.finish_reason, refs) for k, c in enumerate(completions) if k not in skip]
        runnable = [j for j in judged if j.failed is None]
        questions = feedback_qs + scoring_qs
        results = score_candidates(self.pool, task, [j.code for j in runnable], questions)
        scoring_refs = [q.answer for q in scoring_qs]
        for j, res in zip(runnable, results):
            j.feedback, j.scoring = res[: len(feedback_qs)], res[len(feedback_qs) :]
            if any(r.is_infra_error for r in res):
                continue
            j.flags = rewards.flags(j.scoring, j.code, scoring_refs)
            j.verdicts += [fl.runs_clean(j.feedback), fl.not_flagged(j.flags),
                           fl.improves(parent_score, _mean(j.scoring), cfg.filters)]
        return [self._row(task, round_index, j, messages, parent_score) for j in judged]

    def _static(self, index: int, text: str, finish_reason: str, refs: Sequence[str]) -> _Judged:
        f = self.cfg.filters
        result = candidate(self.seed_harness, text)
        j = _Judged(index, text, finish_reason, [fl.valid_edit(result)])
        if j.failed is None:
            j.code = result.code
            j.verdicts += [fl.size_limits(j.code, text, f), fl.no_reference_access(j.code),
                           fl.no_hardcoded_answers(j.code, self.seed_harness, refs, f), fl.solver_settings(j.code, f)]
        return j

    def _row(self, task: Task, round_index: int, j: _Judged, messages, parent_score: float) -> dict | None:
        if j.scoring is not None and any(r.is_infra_error for r in j.feedback + j.scoring):
            log.warning("%s: infrastructure error; not written, a rerun retries it",
                        row_id(task.name, round_index, j.index))
            return None
        failed = j.failed
        return {
            "id": row_id(task.name, round_index, j.index),
            "task": task.name,
            "round": round_index,
            "proposal": j.index,
            "harness": self.seed_harness,
            "messages": [dict(m) for m in messages],
            "completion": j.text,
            "candidate": j.code,
            "scores": {"parent": parent_score, "candidate": _mean(j.scoring), "candidate_feedback": _mean(j.feedback)},
            "filters": {v.name: v.ok for v in j.verdicts},
            "details": {v.name: v.detail for v in j.verdicts if not v.ok},
            "flags": list(j.flags),
            "kept": failed is None,
            "reason": "" if failed is None else failed.name,
            "finish_reason": j.finish_reason,
            "source": self.source,
        }


def _mean(results: Sequence[JobResult] | None) -> float | None:
    return None if results is None else sum(r.score or 0.0 for r in results) / len(results)


def summarize(rows: Sequence[dict], wanted: set[str], infra: collections.Counter) -> dict:
    """Kept / rejected-by-reason counts per task and in total, over this config's rows."""
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        if row["id"] in wanted:
            per[row["task"]]["kept" if row["kept"] else f"rejected:{row['reason']}"] += 1
    for task, n in infra.items():
        per[task]["infra_error (not written)"] += n
    total = collections.Counter()
    for c in per.values():
        total.update(c)
    return {"tasks": {t: dict(c) for t, c in sorted(per.items())}, "total": dict(total)}


def format_summary(summary: dict) -> str:
    """The summary as a text table: one row per task, one column per outcome."""
    columns = sorted(summary["total"], key=lambda c: (c != "kept", c))
    rows = [(t, c) for t, c in summary["tasks"].items()] + [("total", summary["total"])]
    width = max([len("task")] + [len(t) for t, _ in rows])
    head = f"{'task':<{width}}  " + "  ".join(columns)
    lines = [head, "-" * len(head)]
    for t, c in rows:
        lines.append(f"{t:<{width}}  " + "  ".join(f"{c.get(col, 0):>{len(col)}}" for col in columns))
    return "\n".join(lines)
