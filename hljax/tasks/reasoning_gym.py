"""Reasoning Gym families as tasks: the SFT / RL / held-out family registry and the per-family task.

Questions come from reasoning-gym's own generators and are scored by its own `score_answer`; this
module adds only the format variation (formats.py), the splits (splits.py) and a guard around the
scorer, because some scorers raise on untrusted text (prime_factorization on a non-number).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Literal, Mapping

import reasoning_gym
from reasoning_gym.factory import DATASETS

from hljax.harness import seeds
from hljax.harness.contract import ToolSpec
from hljax.tasks import rg_families
from sandbox.results import ScorerSpec
from hljax.tasks.base import Question, Score, Suite
from hljax.tasks.formats import FORMATS, check_format_names, choose_format, render_question
from hljax.tasks.scorers import reasoning_gym_spec, score_reasoning_gym
from hljax.tasks.splits import QuestionSplits, SplitConfig, SplitQuestions, question_id

Role = Literal["sft", "rl", "heldout"]
ROLES: tuple[Role, ...] = ("sft", "rl", "heldout")


def category(family: str) -> str:
    """reasoning-gym's own category of a family: the package its generator lives in."""
    return DATASETS[family][0].__module__.split(".")[1]


@dataclasses.dataclass(frozen=True)
class FamilyLists:
    """The family registry: which families train the proposer (SFT, RL) and which are held out.

    Checked on construction: every name is a reasoning-gym family and not excluded, no family is
    in two lists, and no reasoning-gym category has families both in training and held out.
    """

    sft: tuple[str, ...]
    rl: tuple[str, ...]
    heldout: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...] = ()  # (family, why it is unfit), from the config file.

    def __post_init__(self):
        excluded = dict(self.excluded)
        stale = sorted(n for n in excluded if n not in DATASETS)
        if stale:
            raise ValueError(f"excluded names that are not reasoning-gym families: {stale}")
        valid = sorted(n for n in DATASETS if n not in excluded)
        for role in ROLES:
            names = self.families(role)
            if not names:
                raise ValueError(f"the {role} family list is empty")
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"the {role} list names these families twice: {repeated}")
            unknown = [n for n in names if n not in DATASETS]
            if unknown:
                raise ValueError(f"unknown reasoning-gym families in the {role} list: {unknown}; valid names: {valid}")
            unfit = {n: excluded[n] for n in names if n in excluded}
            if unfit:
                raise ValueError(f"excluded families in the {role} list: {unfit}")
        for i, a in enumerate(ROLES):
            for b in ROLES[i + 1 :]:
                both = sorted(set(self.families(a)) & set(self.families(b)))
                if both:
                    raise ValueError(f"families in both the {a} and {b} lists: {both}")
        training = {category(n) for n in self.sft + self.rl}
        shared = sorted(n for n in self.heldout if category(n) in training)
        if shared:
            raise ValueError(
                f"held-out families share a reasoning-gym category with training families: "
                f"{[(n, category(n)) for n in shared]}; held-out families must differ in kind"
            )

    @classmethod
    def shipped(cls) -> FamilyLists:
        """The lists of hljax/tasks/rg_families.py."""
        return cls(sft=rg_families.SFT, rl=rg_families.RL, heldout=rg_families.HELDOUT,
                   excluded=tuple(sorted(rg_families.EXCLUDED.items())))

    def families(self, role: Role | Literal["train"]) -> tuple[str, ...]:
        """A list's families; "train": every family the proposer may train on, SFT's then RL's."""
        return {"sft": self.sft, "rl": self.rl, "heldout": self.heldout, "train": self.sft + self.rl}[role]

    def role(self, family: str) -> Role:
        for r in ROLES:
            if family in self.families(r):
                return r
        raise KeyError(f"{family!r} is in no family list")


@dataclasses.dataclass(frozen=True)
class RGTaskConfig:
    """One Reasoning Gym family as a task."""

    family: str
    generator_seed: int = 0  # reasoning-gym dataset seed; question i comes from Random(seed + i).
    # Generator indices drawn at most; a split that runs out of distinct questions before its size
    # is reached raises SplitExhausted rather than scanning forever.
    pool_size: int = 20_000
    formats: tuple[str, ...] = tuple(FORMATS)  # Answer formats questions are rendered in.
    format_seed: int = 0  # Picks each question's format, intro and phrasing from its id.
    splits: SplitConfig = SplitConfig()

    def __post_init__(self):
        if self.family not in DATASETS:
            raise ValueError(f"unknown reasoning-gym family {self.family!r}; valid names: {sorted(DATASETS)}")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")
        check_format_names(self.formats)


