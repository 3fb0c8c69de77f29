"""A task of the user's own, from a file outside the package (hljax/tasks/plugin.py, docs/tasks.md):
loading, splits that reproduce across processes, scoring in the scorer sandbox, bad input refused at
start-up in one line, and the launchers (adaptation, evaluation, two GRPO steps) on it."""

import csv
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hljax import preflight
from hljax.config import TaskSpec
from hljax.tasks.plugin import PluginTask, TaskFileError
from hljax.tasks.suite import build_tasks, load_suite
from sandbox.isolation import bwrap_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "unit_conversion", "task.py")
NEED = {"feedback": (4, "tasks.feedback"), "scoring": (4, "adapt.scoring_questions"),
        "eval": (8, "evaluation.eval_questions")}

SEED = "def solve(question, solver):\n    return solver.generate(question).strip()\n"
TASK = '''
from hljax.tasks.plugin import TaskDef

def score(answer, reference):
    {score_body}

def questions(seed):
    for i in range({n}):
        yield {{"question": f"What is {{i}} plus {{seed}}? (item {{i}})", "answer": str(i + seed)}}

TASK = TaskDef(name="adder", description="Add two numbers.", questions={questions}, score={score},
               seed_harness="seed.py", simulated_accuracy=0.9)
'''


def write_task(directory, *, score_body="return float(answer.strip() == reference)", n=120, questions="questions",
               score="score", seed=SEED, extra="") -> str:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "seed.py"), "w") as f:
        f.write(seed)
    path = os.path.join(directory, "task.py")
    with open(path, "w") as f:
        f.write(extra + TASK.format(score_body=score_body, n=n, questions=questions, score=score))
    return path


def spec(path, **kw) -> TaskSpec:
    return TaskSpec(suite=path, feedback=4, scoring=8, eval=8, **kw)


def test_the_example_task_loads_and_scores_its_references():
    (task,) = build_tasks(spec(EXAMPLE), seed=0)
    assert isinstance(task, PluginTask) and task.name == "unit_conversion" and len(task) == 300
    q = task.take("eval", 1)[0]
    assert task.score(q.answer, q).value == 1.0
    assert task.score(f"{float(q.answer) * 1.02:.4f}", q).value == 0.5  # Within 5%: half marks.
    assert task.score(f"{q.answer} (or maybe 3)", q).value == 0.0  # The last number counts.
    assert "An example question:" in task.description and load_suite(EXAMPLE).names == ("unit_conversion",)


def test_a_scorer_may_return_numpy_scalars_but_not_text_or_booleans(tmp_path):
    """A scorer computing with numpy returns np.float32: a number, scored as one; a numpy bool is not."""
    path = write_task(tmp_path / "np", extra="import numpy as np\n",
                      score_body="return np.float32(0.5) if answer == reference else np.bool_(False)")
    (task,) = build_tasks(spec(path), seed=0)
    q = task.take("eval", 1)[0]
    got = task.score(q.answer, q)
    assert got.value == 0.5 and not got.error and type(got.value) is float
    wrong = task.score("no", q)
    assert wrong.value == 0.0 and "not a number" in wrong.error


def test_splits_are_disjoint_and_a_file_order_changes_nothing(tmp_path):
    (task,) = build_tasks(spec(EXAMPLE), seed=0)
    ids = {sp: {q.qid for q in task.take(sp, 60)} for sp in ("feedback", "scoring", "eval")}
    assert not (ids["feedback"] & ids["scoring"]) and not (ids["scoring"] & ids["eval"]) and not (ids["feedback"] & ids["eval"])
    # The same questions in reverse order: the same splits, in the same order.
    d = tmp_path / "rev"
    d.mkdir()
    with open(os.path.join(os.path.dirname(EXAMPLE), "questions.jsonl")) as f:
        lines = f.readlines()
    (d / "questions.jsonl").write_text("".join(reversed(lines)))
    (d / "seed_harness.py").write_text(SEED)
    (d / "task.py").write_text(open(EXAMPLE).read())
    (rev,) = build_tasks(spec(str(d / "task.py")), seed=0)
    assert [q.qid for q in rev.take("eval", 20)] == [q.qid for q in task.take("eval", 20)]


