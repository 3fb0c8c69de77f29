"""The paper's evaluation protocols over frozen proposers, and adaptation runs (`launch.adapt`).

Layout under run_dir: `<label>/<task>/<single|run{k}>/` holds a `records.RunStore` (rounds.jsonl,
harnesses/) plus `eval.json` (held-out scores of the harnesses that matter, by id, and the
evaluation question ids), and `report.html`; `seed/<task>/eval.json` holds the seed row. Every
piece is written as it finishes and reused when found, so an interrupted evaluation resumes;
`config.json` keeps the config, and a rerun may only extend it (hljax.config.RERUN_CHANGES).

Held-out scores always come from the eval split, which is disjoint from feedback and scoring
questions by construction; invalid proposals score 0 there.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from hljax import distributed
from hljax import sharding as shd
from hljax.config import check_rerun, save_config
from hljax.endpoints import Endpoint, GeneratorSpec, solver_spec, to_generator_spec
from hljax.tasks.simulated_solver import LABEL as SIMULATED_LABEL
from hljax.loop import records as rec
from hljax.loop import tables
from hljax.harness.prompts import PromptConfig, history_text, report_text, token_counter
from hljax.loop.adapt import judge, propose, question_scores, run_adaptation
from hljax.loop.revision import build_state
from hljax.loop.run_config import HISTORY_SUFFIX, EvalRunConfig, ProposerEntry
from hljax.seeding import derive_seed
from hljax.signals import stop_point
from hljax.tasks.base import Question, Task
from hljax.tasks.jobs import run_codes
from hljax.tasks.suite import tasks_and_seed_harness
from sandbox.pool import SandboxPool

log = logging.getLogger(__name__)


def task_dir(task: Task) -> str:
    return task.name.replace("/", "_")


# ----- held-out scores, cached per run directory -----


def eval_scores(pool: SandboxPool, task: Task, directory: str, codes: dict[str, str],
                questions: Sequence[Question]) -> dict[str, tuple[float, ...]]:
    """Per-question held-out scores of each harness in `codes`, computing only what eval.json lacks."""
    path = os.path.join(directory, "eval.json")
    qids = [q.qid for q in questions]
    cached = {"qids": qids, "scores": {}}
    if os.path.exists(path):
        with open(path) as f:
            cached = json.load(f)
        if cached["qids"] != qids:
            raise ValueError(f"{path} was scored on other evaluation questions; use a new run_dir")
    todo = [i for i in codes if i not in cached["scores"]]
    if todo:
        results = run_codes(pool, task, [codes[i] for i in todo], questions)
        for k, i in enumerate(todo):
            cached["scores"][i] = list(question_scores(results[k]))
        os.makedirs(directory, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cached, f)
        os.replace(tmp, path)
    return {i: tuple(cached["scores"][i]) for i in codes}


def mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


# ----- protocols -----


def single_revision(cfg: EvalRunConfig, task: Task, seed_code: str, proposer, pool: SandboxPool,
                    directory: str, evalq: Sequence[Question], prompt: PromptConfig) -> None:
    """N independent proposals from the seed harness (one feedback report), each scored on held-out
    questions. The mean over all proposals is the headline; the best is an oracle. A first revision
    has no history: with history on, its section says so."""
    store = rec.RunStore(directory)
    if store.rounds():
        return
    store.put_harness(rec.SEED_ID, seed_code)
    state = build_state(pool, task, seed_code, 0)
    sampling = cfg.adapt.sampling.params(seed=derive_seed(cfg.seed, task.name, "single"))
    count = token_counter(prompt, proposer)
    messages = state.messages(prompt, count)
    completions = propose(proposer, messages, sampling, cfg.adapt.proposals, cfg.proposer.enable_thinking)
    ids = [rec.candidate_id(0, i) for i in range(len(completions))]
    judged = judge(pool, task, seed_code, [c.text for c in completions], evalq, ids, rec.SEED_ID, cfg.reward)
    for c, code in judged:
        if code is not None:
            store.put_harness(c.id, code)
    seed_eval = eval_scores(pool, task, directory, {rec.SEED_ID: seed_code}, evalq)[rec.SEED_ID]
    store.append(rec.RoundRecord(
        task=task.name, round=0, parent=rec.SEED_ID, parent_score=mean(seed_eval), parent_scores=seed_eval,
        feedback_score=state.report.mean_score, report=report_text(state.report, prompt, count),
        candidates=tuple(c for c, _ in judged), selected=rec.SEED_ID, front=(rec.SEED_ID,), seconds=0.0,
        feedback_qids=tuple(q.qid for q in task.feedback_round(0)), scoring_qids=tuple(q.qid for q in evalq),
        scored_on="eval", history=history_text((), prompt, count)))


def adaptation_runs(cfg: EvalRunConfig, task: Task, seed_code: str, proposer, pool: SandboxPool,
                    base_dir: str, evalq: Sequence[Question], prompt: PromptConfig) -> None:
    """`adapt.runs` runs of `adapt.rounds` rounds; the harness kept after each round is scored on
    held-out questions."""
    for k in range(cfg.adapt.runs):
        store = rec.RunStore(os.path.join(base_dir, f"run{k}"))
        rounds = run_adaptation(task, seed_code, proposer, pool, cfg.adapt, store, seed=cfg.seed, run_index=k,
                                prompt=prompt, reward=cfg.reward, enable_thinking=cfg.proposer.enable_thinking)
        kept = dict.fromkeys([rec.SEED_ID] + [r.selected for r in rounds])
        eval_scores(pool, task, store.directory, {i: store.harness(i) for i in kept}, evalq)


# ----- a whole evaluation -----


def proposer_spec(cfg: EvalRunConfig, entry: ProposerEntry) -> GeneratorSpec:
    """An entry with a url is a running server; one with only an HF folder is served by our engine."""
    return to_generator_spec("sglang" if entry.url else "embedded_server", path=entry.path, url=entry.url,
                             serving=cfg.proposer.serving)


def run(cfg: EvalRunConfig) -> dict:
    """Evaluate every proposer on every task; tables and reports on process 0. -> summary paths."""
    distributed.initialize(cfg.distributed)
    mesh = distributed.local_mesh(cfg.mesh) if distributed.process_count() > 1 else shd.make_mesh(cfg.mesh)
    tasks, seed_code = tasks_and_seed_harness(cfg.tasks, cfg.seed)
    # Tasks are independent: each process takes its share, and process 0 tabulates from the files.
    mine = tasks[distributed.process_index()::distributed.process_count()]
    protocol = single_revision if cfg.evaluation.protocol == "single" else adaptation_runs
    os.makedirs(cfg.run_dir, exist_ok=True)
    if distributed.is_main():
        # Checked at start-up too (preflight); again here, before the file is rewritten, for direct callers.
        path = os.path.join(cfg.run_dir, "config.json")
        changes = check_rerun(path, cfg, "evaluate")
        if changes:
            log.info("%s: rerun with %s (allowed: they extend the run or change only where it runs)", cfg.run_dir,
                     "; ".join(map(str, changes)))
        save_config(path, cfg)
    with Endpoint(solver_spec(cfg.solver, cfg.solver_path, cfg.seed), mesh, name="solver") as solver, \
            SandboxPool(cfg.sandbox, solver.generator, cfg.solver.budget) as pool:
        evalq = {t.name: t.take("eval", cfg.evaluation.eval_questions) for t in mine}
        for task in tqdm(mine, desc="seed harness"):
            stop_point("the seed harness's held-out scores so far are kept")
            eval_scores(pool, task, os.path.join(cfg.run_dir, "seed", task_dir(task)), {rec.SEED_ID: seed_code},
                        evalq[task.name])
        for entry in cfg.proposers:
            with Endpoint(proposer_spec(cfg, entry), mesh, name=f"proposer {entry.label}") as proposer:
                # The proposer's rows (with and without history under compare_history): same seeds, same questions.
                for row in [r for r in cfg.rows() if r.entry == entry]:
                    for task in tqdm(mine, desc=f"proposer {row.label}"):
                        stop_point(f"proposer {row.label}: the tasks done so far are kept")
                        directory = os.path.join(cfg.run_dir, row.label, task_dir(task))
                        if cfg.evaluation.protocol == "single":
                            directory = os.path.join(directory, "single")
                        protocol(cfg, task, seed_code, proposer.generator, pool, directory, evalq[task.name],
                                 row.prompt)
    distributed.barrier("evaluation-done")
    if not distributed.is_main():
        return {}
    return tabulate(cfg, tasks)


def collect_results(cfg: EvalRunConfig, tasks: Sequence[Task]) -> list[tables.TaskResult]:
    """Rebuild every TaskResult from the files (so process 0 sees all processes' work)."""
    out = []
    for task in tasks:
        with open(os.path.join(cfg.run_dir, "seed", task_dir(task), "eval.json")) as f:
            seed = mean(json.load(f)["scores"][rec.SEED_ID])
        out.append(tables.TaskResult("seed", task.name, seed, seed, 0, 0.0, 0.0))
    for row in cfg.rows():
        for task in tasks:
            out.append(_result_from_files(cfg, row.label, task))
    return out


def _result_from_files(cfg: EvalRunConfig, label: str, task: Task) -> tables.TaskResult:
    base = os.path.join(cfg.run_dir, label, task_dir(task))
    if cfg.evaluation.protocol == "single":
        cands = rec.RunStore(os.path.join(base, "single")).rounds()[0].candidates
        scores = [c.score if c.has_code else 0.0 for c in cands]
        return tables.TaskResult(label, task.name, mean(scores), max(scores) if scores else 0.0, len(cands),
                                 mean([not c.has_code for c in cands]), mean([s == 0 for s in scores]))
    finals, curves, proposals = [], [], []
    for k in range(cfg.adapt.runs):
        directory = os.path.join(base, f"run{k}")
        rounds = rec.RunStore(directory).rounds()
        with open(os.path.join(directory, "eval.json")) as f:
            held = json.load(f)["scores"]
        kept = [rec.SEED_ID] + [r.selected for r in rounds]
        curves.append([mean(held[i]) for i in kept])
        finals.append(curves[-1][-1])
        proposals.extend(c for r in rounds for c in r.candidates)
    return tables.TaskResult(
        label, task.name, mean(finals), max(finals), len(proposals), mean([not c.has_code for c in proposals]),
        mean([not c.has_code or c.score == 0 for c in proposals]), tuple(float(x) for x in np.mean(curves, axis=0)))


def check_disjoint(cfg: EvalRunConfig, tasks: Sequence[Task]) -> None:
    """Fail loudly if any held-out question was also a feedback or scoring question of a run."""
    for row in cfg.rows():
        for task in tasks:
            base = os.path.join(cfg.run_dir, row.label, task_dir(task))
            for name in sorted(os.listdir(base)):
                with open(os.path.join(base, name, "eval.json")) as f:
                    held = set(json.load(f)["qids"])
                for r in rec.RunStore(os.path.join(base, name)).rounds():
                    seen = set(r.feedback_qids) | (set(r.scoring_qids) if r.scored_on == "scoring" else set())
                    if held & seen:
                        raise AssertionError(f"{base}/{name} round {r.round}: held-out questions were also used "
                                             f"for feedback or scoring: {sorted(held & seen)[:3]}")


def tabulate(cfg: EvalRunConfig, tasks: Sequence[Task]) -> dict:
    check_disjoint(cfg, tasks)
    results = collect_results(cfg, tasks)
    notes = [f"protocol: {cfg.evaluation.protocol}; proposals per {'task' if cfg.evaluation.protocol == 'single' else 'round'}: "
             f"{cfg.adapt.proposals}; held-out questions per task: {cfg.evaluation.eval_questions}",
             "held-out questions come from the eval split, disjoint from feedback and scoring questions"]
    if cfg.evaluation.protocol == "rounds":
        notes.append(f"{cfg.adapt.runs} run(s) of {cfg.adapt.rounds} rounds, policy {cfg.adapt.policy}")
    if cfg.solver.simulated:
        notes.insert(0, f"solver: {SIMULATED_LABEL}")
    if cfg.evaluation.compare_history:
        h = cfg.prompt.history
        notes.append(f"rows '<proposer>{HISTORY_SUFFIX}': the same proposer, seeds and questions, its prompt showing "
                     f"the run's earlier candidates (prompt.history: mode {h.mode}, last {h.last}, "
                     f"max_chars {h.max_chars}); the other rows: the paper's prompt (no history)")
    out = {"results_md": os.path.join(cfg.run_dir, "results.md"), "results_csv": os.path.join(cfg.run_dir, "results.csv")}
    with open(out["results_md"], "w") as f:
        f.write(tables.results_markdown(results, cfg.evaluation.protocol, notes))
    with open(out["results_csv"], "w") as f:
        f.write(tables.to_csv(results, solver_label(cfg)))
    if cfg.report.plots and cfg.evaluation.protocol == "rounds":
        out["plot"] = plot_rounds(results, os.path.join(cfg.run_dir, "score_vs_round.png"), solver_label(cfg))
    if cfg.report.html:
        out["html"] = write_reports(cfg, tasks)
    return out


def solver_label(cfg: EvalRunConfig) -> str:
    """Who answered the harnesses' calls, as every table, plot and report says it."""
    return SIMULATED_LABEL if cfg.solver.simulated else f"{cfg.solver.backend} solver {cfg.solver_path or cfg.solver.url}"


def plot_rounds(results: Sequence[tables.TaskResult], path: str, solver: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for label in dict.fromkeys(r.label for r in results if r.per_round):
        curves = [r.per_round for r in results if r.label == label]
        ax.plot(range(len(curves[0])), np.mean(curves, axis=0), marker="o", label=label)
    seed = [r.mean for r in results if r.label == "seed"]
    if seed:
        ax.axhline(float(np.mean(seed)), color="grey", linestyle="--", label="seed harness")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # Rounds are whole: no 0.5, 1.5 ticks.
    ax.set_ylabel("held-out score (mean over tasks)")
    if solver:
        ax.set_title(f"solver: {solver}", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_reports(cfg: EvalRunConfig, tasks: Sequence[Task]) -> str:
    from hljax.loop import html_report

    pages = []
    for row in cfg.rows():
        for task in tasks:
            base = os.path.join(cfg.run_dir, row.label, task_dir(task))
            runs = ["single"] if cfg.evaluation.protocol == "single" else [f"run{k}" for k in range(cfg.adapt.runs)]
            for name in runs:
                directory = os.path.join(base, name)
                title = f"{row.label} · {task.name} · {name}" + (" · simulated solver" if cfg.solver.simulated else "")
                pages.append(html_report.write_report(directory, title=title, proposer=row.label,
                                                      solver=solver_label(cfg)))
    return html_report.write_index(pages, os.path.join(cfg.run_dir, "index.html"))
