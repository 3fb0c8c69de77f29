"""Multi-hop QA readers on hand-written fixtures in the official schemas, scoring, retrieval and splits."""

import dataclasses
import json
from pathlib import Path

import pytest

from hljax.tasks.base import SPLITS
from hljax.tasks.multihop_qa import MultiHopQATask, QATaskConfig, read_2wiki, read_hotpotqa, read_musique
from hljax.tasks.splits import SplitConfig, SplitExhausted

DATA = Path(__file__).parent / "data"
HOTPOT = str(DATA / "hotpotqa_distractor_sample.json")
MUSIQUE = str(DATA / "musique_ans_sample.jsonl")
TWOWIKI = str(DATA / "2wikimultihopqa_sample.json")
ALIASES = str(DATA / "2wikimultihopqa_id_aliases.json")
SMALL = SplitConfig(feedback_size=1, scoring_size=0, eval_size=0)


def by_id(records):
    return {r.id: r for r in records}


def test_hotpotqa_reader():
    records = by_id(read_hotpotqa(HOTPOT))
    assert len(records) == 4
    r = records["fx0000000000000000000001"]
    assert r.answer == "Porto Velho" and r.kind == "bridge" and r.aliases == ()
    assert [p.title for p in r.paragraphs][:2] == ["The Salt Lantern", "Ilda Marques"]
    # Sentences joined, the leading spaces of HotpotQA sentences tidied.
    assert r.paragraphs[1].text == (
        "Ilda Marques (1889-1960) was a composer and pianist. She was born in Porto Velho and studied in Paris."
    )
    assert [p.is_supporting for p in r.paragraphs] == [True, True, False, False, False]


def test_musique_reader():
    records = by_id(read_musique(MUSIQUE))
    assert len(records) == 3
    r = records["3hop1__2001_2002_2003"]
    assert r.answer == "euro" and r.aliases == ("EUR", "Euro currency") and r.kind == "3hop1"
    assert [p.is_supporting for p in r.paragraphs] == [True, True, True, False]
    assert r.paragraphs[0].text == "The Tin Knight is a novel written by Rafael Ortega."


def test_2wiki_reader_adds_aliases_by_answer_id():
    records = by_id(read_2wiki(TWOWIKI, ALIASES))
    assert len(records) == 3
    assert records["fx2w000000000000000000a1"].aliases == ("Republic of Veloria", "Velorian Republic", "Velorian")
    assert records["fx2w000000000000000000a2"].aliases == ()  # answer_id is null.
    assert records["fx2w000000000000000000a3"].kind == "bridge_comparison"
    assert read_2wiki(TWOWIKI, None)[0].aliases == ()
    r = records["fx2w000000000000000000a1"]
    assert r.paragraphs[0].text == "The Glass Orchard is a 1998 drama film. It was directed by Mira Castell."


@pytest.mark.parametrize(
    "dataset, names",
    [
        ("hotpotqa", ["hotpot_dev_distractor_v1.json", "https://hotpotqa.github.io/"]),
        ("musique", ["musique_ans_v1.0_dev.jsonl", "github.com/StonyBrookNLP/musique"]),
        ("2wikimultihopqa", ["dev.json", "id_aliases.json", "github.com/Alab-NII/2wikimultihop"]),
    ],
)
def test_missing_file_names_the_official_files_and_where_to_get_them(tmp_path, dataset, names):
    with pytest.raises(FileNotFoundError) as e:
        MultiHopQATask(QATaskConfig(dataset, str(tmp_path / "nope.json")))
    for name in names:
        assert name in str(e.value)
    if dataset == "2wikimultihopqa":
        with pytest.raises(FileNotFoundError, match="aliases file not found"):
            MultiHopQATask(QATaskConfig(dataset, TWOWIKI, aliases_path=str(tmp_path / "id_aliases.json")))


def test_schema_errors_name_the_record_and_field(tmp_path):
    bad = json.loads(Path(HOTPOT).read_text())
    del bad[2]["answer"]
    path = tmp_path / "h.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="record 2: missing field 'answer'"):
        read_hotpotqa(str(path))
    lines = Path(MUSIQUE).read_text().splitlines()
    record = json.loads(lines[1])
    record["answerable"] = False
    path = tmp_path / "m.jsonl"
    path.write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="line 2: unanswerable"):
        read_musique(str(path))
    with pytest.raises(ValueError, match="2wikimultihopqa only"):
        QATaskConfig("hotpotqa", HOTPOT, aliases_path=ALIASES)