@dataclasses.dataclass(frozen=True)
class RGPayload:
    """What the scorer needs: reasoning-gym's entry (with its metadata) and the requested format."""

    entry: Mapping[str, Any]
    format: str


_DESCRIPTION = """\
Reasoning Gym task family "{family}" (category: {category}). Each question is a procedurally \
generated problem followed by an answer-format demand: the final answer must be written {formats}, \
as each question says. The harness's return value is graded: the answer is read out of it in the \
demanded format (a reply that ignores the format scores 0) and scored by reasoning-gym's own \
scorer, from 0 to 1.

An example question:
{example}"""


class ReasoningGymTask(SplitQuestions):
    """A Reasoning Gym family: its generator, format-varied questions, splits and scorer."""

    def __init__(self, config: RGTaskConfig):
        self.config = config
        self._dataset = reasoning_gym.create_dataset(config.family, seed=config.generator_seed, size=config.pool_size)
        self._splits = QuestionSplits(self._stream(), config.splits, self.name)

    @property
    def name(self) -> str:
        return f"rg/{self.config.family}"

    @property
    def description(self) -> str:
        # The example is the first feedback question: feedback questions are shown in reports anyway.
        example = self._splits.take("feedback", 1)[0].text
        summaries = [FORMATS[f].summary for f in self.config.formats]
        formats = summaries[0] if len(summaries) == 1 else ", ".join(summaries[:-1]) + " or " + summaries[-1]
        return _DESCRIPTION.format(
            family=self.config.family, category=category(self.config.family), formats=formats, example=example
        )

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return ()

    def question_at(self, index: int, fmt: str | None = None) -> Question:
        """Generator entry `index` as a question, in format `fmt` (default: its seeded format)."""
        return self._question(self._dataset[index], fmt)

    def score(self, answer: str, question: Question) -> Score:
        return score_reasoning_gym(self._dataset, answer, self.score_payload(question))

    def scorer_spec(self) -> ScorerSpec:
        return reasoning_gym_spec(self.config.family, self.config.generator_seed, self.config.pool_size)

    def score_payload(self, question: Question) -> dict:
        payload: RGPayload = question.payload
        return {"entry": dict(payload.entry), "format": payload.format}

    def tools(self, question: Question) -> Mapping[str, Any]:
        return {}

    def _stream(self) -> Iterator[Question]:
        for index in range(self.config.pool_size):
            yield self._question(self._dataset[index], None)

    def _question(self, entry: Mapping[str, Any], fmt: str | None) -> Question:
        qid = question_id(self.name, entry["question"])
        if fmt is None:
            fmt = choose_format(qid, self.config.format_seed, self.config.formats)
        elif fmt not in FORMATS:
            raise ValueError(f"unknown answer format {fmt!r}; valid: {sorted(FORMATS)}")
        return Question(
            qid=qid,
            text=render_question(entry["question"], qid, self.config.format_seed, fmt),
            answer=FORMATS[fmt].render(str(entry["answer"])),
            payload=RGPayload(entry=entry, format=fmt),
        )


def family_tasks(lists: FamilyLists, role: Role, base: RGTaskConfig) -> dict[str, ReasoningGymTask]:
    """One task per family of `role`, each `base` with its family swapped in."""
    return {f: ReasoningGymTask(dataclasses.replace(base, family=f)) for f in lists.families(role)}


def build_suite(spec, splits: SplitConfig, seed: int) -> list[ReasoningGymTask]:
    """The run's families: `tasks.families` (checked against the `tasks.role` list), else that list."""
    lists = FamilyLists.shipped()
    known = lists.families(spec.role)
    unknown = [f for f in spec.families if f not in known]
    if unknown:
        raise ValueError(f"tasks.families {unknown} are not in the {spec.role!r} list of hljax/tasks/rg_families.py: "
                         f"give some of {list(known)}, or another tasks.role")
    base = RGTaskConfig(family=known[0], generator_seed=seed, pool_size=spec.pool_size, splits=splits,
                        **({"formats": tuple(spec.formats)} if spec.formats else {}))
    return [ReasoningGymTask(dataclasses.replace(base, family=f)) for f in spec.families or known]


SUITE = Suite("reasoning_gym", build_suite, seeds.load("reasoning"))
