"""Multi-hop QA tasks: HotpotQA (distractor), MuSiQue-Ans and 2WikiMultihopQA from their official files.

Each reader turns one official file into `QARecord`s and fails with the file, the record and the
field when the schema does not match. Nothing is downloaded: the files are given in the config,
and a missing one raises an error naming the expected official files and where they are published.
A harness sees only the question text; its paragraphs are reachable through `retrieve(query, k)`
(BM25 over that question's own paragraphs), and its answer is scored by exact match (or F1)
against the gold answer and its aliases.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Callable, Literal, Mapping

from hljax.harness import seeds
from hljax.harness.contract import RETRIEVE, ToolSpec
from sandbox.results import ScorerSpec
from hljax.tasks.base import Question, Score, Suite
from hljax.tasks.qa_metrics import best_over_golds, f1_score
from hljax.tasks.scorers import qa_spec, score_qa
from hljax.tasks.retrieval import BM25Retriever, Paragraph
from hljax.tasks.splits import QuestionSplits, SplitConfig, SplitQuestions, hash_ordered, question_id

Dataset = Literal["hotpotqa", "musique", "2wikimultihopqa"]
_MAX_CACHED_INDEXES = 1024  # BM25 indexes kept per task (see MultiHopQATask._retriever).
Metric = Literal["em", "f1"]


@dataclasses.dataclass(frozen=True)
class QARecord:
    """One question of a multi-hop QA file, in a schema-independent form."""

    id: str  # The dataset's own id (`_id` or `id`).
    question: str
    answer: str
    aliases: tuple[str, ...]  # Other accepted answers (MuSiQue answer_aliases, 2Wiki id_aliases).
    paragraphs: tuple[Paragraph, ...]
    kind: str  # HotpotQA/2Wiki `type` (bridge, comparison, ...); MuSiQue's hop count prefix (2hop, ...).


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the reader of one dataset expects and the dataset's scoring rule."""

    title: str
    files: str  # The official file names, for error messages.
    url: str  # Where the dataset is published.
    yes_no_rule: bool  # The official F1 gives no partial credit around yes/no (qa_metrics).


SPECS: dict[str, DatasetSpec] = {
    "hotpotqa": DatasetSpec(
        "HotpotQA (distractor setting)",
        "hotpot_train_v1.1.json or hotpot_dev_distractor_v1.json (a JSON list)",
        "https://hotpotqa.github.io/",
        yes_no_rule=True,
    ),
    "musique": DatasetSpec(
        "MuSiQue-Ans",
        "musique_ans_v1.0_train.jsonl or musique_ans_v1.0_dev.jsonl (JSON lines)",
        "https://github.com/StonyBrookNLP/musique (data via its download_data.sh)",
        yes_no_rule=False,
    ),
    "2wikimultihopqa": DatasetSpec(
        "2WikiMultihopQA",
        "train.json or dev.json (a JSON list; the data_ids release adds answer_id), aliases in id_aliases.json",
        "https://github.com/Alab-NII/2wikimultihop",
        yes_no_rule=True,
    ),
}


@dataclasses.dataclass(frozen=True)
class QATaskConfig:
    """One multi-hop QA dataset file as a task."""

    dataset: Dataset
    path: str  # The official file (see SPECS[dataset].files).
    # 2WikiMultihopQA only: its id_aliases.json (JSON lines of {"Q_id", "aliases", "demonyms"}).
    # None scores against the gold answer alone.
    aliases_path: str | None = None
    metric: Metric = "em"  # The task's score: exact match (the paper's QA measure) or token F1.
    splits: SplitConfig = SplitConfig()

    def __post_init__(self):
        if self.dataset not in SPECS:
            raise ValueError(f"unknown QA dataset {self.dataset!r}; valid: {sorted(SPECS)}")
        if self.aliases_path is not None and self.dataset != "2wikimultihopqa":
            raise ValueError(f"aliases_path is for 2wikimultihopqa only, not {self.dataset}")
        if self.metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {self.metric!r}")


# ----- readers ---------------------------------------------------------------------------------


def _open(path: str, dataset: str, what: str = "data file"):
    if not os.path.isfile(path):
        spec = SPECS[dataset]
        raise FileNotFoundError(
            f"{spec.title} {what} not found: {path!r}. Expected the official file(s): {spec.files}. "
            f"The dataset is published at {spec.url}; download it there and set the path in the config."
        )
    return open(path, encoding="utf-8")


def _field(record: Mapping[str, Any], name: str, kind: type, where: str):
    if not isinstance(record, Mapping) or name not in record:
        raise ValueError(f"{where}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {name!r} should be {kind.__name__}, got {type(value).__name__}")
    return value


