"""The config machinery every run shares: typed dataclasses are the one schema.

`config_tree(cls)` turns a config dataclass into the ml_collections tree a config file starts from
(every field with its default), so a field is settable as `--config.<path>` the moment it is
declared, and config files hold only what they override. `typed(cls, values)` turns a locked
config back into the frozen dataclass: unknown keys, wrong types and bad values fail at start-up,
naming the key.

Also here: the specs shared by training (hljax/rl/run_config.py), adaptation and evaluation
(hljax/loop/run_config.py) and collection (hljax/data/collect_config.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, Literal

import ml_collections

from hljax.generate.types import SamplingParams
from sandbox.config import SandboxConfig, SolverConfig

if TYPE_CHECKING:
    from hljax.generate.endpoints import GeneratorSpec

# Field metadata. FLAT: the nested dataclass's keys (all the way down) sit in its parent's block,
# e.g. the solver's budget and sampling keys in `solver`. DERIVED: set by the code, not by a config
# (LossConfig.mode and temperature follow the training stage); not in the tree, refused by `typed`.
FLAT = "hljax_config_flat"
DERIVED = "hljax_config_derived"


class ConfigError(ValueError):
    pass


# ----- dataclass -> ml_collections tree -----


def config_tree(cls) -> ml_collections.ConfigDict:
    """The ml_collections tree of config dataclass `cls`, every field at its default. Returned
    unlocked, as config files extend it; the launchers lock it."""
    return ml_collections.ConfigDict(_tree(cls, None, wrap=True))


def defaults(cls) -> dict:
    """`config_tree(cls)` as a plain dict (None where a field defaults to None)."""
    return _tree(cls, None, wrap=False)


def _tree(cls, instance, wrap: bool, flat: bool = False) -> dict:
    """`instance`'s values, or with None the class's field defaults. A nested default is an instance,
    read through its attributes: a value its __post_init__ resolves (LossConfig.eps_high None ->
    eps_low) appears resolved, so such a default names the value (RUN_LOSS). `wrap`: None leaves
    become typed FieldReferences, so `--config.<path>=...` can set them (a plain None cannot be
    overridden). `flat`: nested dataclasses' keys in this block, all the way down."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get(DERIVED):
            continue
        hint = hints[f.name]
        value = getattr(instance, f.name) if instance is not None else _field_default(cls, f)
        if dataclasses.is_dataclass(hint):
            sub = _tree(hint, value, wrap, flat or f.metadata.get(FLAT, False))
            if flat or f.metadata.get(FLAT):
                clash = sorted(set(sub) & (set(out) | {g.name for g in dataclasses.fields(cls)}))
                if clash:
                    raise TypeError(f"{cls.__name__}.{f.name}: flat keys {clash} clash with its parent's")
                out.update(sub)
            else:
                out[f.name] = sub
        elif value is None:
            out[f.name] = ml_collections.FieldReference(None, field_type=_optional_type(hint)) if wrap else None
        elif hint is float and type(value) is int:
            out[f.name] = float(value)  # Else the tree types the field int and refuses 0.5 from the command line.
        else:
            out[f.name] = value
    return out


