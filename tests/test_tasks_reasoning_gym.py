"""Reasoning Gym families: the registry checks, every listed family in every format, splits on a real family."""

import dataclasses
import json
import os

import pytest
import reasoning_gym

from hljax.tasks import rg_families
from hljax.tasks.base import SPLITS, guarded
from hljax.tasks.formats import FORMATS
from hljax.tasks.reasoning_gym import FamilyLists, RGTaskConfig, ReasoningGymTask, category, family_tasks
from hljax.tasks.splits import SplitConfig

LISTS = FamilyLists.shipped()
ALL_FAMILIES = [f for role in ("sft", "rl", "heldout") for f in LISTS.families(role)]
WRONG = "definitely wrong 12345"


def test_config_has_the_papers_split_and_kinds_differ():
    assert (len(LISTS.sft), len(LISTS.rl), len(LISTS.heldout)) == (21, 5, 21)
    assert len(set(ALL_FAMILIES)) == 47
    training = {category(f) for f in LISTS.sft + LISTS.rl}
    held_out = {category(f) for f in LISTS.heldout}
    assert training == {"arithmetic", "algorithmic", "algebra"}
    assert not training & held_out
    assert LISTS.role("gcd") == "sft" and LISTS.role("simple_equations") == "rl" and LISTS.role("maze") == "heldout"


def lists(**changes):
    base = dict(sft=("gcd", "lcm"), rl=("chain_sum",), heldout=("maze",), excluded=(("boxnet", "no answer"),))
    return FamilyLists(**{**base, **changes})


def test_unknown_family_error_lists_valid_names():
    with pytest.raises(ValueError, match="unknown reasoning-gym families in the rl list: \\['gcdd'\\]") as e:
        lists(rl=("gcdd",))
    assert "'lcm'" in str(e.value) and "'boxnet'" not in str(e.value).split("valid names")[1]


def test_overlap_duplicate_excluded_and_kind_are_load_time_errors():
    with pytest.raises(ValueError, match="both the sft and heldout lists: \\['gcd'\\]"):
        lists(heldout=("maze", "gcd"))
    with pytest.raises(ValueError, match="twice"):
        lists(sft=("gcd", "gcd"))
    with pytest.raises(ValueError, match="excluded families in the heldout list: \\{'boxnet': 'no answer'\\}"):
        lists(heldout=("boxnet",))
    with pytest.raises(ValueError, match="share a reasoning-gym category"):
        lists(heldout=("maze", "products"))  # products is arithmetic, like gcd.
    with pytest.raises(ValueError, match="empty"):
        lists(rl=())
    with pytest.raises(ValueError, match="not reasoning-gym families: \\['boxnett'\\]"):
        lists(excluded=(("boxnett", "typo"),))


def test_config_excludes_what_facts_md_measured():
    for name in ("boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour", "game_of_life_halting"):
        assert name in rg_families.EXCLUDED
        assert name not in ALL_FAMILIES


@pytest.fixture(scope="module")
def tasks():
    cfg = RGTaskConfig("gcd", pool_size=500, splits=SplitConfig(feedback_size=2, scoring_size=2, eval_size=2))
    out = {}
    for role in ("sft", "rl", "heldout"):
        out.update(family_tasks(LISTS, role, cfg))
    return out


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_family_generates_and_scores_in_every_format(tasks, family):
    task = tasks[family]
    dataset = reasoning_gym.create_dataset(family, seed=0, size=500)
    for index in range(3):
        entry = dataset[index]
        for fmt in FORMATS:
            q = task.question_at(index, fmt)
            assert entry["question"].strip() in q.text and q.payload.format == fmt
            assert task.score(q.answer, q).value == 1.0, (family, fmt, q.answer)
            wrong = task.score(FORMATS[fmt].render(WRONG), q)
            assert wrong.value < 1.0
            # The task adds nothing to reasoning-gym's own verdict on the extracted answer.
            assert wrong == guarded(lambda: dataset.score_answer(WRONG, entry))
    assert len(list(task.questions("eval"))) == 2


def test_every_family_is_reproducible_whatever_the_access_order():
    # Splits and ids assume entry i depends only on (seed, i); list_functions broke this.
    for family in ALL_FAMILIES:
        a = reasoning_gym.create_dataset(family, seed=3, size=50)
        b = reasoning_gym.create_dataset(family, seed=3, size=50)
        forward = [a[i]["question"] for i in range(4)]
        backward = [b[i]["question"] for i in reversed(range(4))][::-1]
        assert forward == backward == [a[i]["question"] for i in range(4)], family


def test_format_not_followed_scores_zero_with_a_note(tasks):
    task = tasks["gcd"]
    q = task.question_at(0, "answer_tags")
    raw = q.payload.entry["answer"]
    assert task.score(raw, q).value == 0.0 and "answer_tags" in task.score(raw, q).note
    assert task.score(f"I think <answer>{raw}</answer>", q).value == 1.0
    bare = task.question_at(0, "bare")
    assert task.score(raw, bare).value == 1.0


def test_scorer_exception_scores_zero_as_a_scorer_error(tasks):
    task = tasks["prime_factorization"]
    q = task.question_at(0, "bare")
    with pytest.raises(ValueError):  # reasoning-gym's own scorer raises on untrusted text.
        task._dataset.score_answer("seven", dict(q.payload.entry))
    score = task.score("seven", q)
    assert score.value == 0.0 and "ValueError" in score.error