def _context_paragraphs(context: list, supporting_facts: list, where: str) -> tuple[Paragraph, ...]:
    """HotpotQA-style `context` [[title, [sentence, ...]], ...] as paragraphs."""
    supporting = {fact[0] for fact in supporting_facts if isinstance(fact, list) and fact}
    paragraphs = []
    for i, item in enumerate(context):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], list)):
            raise ValueError(f"{where}: context[{i}] should be [title, [sentences]]")
        title, sentences = item
        # HotpotQA sentences carry their own leading spaces, 2Wiki's do not: join, then tidy.
        text = " ".join(" ".join(str(s) for s in sentences).split())
        paragraphs.append(Paragraph(title, text, title in supporting))
    return tuple(paragraphs)


def read_hotpotqa(path: str) -> list[QARecord]:
    """HotpotQA distractor-setting JSON: `_id, question, answer, type, level, supporting_facts, context`."""
    with _open(path, "hotpotqa") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    records = []
    for n, r in enumerate(data):
        where = f"{path}: record {n}"
        records.append(
            QARecord(
                id=_field(r, "_id", str, where),
                question=_field(r, "question", str, where),
                answer=_field(r, "answer", str, where),
                aliases=(),
                paragraphs=_context_paragraphs(
                    _field(r, "context", list, where), _field(r, "supporting_facts", list, where), where
                ),
                kind=_field(r, "type", str, where),
            )
        )
    return records


def read_musique(path: str) -> list[QARecord]:
    """MuSiQue-Ans JSON lines: `id, question, answer, answer_aliases, answerable, paragraphs, ...`."""
    records = []
    with _open(path, "musique") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}: line {n + 1}"
            r = json.loads(line)
            if not _field(r, "answerable", bool, where):
                raise ValueError(f"{where}: unanswerable question; only MuSiQue-Ans (all answerable) is supported")
            paragraphs = []
            for i, p in enumerate(_field(r, "paragraphs", list, where)):
                pw = f"{where}: paragraphs[{i}]"
                paragraphs.append(
                    Paragraph(
                        _field(p, "title", str, pw),
                        _field(p, "paragraph_text", str, pw),
                        _field(p, "is_supporting", bool, pw),
                    )
                )
            qid = _field(r, "id", str, where)
            records.append(
                QARecord(
                    id=qid,
                    question=_field(r, "question", str, where),
                    answer=_field(r, "answer", str, where),
                    aliases=tuple(str(a) for a in _field(r, "answer_aliases", list, where)),
                    paragraphs=tuple(paragraphs),
                    kind=qid.split("__")[0],
                )
            )
    return records


def read_2wiki_aliases(path: str) -> dict[str, tuple[str, ...]]:
    """id_aliases.json (JSON lines): Wikidata id -> its aliases and demonyms, as the official scorer uses."""
    aliases = {}
    with _open(path, "2wikimultihopqa", what="aliases file") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}: line {n + 1}"
            r = json.loads(line)
            names = _field(r, "aliases", list, where) + _field(r, "demonyms", list, where)
            aliases[_field(r, "Q_id", str, where)] = tuple(str(a) for a in names)
    return aliases


def read_2wiki(path: str, aliases_path: str | None) -> list[QARecord]:
    """2WikiMultihopQA JSON: `_id, type, question, context, supporting_facts, evidences, answer[, answer_id]`.

    Gold answers are the answer plus, when the record has an `answer_id` (the data_ids release)
    found in the aliases file, that entity's aliases and demonyms, as in the official v1.1 scorer.
    """
    aliases = read_2wiki_aliases(aliases_path) if aliases_path is not None else {}
    with _open(path, "2wikimultihopqa") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    records = []
    for n, r in enumerate(data):
        where = f"{path}: record {n}"
        _field(r, "evidences", list, where)  # Schema check: present in train and dev.
        answer_id = r.get("answer_id")  # Only in the data_ids release, and null for most comparisons.
        records.append(
            QARecord(
                id=_field(r, "_id", str, where),
                question=_field(r, "question", str, where),
                answer=_field(r, "answer", str, where),
                aliases=aliases.get(answer_id, ()) if isinstance(answer_id, str) else (),
                paragraphs=_context_paragraphs(
                    _field(r, "context", list, where), _field(r, "supporting_facts", list, where), where
                ),
                kind=_field(r, "type", str, where),
            )
        )
    return records


def read_records(config: QATaskConfig) -> list[QARecord]:
    """The records of the configured file; ValueError if two records share an id."""
    if config.dataset == "hotpotqa":
        records = read_hotpotqa(config.path)
    elif config.dataset == "musique":
        records = read_musique(config.path)
    else:
        records = read_2wiki(config.path, config.aliases_path)
    counts = collections.Counter(r.id for r in records)
    repeated = [i for i, c in counts.items() if c > 1]
    if repeated:
        raise ValueError(f"{config.path}: repeated question ids {repeated[:5]}")
    return records


