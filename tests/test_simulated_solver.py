"""The simulated solver (a stand-in for an LLM on CPU): its behaviour table, measured through
reasoning-gym's own scorers, and that it stays on the trusted side."""

import dataclasses
import statistics

import pytest

from configs import tiny
from hljax.config import ConfigError
from hljax.endpoints import GeneratorSpec
from hljax.generate.types import SamplingParams
from hljax.rl.run_config import RunConfig
from hljax.tasks.formats import FORMATS
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.simulated_solver import CONFUSED, Behaviour, SimulatedSolver
from hljax.tasks.splits import SplitConfig

GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)


@pytest.fixture(scope="module")
def task():
    # A family without weaknesses (hljax/tasks/bottlenecks.py): the table's base behaviour.
    return ReasoningGymTask(RGTaskConfig(family="complex_arithmetic", pool_size=3000,
                                         splits=SplitConfig(seed=0, feedback_size=4, scoring_size=400, eval_size=4)))


@pytest.fixture(scope="module")
def questions(task):
    return task.take("scoring", 300)


@pytest.fixture(scope="module")
def solver(task, questions):
    s = SimulatedSolver(seed=0)
    s.register(task, questions)
    return s


def _answers(solver, prompts, sampling=GREEDY):
    return [c[0] for c in solver.generate(prompts, sampling)]


def _in_format(question, text):
    return FORMATS[question.payload.format].extract(text) is not None and text.strip() == \
        FORMATS[question.payload.format].render(FORMATS[question.payload.format].extract(text)).strip()


def test_greedy_is_fixed_and_sampling_varies_on_a_variance_family():
    task = ReasoningGymTask(RGTaskConfig(family="count_primes", pool_size=2000,
                                         splits=SplitConfig(seed=0, feedback_size=4, scoring_size=8, eval_size=4)))
    q = task.take("scoring", 1)[0]
    solver = SimulatedSolver(seed=0)
    solver.register(task, [q])
    assert _answers(solver, [q.text] * 3) == _answers(solver, [q.text] * 3)
    sampled = {c.text for c in _answers(solver, [q.text] * 40, SamplingParams(max_new_tokens=64, temperature=1.0))}
    assert len(sampled) > 1


def test_unknown_prompt_gets_a_confused_reply(solver):
    assert _answers(solver, ["What is the capital of nowhere?"])[0].text == CONFUSED


def test_format_follows_the_table(solver, questions):
    """Share of replies in the demanded format on a family without the format weakness: about
    format_kept; about format_suppressed when the prompt asks for plain text."""
    b = Behaviour()
    bare = _answers(solver, [q.text for q in questions])
    plain = _answers(solver, [q.text + "\n\nAnswer in plain text, no formatting." for q in questions])
    # "bare" accepts any reply as its format, so only the delimited formats can tell.
    rate = lambda outs: statistics.fmean(_in_format(q, c.text) for q, c in zip(questions, outs)  # noqa: E731
                                         if q.payload.format != "bare")
    assert abs(rate(bare) - b.format_kept) < 0.05
    assert rate(plain) < b.format_suppressed + 0.05


def test_wrong_answers_are_near_misses_that_score_below_one(task, solver, questions):
    outs = _answers(solver, [q.text for q in questions])
    wrong = [(q, c.text) for q, c in zip(questions, outs) if task.score(c.text, q).value < 1.0]
    assert wrong
    for q, text in wrong[:40]:
        got = FORMATS[q.payload.format].extract(text)
        if got is not None and q.payload.format != "bare":  # "bare" reads a sentence as the answer.
            assert got != str(q.payload.entry["answer"])
            assert len(got) <= len(str(q.payload.entry["answer"])) + 3  # A near miss, not noise.