def test_question_ids_ignore_the_format_and_text_holds_no_reference(tasks):
    task = tasks["word_sorting"]
    qs = [task.question_at(5, fmt) for fmt in FORMATS]
    assert len({q.qid for q in qs}) == 1
    assert len({q.text for q in qs}) == len(FORMATS)
    for q in qs:
        assert q.answer not in q.text  # The rendered reference (e.g. <answer>...</answer>) is not shown.


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_family_has_disjoint_splits(family):
    splits = SplitConfig(seed=4, feedback_size=200, scoring_size=200, eval_size=200)
    task = ReasoningGymTask(RGTaskConfig(family, pool_size=5000, splits=splits))
    texts = {s: {q.payload.entry["question"] for q in task.questions(s)} for s in SPLITS}
    assert [len(texts[s]) for s in SPLITS] == [200, 200, 200]
    assert not texts["feedback"] & texts["scoring"]
    assert not texts["feedback"] & texts["eval"]
    assert not texts["scoring"] & texts["eval"]


def test_real_family_splits_are_disjoint_reproducible_and_size_independent():
    splits = SplitConfig(seed=11, feedback_size=1000, scoring_size=1000, eval_size=1000)
    a = ReasoningGymTask(RGTaskConfig("chain_sum", pool_size=5000, splits=splits))
    got = {s: list(a.questions(s)) for s in SPLITS}
    qids = {s: {q.qid for q in got[s]} for s in SPLITS}
    texts = {s: {q.payload.entry["question"] for q in got[s]} for s in SPLITS}
    for s in SPLITS:
        assert len(qids[s]) == len(texts[s]) == 1000
    for x, y in [("feedback", "scoring"), ("feedback", "eval"), ("scoring", "eval")]:
        assert not qids[x] & qids[y] and not texts[x] & texts[y]
    b = ReasoningGymTask(RGTaskConfig("chain_sum", pool_size=5000, splits=splits))
    assert [q.text for q in b.questions("eval")] == [q.text for q in got["eval"]]
    c = ReasoningGymTask(
        RGTaskConfig("chain_sum", pool_size=5000, splits=dataclasses.replace(splits, feedback_size=20, eval_size=1200))
    )
    assert [q.qid for q in c.questions("scoring")] == [q.qid for q in got["scoring"]]
    assert [q.qid for q in c.questions("eval")][:1000] == [q.qid for q in got["eval"]]
    assert [q.qid for q in c.questions("feedback")] == [q.qid for q in got["feedback"]][:20]


def test_description_names_the_family_and_shows_a_feedback_question(tasks):
    task = tasks["maze"]
    assert 'family "maze" (category: games)' in task.description
    assert "<answer></answer> tags, after 'Final answer:', inside \\boxed{}" in task.description
    bare = ReasoningGymTask(RGTaskConfig("maze", formats=("bare",)))
    assert "the final answer must be written as the whole reply, as each question says." in bare.description
    assert next(task.questions("feedback")).text in task.description
    assert task.tool_specs == () and task.tools(next(task.questions("feedback"))) == {}


def test_task_config_is_checked():
    with pytest.raises(ValueError, match="unknown reasoning-gym family"):
        RGTaskConfig("gcdd")
    with pytest.raises(ValueError, match="unknown answer formats"):
        RGTaskConfig("gcd", formats=("xml",))


def test_every_listed_familys_questions_are_the_same_in_every_process():
    """Python's string hashes differ per process (PYTHONHASHSEED): a family whose generator follows
    them (isomorphic_strings, ransom_note, word_ladder: excluded) would split and score differently
    in a resumed run, an evaluation or a subprocess. Two processes with different hash seeds must agree."""
    import subprocess
    import sys

    code = ("import hashlib, json, reasoning_gym\n"
            "from hljax.tasks import rg_families\n"
            "out = {}\n"
            "for f in rg_families.SFT + rg_families.RL + rg_families.HELDOUT:\n"
            "    ds = reasoning_gym.create_dataset(f, seed=0, size=20)\n"
            "    rows = [(ds[i]['question'], str(ds[i]['answer'])) for i in range(20)]\n"
            "    out[f] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()\n"
            "print(json.dumps(out))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digests = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert [f for f in digests[0] if digests[0][f] != digests[1][f]] == []


def test_train_role_is_the_sft_and_rl_lists_and_never_a_held_out_family():
    from hljax.config import TaskSpec
    from hljax.tasks.reasoning_gym import build_suite

    suite = build_suite(TaskSpec(role="train"), SplitConfig(feedback_size=2, scoring_size=2, eval_size=2), seed=0)
    names = [t.config.family for t in suite]
    assert names == list(rg_families.SFT) + list(rg_families.RL)
    assert not set(names) & set(rg_families.HELDOUT)
    picked = build_suite(TaskSpec(role="train", families=("gcd", "simple_equations")), SplitConfig(), seed=0)
    assert [t.config.family for t in picked] == ["gcd", "simple_equations"]
    with pytest.raises(ValueError, match="\\['maze'\\] are not in the 'train' list"):
        build_suite(TaskSpec(role="train", families=("maze",)), SplitConfig(), seed=0)