def test_questions_are_the_same_in_every_process(tmp_path):
    """Python's hash randomisation must not reach a task's questions or splits (a generator and a file)."""
    generated = write_task(str(tmp_path / "gen"))
    code = ("import json, sys\nfrom hljax.config import TaskSpec\nfrom hljax.tasks.suite import build_tasks\n"
            "out = {}\nfor path in sys.argv[1:]:\n"
            "    (t,) = build_tasks(TaskSpec(suite=path, feedback=4, scoring=8, eval=8), seed=3)\n"
            "    out[path] = [[q.qid, q.text, q.answer] for sp in ('feedback', 'scoring', 'eval') for q in t.take(sp, 10)]\n"
            "print(json.dumps(out))\n")
    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": ROOT}
        out = subprocess.run([sys.executable, "-c", code, generated, EXAMPLE], env=env, capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    assert len(runs[0][generated]) == 30


@pytest.mark.skipif(bwrap_path() is None, reason="bwrap not installed: the sandbox refuses")
def test_harness_answers_are_scored_in_the_scorer_sandbox_not_here(tmp_path):
    """The task's scorer writes a marker file on the host path it was given: scoring through the pool
    must leave no marker (it ran where only the sandbox's private /tmp exists) and still score right;
    the trusted `Task.score` on a reference does leave one (the test can fail)."""
    from hljax.tasks.jobs import run_codes
    from hljax.tasks.simulated_solver import SimulatedSolver
    from sandbox.config import SandboxConfig, SolverConfig
    from sandbox.pool import SandboxPool

    marker = tmp_path / "scored_here"
    body = (f"try:\n        open({str(marker)!r}, 'a').write('x')\n    except OSError:\n        pass\n    "
            "return float(answer.strip().endswith(reference))")
    (task,) = build_tasks(spec(write_task(str(tmp_path / "t"), score_body=body)), seed=0)
    questions = task.take("eval", 6)
    echo = "def solve(question, solver):\n    return question.split(' plus ')[0].split()[-1]\n"  # Right when seed is 0.
    solver = SimulatedSolver(seed=0)
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=2), solver, SolverConfig()) as pool:
        (results,) = run_codes(pool, task, [echo], questions)
    assert [r.score for r in results] == [1.0] * 6, [(r.status, r.scorer_error) for r in results]
    assert not marker.exists()
    task.score(questions[0].answer, questions[0])
    assert marker.exists()


@pytest.mark.parametrize("case, expect", [
    ("raises_on_import", "raised on import: line 2: RuntimeError: no data here"),
    ("scorer_returns_text", "its scorer on answer"),
    ("scorer_raises", "ZeroDivisionError"),
    ("scorer_out_of_range", "outside [0, 1]"),
    ("no_reference", "has no reference 'answer'"),
    ("no_solve", "no top-level function solve(question, solver)"),
    ("too_few_questions", "has only 3 distinct feedback questions (after 9 drawn): give the task more questions, "
                          "or lower tasks.feedback (4 feedback questions per task)"),
    ("no_task", "defines none of SUITE, TASKS or TASK"),
    ("missing_file", "no such file"),
    ("unknown_family", "are not tasks of"),
])
def test_bad_input_is_one_line_at_start_up(tmp_path, case, expect):
    d = str(tmp_path / case)
    kw = {"raises_on_import": {"extra": "\nraise RuntimeError('no data here')\n"},
          "scorer_returns_text": {"score_body": "return 'yes'"},
          "scorer_raises": {"score_body": "return 1 / 0"},
          "scorer_out_of_range": {"score_body": "return 7.0"},
          "no_solve": {"seed": "def answer(q):\n    return q\n"},
          "too_few_questions": {"n": 9}}.get(case, {})
    path = write_task(d, **kw)
    if case == "no_reference":
        path = write_task(d, questions="lambda seed: [{'question': 'What is 1 plus 1?'}]")
    if case == "no_task":
        with open(path, "a") as f:
            f.write("\ndel TASK\n")
    if case == "missing_file":
        path = os.path.join(d, "nope.py")
    families = ("adder2",) if case == "unknown_family" else ()
    start = time.perf_counter()
    with pytest.raises(preflight.PreflightError) as e:
        preflight.check_tasks(spec(path, families=families), 0, NEED)
    assert time.perf_counter() - start < 5
    message = str(e.value)
    assert expect in message and "\n" not in message