# ----- the task --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QAPayload:
    """What the scorer and `retrieve` need for one question."""

    golds: tuple[str, ...]  # The answer first, then its aliases.
    paragraphs: tuple[Paragraph, ...]
    kind: str


_DESCRIPTION = """\
Multi-hop question answering on {title}. Each question needs facts from two or more Wikipedia \
paragraphs; every question comes with its own small set of paragraphs ({paragraphs}), some of which \
are distractors. The harness receives only the question text; the paragraphs are reachable only \
through retrieve(query, k), a BM25 search over that question's paragraphs. The harness returns a \
short answer string (a name, date, number, or yes/no), graded by {metric} against the gold answer \
and its aliases after normalisation (lowercase, no punctuation, no articles a/an/the)."""


class MultiHopQATask(SplitQuestions):
    """One multi-hop QA file: questions in hashed order, splits, EM/F1 scorer and the BM25 tool."""

    def __init__(self, config: QATaskConfig):
        self.config = config
        self._spec = SPECS[config.dataset]
        self._records = tuple(read_records(config))
        self._by_source_id = {r.id: self._question(r) for r in self._records}
        ordered = hash_ordered(self._by_source_id.values(), config.splits.seed)
        self._splits = QuestionSplits(ordered, config.splits, self.name)
        self._retrievers: collections.OrderedDict[str, BM25Retriever] = collections.OrderedDict()

    @property
    def name(self) -> str:
        return self.config.dataset

    @property
    def records(self) -> tuple[QARecord, ...]:
        return self._records

    @property
    def description(self) -> str:
        sizes = sorted(len(r.paragraphs) for r in self._records)
        paragraphs = f"about {sizes[len(sizes) // 2]}" if sizes else "none"
        metric = "exact match" if self.config.metric == "em" else "token F1"
        return _DESCRIPTION.format(title=self._spec.title, paragraphs=paragraphs, metric=metric)

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return (RETRIEVE,)

    def question(self, source_id: str) -> Question:
        """The question with the dataset's own id `source_id` (`_id` or `id`), whatever its split."""
        return self._by_source_id[source_id]

    def score(self, answer: str, question: Question) -> Score:
        return score_qa(self.config.metric, self._spec.yes_no_rule, answer, self.score_payload(question))

    def scorer_spec(self) -> ScorerSpec:
        return qa_spec(self.config.metric, self._spec.yes_no_rule)

    def score_payload(self, question: Question) -> tuple[str, ...]:
        return tuple(question.payload.golds)

    def f1(self, answer: str, question: Question) -> float:
        """Token F1 with the dataset's own yes/no rule, whatever the configured metric."""
        rule = self._spec.yes_no_rule
        return best_over_golds(lambda p, g: f1_score(p, g, yes_no_rule=rule), answer, question.payload.golds)

    def tools(self, question: Question) -> Mapping[str, Callable[..., Any]]:
        return {"retrieve": self._retriever(question).retrieve}

    def _retriever(self, question: Question) -> BM25Retriever:
        # Indexes are built on first use and a bounded number kept: candidates of one round query
        # the same questions again and again, but a whole training run touches thousands.
        retriever = self._retrievers.pop(question.qid, None)
        if retriever is None:
            retriever = BM25Retriever(question.payload.paragraphs)
        self._retrievers[question.qid] = retriever
        if len(self._retrievers) > _MAX_CACHED_INDEXES:
            self._retrievers.popitem(last=False)
        return retriever

    def _question(self, record: QARecord) -> Question:
        return Question(
            qid=question_id(self.name, record.id),
            text=record.question,
            answer=record.answer,
            payload=QAPayload(golds=(record.answer, *record.aliases), paragraphs=record.paragraphs, kind=record.kind),
        )



def build_suite(spec, splits: SplitConfig, seed: int) -> list[MultiHopQATask]:
    """One task per `tasks.qa_files` entry ('dataset:path')."""
    if not spec.qa_files:
        raise ValueError("tasks.qa_files must name at least one dataset:path for the multihop_qa suite")
    tasks = []
    for entry in spec.qa_files:
        name, sep, path = entry.partition(":")
        if not sep:
            raise ValueError(f"tasks.qa_files entry {entry!r} must be 'dataset:path'")
        aliases = spec.qa_aliases or None if name == "2wikimultihopqa" else None
        tasks.append(MultiHopQATask(QATaskConfig(dataset=name, path=path, splits=splits, aliases_path=aliases)))
    return tasks


SUITE = Suite("multihop_qa", build_suite, seeds.load("multihop_qa"))