def _field_default(cls, f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{cls.__name__}.{f.name} has no default: every config field needs one (config_tree)")


def _optional_type(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) not in (typing.Union, types.UnionType) or len(args) != 1:
        raise TypeError(f"a field defaulting to None must be typed `X | None`, got {hint}")
    return typing.get_origin(args[0]) or args[0]


def _flat_keys(cls) -> set[str]:
    return set(_tree(cls, None, wrap=False, flat=True))


# ----- config dict -> typed dataclass -----


def typed(cls, values: dict, where: str, flat: bool = False):
    """Build dataclass `cls` from `values`, recursing into nested dataclass fields. A nested block
    that names only some keys takes the others from the field's default, as the tree would. `flat`:
    the keys of nested dataclasses sit in `values` itself (see FLAT)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get(DERIVED)}
    values = dict(values)
    kwargs: dict[str, Any] = {}
    flat_fields = {n for n, f in fields.items()
                   if dataclasses.is_dataclass(hints[n]) and (flat or f.metadata.get(FLAT))}
    flat_keys: set[str] = set()
    for name in flat_fields:
        keys = _flat_keys(hints[name])
        flat_keys |= keys
        given = {k: values.pop(k) for k in list(values) if k in keys}
        if given:
            kwargs[name] = _nested(cls, fields[name], hints[name], given, where, flat=True)
    unknown = set(values) - (set(fields) - flat_fields)
    if unknown:
        valid = sorted((set(fields) - flat_fields) | flat_keys)
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {valid}")
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _nested(cls, fields[name], hint, value, f"{where}.{name}")
        elif typing.get_origin(hint) is tuple:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where}.{name}={value!r} must be a tuple, e.g. ('a', 'b') (a string is not one)")
            value = tuple(value)
        elif typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
            raise ConfigError(f"{where}.{name}={value!r} is not one of {typing.get_args(hint)}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _nested(cls, f: dataclasses.Field, hint, given: dict, where: str, flat: bool = False):
    return typed(hint, {**_tree(hint, _field_default(cls, f), wrap=False, flat=flat), **given}, where, flat)


# ----- specs shared by training, adaptation, evaluation and collection -----


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    path: str = ""  # HF folder of the initial proposer; "" = random init from `preset`.
    preset: str = "tiny"  # launch.init_model preset used when path is "".
    dtype: Literal["float32", "bfloat16"] = "float32"  # Compute dtype.
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # Storage dtype of trained weights.
    remat: bool = False  # Recompute layer activations in the backward pass (memory for compute).
    # Qwen3's thinking mode in the proposer's chat template, for SFT rows, GRPO rollouts and state
    # refreshes alike. False: the template's empty think block, so the proposer answers with edits
    # straight away, as the teacher's SFT completions (which carry no reasoning) do.
    enable_thinking: bool = False


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
    initialize: bool = False  # Call jax.distributed.initialize(); with no fields set JAX auto-detects TPU/SLURM.
    coordinator: str = ""  # host:port of process 0 (else JAX_COORDINATOR_ADDRESS / auto-detect).
    num_processes: int = 0  # 0: JAX_NUM_PROCESSES / auto-detect.
    process_id: int = -1  # -1: JAX_PROCESS_ID / auto-detect.
    # A process silent this long is declared dead and the others fail with an error (not a hang).
    heartbeat_timeout_s: int = 100
    init_timeout_s: int = 300  # How long processes wait for each other at start-up.
    shutdown_timeout_s: int = 300  # How long a finished process waits for the others at exit.


# A run's sandbox: 20 s of a job's own running, as every shipped config has used. The bare
# SandboxConfig keeps 10 s, which the sandbox's own tests and benchmarks are sized for.
RUN_SANDBOX = SandboxConfig(timeout_s=20.0)

# A run's solver budget: short greedy answers and few calls, sized for the tiny default. The bare
# SolverConfig keeps Qwen3's recommended sampling and the paper's budgets for direct users.
RUN_SOLVER_BUDGET = SolverConfig(sampling=SamplingParams(max_new_tokens=256, temperature=0.0, top_p=1.0, top_k=-1),
                                 max_calls=4, max_tokens=2048)


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    """The frozen solver. In a config its budget and sampling keys sit in the `solver` block itself
    (`--config.solver.max_calls`, `--config.solver.temperature`)."""

    # embedded: in-process JAX engine (frozen). sglang: a server at `url`. simulated: the CPU stand-in
    # for an LLM (hljax/tasks/simulated_solver.py); it takes no path or url.
    backend: Literal["embedded", "sglang", "simulated"] = "embedded"
    path: str = ""  # HF folder of the solver; "" = the proposer's initial weights.
    url: str = ""  # SGLang server(s) of the solver (backend sglang).
    max_batch: int = 16  # Embedded solver: sequences decoded together.
    max_seq_len: int = 4096  # Embedded solver: KV-cache length per sequence.
    budget: SolverConfig = dataclasses.field(default=RUN_SOLVER_BUDGET, metadata={FLAT: True})

    def __post_init__(self):
        if self.backend == "simulated" and (self.path or self.url):
            raise ConfigError(f"solver.backend='simulated' is a stand-in for an LLM and loads no model, but "
                              f"solver.path={self.path!r} / solver.url={self.url!r} name one: set backend to "
                              "'embedded' or 'sglang' for a real model, or clear path and url")

    @property
    def simulated(self) -> bool:
        return self.backend == "simulated"

    def generator_spec(self, default_path: str, seed: int) -> GeneratorSpec:
        """How to open this solver; `default_path` serves an embedded solver when `path` is ""."""
        # Imported here: the endpoints load JAX and transformers, which a config file needs neither of.
        from hljax.generate.endpoints import GeneratorSpec

        if self.backend == "simulated":
            return GeneratorSpec("simulated", seed=seed)
        if self.backend == "sglang":
            return GeneratorSpec("sglang", self.path, url=self.url)
        return GeneratorSpec("embedded", self.path or default_path, max_batch=self.max_batch,
                             max_seq_len=self.max_seq_len)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    # Task suite: Reasoning Gym families or multi-hop QA.
    suite: Literal["reasoning_gym", "multihop_qa"] = "reasoning_gym"
    role: Literal["sft", "rl", "heldout"] = "rl"  # Which family list of hljax/tasks/rg_families.py.
    families: tuple[str, ...] = ()  # A subset of that list.
    qa_files: tuple[str, ...] = ()  # multihop_qa: "dataset:path" entries (hotpotqa, musique, 2wikimultihopqa).
    qa_aliases: str = ""  # 2WikiMultihopQA's id_aliases.json, if given.
    feedback: int = 4  # Questions per feedback round (the report).
    scoring: int = 64  # Size of the scoring split.
    eval: int = 64  # Size of the evaluation split.
    pool_size: int = 5000  # Questions generated per family before splitting.
    formats: tuple[str, ...] = ()  # Answer formats; () = all.