def test_a_consistent_solver_gives_one_answer_per_question_whatever_the_wording(solver, questions):
    """Outside `variance` families a question's answer does not move with the prompt's wording or
    with sampling: voting gains nothing, and a reworded prompt is no lottery ticket."""
    q = questions[0]
    sampled = {c.text for c in _answers(solver, [q.text] * 20, SamplingParams(max_new_tokens=64, temperature=1.0))}
    assert len(sampled) == 1
    right = [c.text == FORMATS[x.payload.format].render(x.payload.entry["answer"])
             for x, c in zip(questions, _answers(solver, [x.text for x in questions]))]
    reworded = [c.text == FORMATS[x.payload.format].render(x.payload.entry["answer"])
                for x, c in zip(questions, _answers(solver, ["Please help.\n" + x.text for x in questions]))]
    assert right == reworded


# ----- the per-family weaknesses (hljax/tasks/bottlenecks.py), each with its symptom and its fix -----

FAMILY_OF_KIND = {"format": "calendar_arithmetic", "truncation": "gsm_symbolic", "careless": "simple_equations",
                  "variance": "count_primes", "buried": "number_filtering", "none": "complex_arithmetic"}


@pytest.fixture(scope="module")
def world():
    """The RL families (one weakness each) and a family without one, with their scoring questions,
    and a sandbox pool with the tiny default's solver budget."""
    from sandbox.pool import SandboxPool

    cfg = RunConfig.from_config(tiny.get_config())
    tasks = {kind: ReasoningGymTask(RGTaskConfig(family=f, pool_size=2000, splits=SplitConfig(
        seed=0, feedback_size=3, scoring_size=48, eval_size=4))) for kind, f in FAMILY_OF_KIND.items()}
    with SandboxPool(cfg.sandbox, SimulatedSolver(seed=0), cfg.solver.budget) as pool:
        yield tasks, pool


def _scores(pool, task, fix_sets, n=48):
    """Mean reasoning-gym score of the seed harness with each set of fixes, on `n` scoring questions."""
    from hljax.data import harness_fixes as hf
    from hljax.tasks.jobs import run_codes

    codes = [hf.render(hf.Variant(fixes=tuple(s), inline=not s)) for s in fix_sets]
    results = run_codes(pool, task, codes, task.take("scoring", n))
    return [statistics.fmean(r.score or 0.0 for r in rs) for rs in results]


SYMPTOMS = {"format": "The answer is ", "truncation": "Let me think step by step.", "careless": "Quick answer: ",
            "variance": "Not sure, guessing: ", "buried": "P.S. An earlier draft said: "}


@pytest.mark.parametrize("kind", sorted(SYMPTOMS))
def test_each_weakness_shows_its_symptom_in_the_report(world, kind):
    from hljax.harness import seeds
    from hljax.loop.revision import build_state

    tasks, pool = world
    report = build_state(pool, tasks[kind], seeds.load("reasoning"), 0).report
    answers = [q.answer for q in report.questions]
    assert sum(SYMPTOMS[kind] in a for a in answers) >= 2, answers
    others = [k for k in SYMPTOMS if k != kind and k != "format"]  # "The answer is" may follow any prefix.
    assert not any(SYMPTOMS[k] in a for k in others for a in answers), answers


@pytest.mark.parametrize("kind", sorted(SYMPTOMS))
def test_each_fix_mends_its_own_weakness_and_no_other(world, kind):
    """On each family the fix of its weakness raises the seed harness's score by far more than any
    other fix; the other fixes leave it about where it was, or lower it (what they cost)."""
    kinds = sorted(SYMPTOMS)
    tasks, pool = world
    seed, *fixed = _scores(pool, tasks[kind], [()] + [(k,) for k in kinds])
    gain = dict(zip(kinds, (f - seed for f in fixed)))
    # number_filtering's scorer gives partial credit when the reference is inside the answer, so the
    # buried note costs it less than a whole question: its fix gains least.
    assert gain[kind] > 0.1, gain
    assert all(g < 0.08 for k, g in gain.items() if k != kind), gain


