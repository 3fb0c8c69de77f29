"""The simulated solver (a stand-in for an LLM on CPU): its behaviour table, measured through
reasoning-gym's own scorers, and that it stays on the trusted side."""

import dataclasses
import statistics

import pytest

from configs import tiny
from hljax.config import ConfigError
from hljax.generate.endpoints import GeneratorSpec
from hljax.generate.types import SamplingParams
from hljax.rl.run_config import RunConfig
from hljax.tasks.formats import FORMATS
from hljax.tasks.reasoning_gym import ReasoningGymTask, RGTaskConfig
from hljax.tasks.simulated_solver import CONFUSED, Behaviour, SimulatedSolver
from hljax.tasks.splits import SplitConfig

GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)


@pytest.fixture(scope="module")
def task():
    return ReasoningGymTask(RGTaskConfig(family="basic_arithmetic", pool_size=3000,
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


def test_greedy_is_fixed_and_sampling_varies(solver, questions):
    q = questions[0]
    assert _answers(solver, [q.text] * 3) == _answers(solver, [q.text] * 3)
    sampled = {c.text for c in _answers(solver, [q.text] * 40, SamplingParams(max_new_tokens=64, temperature=1.0))}
    assert len(sampled) > 1


def test_unknown_prompt_gets_a_confused_reply(solver):
    assert _answers(solver, ["What is the capital of nowhere?"])[0].text == CONFUSED


def test_format_follows_the_table(solver, questions):
    """Share of replies in the demanded format: about format_stated for the bare question, about
    format_stressed when the prompt insists, about format_suppressed when it asks for plain text."""
    b = Behaviour()
    bare = _answers(solver, [q.text for q in questions])
    stressed = _answers(solver, [q.text + "\n\nAnswer exactly in the format asked above." for q in questions])
    plain = _answers(solver, [q.text + "\n\nAnswer in plain text, no formatting." for q in questions])
    # "bare" accepts any reply as its format, so only the delimited formats can tell.
    rate = lambda outs: statistics.fmean(_in_format(q, c.text) for q, c in zip(questions, outs)  # noqa: E731
                                         if q.payload.format != "bare")
    assert abs(rate(bare) - b.format_stated) < 0.1
    assert abs(rate(stressed) - b.format_stressed) < 0.05
    assert rate(plain) < b.format_suppressed + 0.05


def test_scores_through_reasoning_gyms_scorer_rise_with_reasoning_and_room(task, solver, questions):
    def mean_score(suffix, max_new_tokens):
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        outs = _answers(solver, [q.text + suffix for q in questions], sp)
        return statistics.fmean(task.score(c.text, q).value for q, c in zip(questions, outs)), outs

    bare, _ = mean_score("", 64)
    stressed, _ = mean_score("\n\nAnswer exactly in the format asked above.", 64)
    reasoning, _ = mean_score("\n\nThink step by step, then answer in the format asked above.", 512)
    truncated, outs = mean_score("\n\nThink step by step, then answer in the format asked above.", 32)
    assert 0.1 < bare < stressed < reasoning
    assert truncated == 0.0 and all(c.finish_reason == "length" for c in outs)


def test_wrong_answers_are_near_misses_that_score_below_one(task, solver, questions):
    outs = _answers(solver, [q.text + "\n\nAnswer exactly in the format asked above." for q in questions])
    wrong = [(q, c.text) for q, c in zip(questions, outs) if task.score(c.text, q).value < 1.0]
    assert wrong
    for q, text in wrong[:40]:
        got = FORMATS[q.payload.format].extract(text)
        if got is not None and q.payload.format != "bare":  # "bare" reads a sentence as the answer.
            assert got != str(q.payload.entry["answer"])
            assert len(got) <= len(str(q.payload.entry["answer"])) + 3  # A near miss, not noise.


def test_majority_vote_of_samples_beats_one_sample(task, solver, questions):
    """At temperature > 0 samples are independent, so voting helps where a question is answered
    right more often than not."""
    prompt = lambda q: q.text + "\n\nAnswer exactly in the format asked above."  # noqa: E731
    sp = SamplingParams(max_new_tokens=64, temperature=0.7)
    single, voted = [], []
    for q in questions[:120]:
        texts = [c[0].text for c in solver.generate([prompt(q)] * 7, sp)]
        single.append(task.score(texts[0], q).value)
        voted.append(task.score(max(set(texts), key=texts.count), q).value)
    assert statistics.fmean(voted) > statistics.fmean(single) + 0.03


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


def test_run_outputs_say_the_solver_is_simulated():
    from hljax.tasks.simulated_solver import LABEL

    assert "stand-in for an LLM" in LABEL
    assert dataclasses.is_dataclass(Behaviour)