def test_a_task_error_names_its_file_and_is_a_value_error(tmp_path):
    path = write_task(str(tmp_path / "x"), extra="import json\njson.loads('{')\n")
    with pytest.raises(TaskFileError, match=r"task.py' raised on import: line 2: JSONDecodeError"):
        load_suite(path)
    with pytest.raises(ValueError, match="not a built-in suite"):
        load_suite("reasoning-gym")


def test_a_bad_task_file_stops_the_launcher_in_one_line_before_any_model_loads(tmp_path):
    path = write_task(str(tmp_path / "bad"), score_body="return None")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "launch.adapt", "--config", os.path.join(ROOT, "configs/adapt_tiny.py"),
                          f"--config.run_dir={tmp_path / 'run'}", "--config.proposers=('p=/nonexistent',)",
                          f"--config.tasks.suite={path}", "--config.tasks.families=()"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - start
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "its scorer on answer" in lines[0] and "NoneType" in lines[0], out.stderr
    assert took < 60
    assert not (tmp_path / "run").exists()


# ----- the launchers on a task from a file outside the package -----------------------------------


def _launch(module, config, *overrides, timeout=900):
    argv = [sys.executable, "-m", module, "--config", os.path.join(ROOT, config), *overrides]
    out = subprocess.run(argv, cwd=ROOT, env={**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


@pytest.mark.slow
@pytest.mark.skipif(bwrap_path() is None, reason="bwrap not installed: the sandbox refuses")
def test_adaptation_evaluation_and_two_grpo_steps_on_a_task_file(tmp_path):
    from hljax.checkpoint.presets import init_model
    from hljax.loop import records as rec

    path = write_task(str(tmp_path / "mytask"))
    model = init_model("tiny", str(tmp_path / "model"), seed=1)
    task = [f"--config.tasks.suite={path}", "--config.tasks.families=()"]
    small = ["--config.adapt.proposals=2", "--config.adapt.scoring_questions=2", "--config.evaluation.eval_questions=4",
             "--config.report.plots=False", f"--config.proposers=('tiny={model}',)"]
    adapt = str(tmp_path / "adapt")
    _launch("launch.adapt", "configs/adapt_tiny.py", f"--config.run_dir={adapt}", "--config.adapt.rounds=2", *task, *small)
    rounds = rec.RunStore(os.path.join(adapt, "tiny", "adder", "run0")).rounds()
    assert [r.round for r in rounds] == [0, 1] and all(r.task == "adder" for r in rounds)
    assert "What is" in rounds[0].report  # The report shows this task's feedback questions.
    with open(os.path.join(adapt, "seed", "adder", "eval.json")) as f:
        assert len(json.load(f)["qids"]) == 4
    # The HTML index and the console's table (results.csv) give the same held-out figures (issue 38).
    index = open(os.path.join(adapt, "index.html"), encoding="utf-8").read()
    means = {r["proposer"]: float(r["mean"]) for r in csv.DictReader(open(os.path.join(adapt, "results.csv")))}
    assert f"tiny: {means['tiny']:.3f} over 1 task runs" in index and means["seed"] > 0
    assert f'<td>{means["seed"]:.3f}</td><td class="final">{means["tiny"]:.3f}</td>' in index
    assert "solver: simulated solver" in index

    evaluate = str(tmp_path / "eval")
    _launch("launch.evaluate", "configs/adapt_tiny.py", f"--config.run_dir={evaluate}",
            "--config.evaluation.protocol=single", *task, *small)
    means = {r["proposer"]: float(r["mean"]) for r in csv.DictReader(open(os.path.join(evaluate, "results.csv")))}
    index = open(os.path.join(evaluate, "index.html"), encoding="utf-8").read()
    assert f"tiny: {means['tiny']:.3f} over 1 task runs" in index and "mean over proposals" in index

    run = str(tmp_path / "grpo")
    _launch("launch.train", "configs/tiny.py", f"--config.run_dir={run}", "--config.mode=grpo",
            f"--config.model.path={model}", "--config.grpo.steps=2", "--config.grpo.prompts_per_step=1",
            "--config.grpo.group_size=2", "--config.grpo.scoring_questions=2", "--config.grpo.scoring_windows=2",
            "--config.metrics.plots=False", "--config.export.at_end=False", *task)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    assert [r["stage"] for r in steps] == ["grpo", "grpo"]
    with open(os.path.join(run, "rollouts.jsonl")) as f:
        assert {json.loads(line)["task"] for line in f if line.strip()} == {"adder"}

    # Multistep: states are harnesses the proposer itself revised (states.mode offline), on the same task.
    multi = str(tmp_path / "multistep")
    _launch("launch.train", "configs/tiny.py", f"--config.run_dir={multi}", "--config.mode=grpo",
            f"--config.model.path={model}", "--config.states.mode=offline", "--config.grpo.steps=2",
            "--config.grpo.prompts_per_step=1", "--config.grpo.group_size=2", "--config.grpo.scoring_questions=2",
            "--config.grpo.scoring_windows=2", "--config.states.refresh_every=2", "--config.states.rounds=1",
            "--config.states.proposals=2", "--config.states.scoring_questions=2", "--config.states.max_new_tokens=64",
            "--config.metrics.plots=False", "--config.export.at_end=False", *task)
    with open(os.path.join(multi, "metrics.jsonl")) as f:
        assert [json.loads(line)["stage"] for line in f if line.strip()] == ["grpo", "grpo"]

    collect = str(tmp_path / "collect")
    _launch("launch.collect", "configs/collect_tiny.py", f"--config.run_dir={collect}",
            f"--config.out={collect}/sft.jsonl", *task)
    rows = [json.loads(line) for name in ("sft.jsonl", "sft.rejected.jsonl") if os.path.exists(f"{collect}/{name}")
            for line in open(f"{collect}/{name}") if line.strip()]
    assert rows and {r["task"] for r in rows} == {"adder"}


def test_the_built_in_suites_come_from_the_same_registry():
    rg = load_suite("reasoning_gym")
    assert "def solve" in rg.seed_harness
    tasks = build_tasks(TaskSpec(role="rl"), seed=0)
    assert [t.name for t in tasks][:1] and all(t.name.startswith("rg/") for t in tasks)
    with pytest.raises(ValueError, match="not in the 'rl' list"):
        build_tasks(TaskSpec(role="rl", families=("aiw",)), seed=0)
    assert textwrap.dedent(load_suite("multihop_qa").seed_harness).count("def solve") == 1


@pytest.mark.slow
@pytest.mark.skipif(bwrap_path() is None, reason="bwrap not installed: the sandbox refuses")
def test_the_python_api_adapts_and_scores_a_task_file(tmp_path):
    from hljax import api
    from hljax.checkpoint.presets import init_model
    from hljax.config import ConfigError

    path = write_task(str(tmp_path / "mytask"))
    model = init_model("tiny", str(tmp_path / "model"), seed=1)
    overrides = {"tasks.suite": path, "tasks.families": (), "solver.backend": "simulated", "adapt.rounds": 1,
                 "adapt.proposals": 2, "adapt.scoring_questions": 2, "adapt.max_new_tokens": 64,
                 "proposer.max_seq_len": 2048, "evaluation.eval_questions": 4}
    cfg = api.eval_config({"tiny": model}, str(tmp_path / "run"), overrides)
    with pytest.raises(ConfigError, match="roundz"):
        api.eval_config({"tiny": model}, str(tmp_path / "run"), {"adapt.roundz": 1})
    (task,) = api.load_tasks(cfg.tasks, cfg.seed)
    directory = str(tmp_path / "by_hand")
    with api.open_solver(cfg) as solver, api.open_pool(cfg, solver) as pool, api.open_proposer(cfg, "tiny") as proposer:
        rounds = api.adapt(task, proposer, pool, cfg, directory)
        # The simulated solver answers "adder" right with probability ~0.9: the seed harness scores well.
        seed_scores = api.score(pool, task, api.kept_harness(directory), "eval", 8)
        wrong = api.score(pool, task, "def solve(question, solver):\n    return 'no'\n", "eval", 8)
    assert len(rounds) == 1 and rounds[0].task == "adder" and len(rounds[0].candidates) == 2
    assert len(seed_scores) == 8 and sum(seed_scores) >= 4 and wrong == [0.0] * 8