def test_fixes_cost_something_where_they_are_not_needed(world):
    """On a family without weaknesses: voting at temperature 1 (sampled_penalty) and a check of a
    proposed answer (second_guess_rate) lose right answers; the other fixes change nothing."""
    tasks, pool = world
    seed, fmt, trunc, careless, variance, buried = _scores(
        pool, tasks["none"], [(), ("format",), ("truncation",), ("careless",), ("variance",), ("buried",)])
    assert careless < seed - 0.05 and variance < seed - 0.05, (seed, careless, variance)
    assert fmt == trunc == buried == seed


def test_two_weaknesses_need_both_fixes(world):
    """A family with two weaknesses (held-out knights_knaves: truncation and careless) gains little
    from either fix alone and most from both."""
    _, pool = world
    task = ReasoningGymTask(RGTaskConfig(family="knights_knaves", pool_size=2000, splits=SplitConfig(
        seed=0, feedback_size=3, scoring_size=32, eval_size=4)))
    seed, trunc, careless, both = _scores(pool, task, [(), ("truncation",), ("careless",), ("truncation", "careless")],
                                          n=32)
    assert both > max(seed, trunc, careless) + 0.2, (seed, trunc, careless, both)


def test_config_refuses_a_model_beside_the_simulated_backend():
    c = tiny.get_config()
    assert RunConfig.from_config(c).solver.simulated
    c.solver.path = "/models/Qwen3.5-4B"
    with pytest.raises(ConfigError, match="simulated.*solver.path='/models/Qwen3.5-4B'"):
        RunConfig.from_config(c)
    c.solver.path = ""
    c.solver.url = "http://127.0.0.1:30000"
    with pytest.raises(ConfigError, match="simulated"):
        RunConfig.from_config(c)
    with pytest.raises(ValueError, match="simulated"):
        GeneratorSpec("simulated", path="/models/x")


@pytest.mark.parametrize("name", ["rg_sft", "rg_grpo", "qa_grpo", "collect_rg", "adapt_rg", "adapt_qa"])
def test_real_model_configs_do_not_use_the_simulated_solver(name):
    import importlib

    c = importlib.import_module(f"configs.{name}").get_config()
    assert c.solver.backend != "simulated"


def test_solver_is_not_reachable_from_harness_code(task, questions):
    """Harness code sees only the sandbox's solver handle: no object of the simulator, no reference."""
    from sandbox.config import SandboxConfig, SolverConfig
    from sandbox.pool import SandboxPool

    from hljax.tasks.jobs import run_codes

    probe = (
        "def solve(question, solver):\n"
        "    names = sorted(set(dir(solver)) | set(dir(type(solver))))\n"
        "    reply = solver.generate(question)\n"
        "    return repr(type(solver)) + ' ' + ' '.join(names) + ' ' + reply\n"
    )
    q = questions[:4]
    sim = SimulatedSolver(seed=0)
    with SandboxPool(SandboxConfig(workers=1, slots_per_worker=4), sim, SolverConfig()) as pool:
        (results,) = run_codes(pool, task, [probe], q)
    assert [r.status for r in results] == ["ok"] * 4
    for r, question in zip(results, q):
        assert "SimulatedSolver" not in r.answer and "register" not in r.answer
        assert "Behaviour" not in r.answer
    # The references were registered on the trusted side only: the simulator answered the questions.
    assert all(CONFUSED not in r.answer for r in results)


def test_every_listed_family_has_a_row_in_the_weakness_table():
    from hljax.tasks import bottlenecks

    bottlenecks.check()
    assert bottlenecks.kinds("rg/gsm_symbolic") == ("truncation",) and bottlenecks.kinds("qa/hotpotqa") == ()


def test_run_outputs_say_the_solver_is_simulated():
    from hljax.tasks.simulated_solver import LABEL

    assert "stand-in for an LLM" in LABEL
    assert dataclasses.is_dataclass(Behaviour)