def task_for(dataset, path, metric="em", aliases=None):
    return MultiHopQATask(QATaskConfig(dataset, path, aliases_path=aliases, metric=metric, splits=SMALL))


def test_hotpotqa_scoring_em_f1_and_yes_no():
    em, f1 = task_for("hotpotqa", HOTPOT), task_for("hotpotqa", HOTPOT, metric="f1")
    q = em.question("fx0000000000000000000001")
    assert em.score("Porto Velho.", q).value == 1.0
    assert em.score("Velho", q).value == 0.0
    assert f1.score("Velho", f1.question("fx0000000000000000000001")).value == pytest.approx(2 / 3)
    yes = em.question("fx0000000000000000000002")
    assert em.score("Yes", yes).value == 1.0 and em.score("yes, both", yes).value == 0.0
    assert f1.score("yes, both", f1.question("fx0000000000000000000002")).value == 0.0  # The yes/no rule.
    first = em.question("fx0000000000000000000003")  # Gold: "the Halvorsen Institute".
    assert em.score("Halvorsen Institute", first).value == 1.0


def test_musique_aliases_and_no_yes_no_rule():
    task = task_for("musique", MUSIQUE)
    q = task.question("3hop1__2001_2002_2003")
    assert [task.score(a, q).value for a in ("EUR", "Euro", "the euro currency", "dollar")] == [1.0, 1.0, 1.0, 0.0]
    sea = task.question("2hop__3001_3002")
    assert task.score("The Baltic", sea).value == 1.0
    assert task.f1("Baltic", sea) == 1.0  # Against the alias "the Baltic".


def test_2wiki_aliases_from_id_aliases_file():
    with_aliases = task_for("2wikimultihopqa", TWOWIKI, aliases=ALIASES)
    without = task_for("2wikimultihopqa", TWOWIKI)
    src = "fx2w000000000000000000a1"
    assert with_aliases.score("Velorian", with_aliases.question(src)).value == 1.0
    assert with_aliases.score("the Republic of Veloria", with_aliases.question(src)).value == 1.0
    assert without.score("Velorian", without.question(src)).value == 0.0
    assert without.score("Veloria", without.question(src)).value == 1.0
    no = with_aliases.question("fx2w000000000000000000a3")
    assert with_aliases.f1("no, they differ", no) == 0.0  # 2Wiki keeps HotpotQA's yes/no rule.


def test_harness_sees_only_the_question_and_retrieve_finds_the_right_paragraphs():
    task = task_for("hotpotqa", HOTPOT)
    q = task.question("fx0000000000000000000001")
    assert q.text == "In which city was the composer of the opera The Salt Lantern born?"
    assert q.answer == "Porto Velho" and "Porto Velho" not in q.text
    assert [t.name for t in task.tool_specs] == list(task.tools(q)) == ["retrieve"]
    retrieve = task.tools(q)["retrieve"]
    hits = retrieve("composer of the opera The Salt Lantern", 2)
    assert hits[0] == {"title": "The Salt Lantern", "text": q.payload.paragraphs[0].text}
    assert len(hits) == 2
    assert retrieve("Ilda Marques born", 1)[0]["title"] == "Ilda Marques"
    assert retrieve("zeppelin quasar", 3) == []  # No shared word: nothing, rather than noise.
    assert len(retrieve("the", 3)) == 0  # Stop words only.
    assert len(retrieve("Porto Velho", 50)) == 2  # k above the paragraph count is fine.
    for bad in [(None, 3), ("x", 0), ("x", True), ("x", 2.5)]:
        with pytest.raises((TypeError, ValueError)):
            retrieve(*bad)
    # Each question searches only its own paragraphs.
    other = task.tools(task.question("fx0000000000000000000004"))["retrieve"]
    assert other("Salt Lantern opera", 5) == []


def test_description_mentions_dataset_tool_and_metric():
    d = task_for("musique", MUSIQUE).description
    assert "MuSiQue-Ans" in d and "retrieve(query, k)" in d and "exact match" in d


def synthetic_file(tmp_path, dataset, n):
    """n questions in the official schema of `dataset` (only shapes matter for splits)."""
    if dataset == "musique":
        path = tmp_path / "musique_ans_v1.0_train.jsonl"
        lines = [
            json.dumps(
                {
                    "id": f"2hop__{i}_{i + 1}",
                    "paragraphs": [{"idx": 0, "title": f"T{i}", "paragraph_text": f"fact {i}", "is_supporting": True}],
                    "question": f"Question number {i}?",
                    "question_decomposition": [],
                    "answer": str(i),
                    "answer_aliases": [],
                    "answerable": True,
                }
            )
            for i in range(n)
        ]
        path.write_text("\n".join(lines) + "\n")
        return str(path)
    record = lambda i: {  # noqa: E731
        "_id": f"id{i:08d}",
        "question": f"Question number {i}?",
        "answer": str(i),
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [[f"T{i}", 0]],
        "context": [[f"T{i}", [f"fact {i}"]]],
        "evidences": [],
    }
    path = tmp_path / f"{dataset}.json"
    path.write_text(json.dumps([record(i) for i in range(n)]))
    return str(path)


@pytest.mark.parametrize("dataset", ["hotpotqa", "musique", "2wikimultihopqa"])
def test_splits_over_thousands_of_questions(tmp_path, dataset):
    path = synthetic_file(tmp_path, dataset, 4500)
    cfg = SplitConfig(seed=9, feedback_size=1000, scoring_size=1000, eval_size=1000)
    task = MultiHopQATask(QATaskConfig(dataset, path, splits=cfg))
    got = {s: [q.qid for q in task.questions(s)] for s in SPLITS}
    sets = {s: set(v) for s, v in got.items()}
    assert [len(sets[s]) for s in SPLITS] == [1000, 1000, 1000]
    assert not sets["feedback"] & sets["scoring"] and not sets["feedback"] & sets["eval"]
    assert not sets["scoring"] & sets["eval"]
    texts = {s: {q.text for q in task.questions(s)} for s in SPLITS}
    assert not texts["feedback"] & texts["scoring"] and not texts["scoring"] & texts["eval"]
    # Same seed, same splits; one size changed, the others unmoved.
    again = MultiHopQATask(QATaskConfig(dataset, path, splits=cfg))
    assert [q.qid for q in again.questions("eval")] == got["eval"]
    resized = MultiHopQATask(QATaskConfig(dataset, path, splits=dataclasses.replace(cfg, scoring_size=100)))
    assert [q.qid for q in resized.questions("eval")] == got["eval"]
    assert [q.qid for q in resized.questions("feedback")] == got["feedback"]
    assert [q.qid for q in resized.questions("scoring")] == got["scoring"][:100]
    # Every question of the file lands in exactly one split.
    every = [task.question(r.id) for r in task.records]
    counts = {sp: sum(cfg.split_of(q.qid) == sp for q in every) for sp in SPLITS}
    assert sum(counts.values()) == 4500
    for sp in SPLITS:
        assert len(task.take(sp, counts[sp])) == counts[sp]
        with pytest.raises(SplitExhausted):
            task.take(sp, counts[sp] + 1)


def test_file_order_does_not_change_the_splits(tmp_path):
    path = synthetic_file(tmp_path, "hotpotqa", 600)
    records = json.loads(Path(path).read_text())
    reversed_path = tmp_path / "reversed.json"
    reversed_path.write_text(json.dumps(records[::-1]))
    cfg = SplitConfig(seed=1, feedback_size=100, scoring_size=100, eval_size=100)
    a = MultiHopQATask(QATaskConfig("hotpotqa", path, splits=cfg))
    b = MultiHopQATask(QATaskConfig("hotpotqa", str(reversed_path), splits=cfg))
    for s in SPLITS:
        assert [q.qid for q in a.questions(s)] == [q.qid for q in b.questions(s)]


def test_repeated_ids_in_a_file_are_an_error(tmp_path):
    records = json.loads(Path(HOTPOT).read_text())
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(records + records[:1]))
    with pytest.raises(ValueError, match="repeated question ids"):
        MultiHopQATask(QATaskConfig("hotpotqa", str(path)))
