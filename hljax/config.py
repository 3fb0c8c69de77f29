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
import json
import os
import types
import typing
from typing import Any, Literal

import ml_collections

from hljax.generate.types import SamplingParams
from sandbox.config import SandboxConfig, SolverConfig

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
    # Recompute layer activations in the backward pass (memory for compute). On CPU launch.train then
    # turns on XLA's memory-minimising scheduler, without which remat saves nothing (hljax/xla_options.py).
    remat: bool = False
    # Training and scoring attention (many query tokens) through hljax/kernels/cpu_attention.py, fp32 on
    # one CPU device: "auto" when it can run (else XLA, logged), "on" (an error if it cannot), "off".
    attention_kernel: Literal["off", "auto", "on"] = "auto"
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
class ServingSpec:
    """How an embedded engine serves a model (hljax/endpoints.py). In a config its keys sit in the block
    of the model served (`--config.solver.max_batch`, `--config.proposer.dtype`)."""

    max_batch: int = 16  # Sequences decoded together.
    max_seq_len: int = 4096  # KV-cache length per sequence; longer requests are refused.
    dtype: Literal["float32", "bfloat16"] = "float32"  # Compute dtype.


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    """The frozen solver. In a config its serving, budget and sampling keys sit in the `solver` block
    itself (`--config.solver.max_batch`, `--config.solver.max_calls`, `--config.solver.temperature`)."""

    # embedded: in-process JAX engine (frozen). sglang: a server at `url`. sglang_jax: sglang-jax on `path`,
    # started by this process from its venv (scripts/sglang_jax.sh setup). simulated: the CPU stand-in
    # for an LLM (hljax/tasks/simulated_solver.py); it takes no path or url.
    backend: Literal["embedded", "sglang", "sglang_jax", "simulated"] = "embedded"
    path: str = ""  # HF folder of the solver; "" = the proposer's initial weights.
    url: str = ""  # SGLang server(s) of the solver (backend sglang).
    serving: ServingSpec = dataclasses.field(default=ServingSpec(), metadata={FLAT: True})  # Embedded solver:
    budget: SolverConfig = dataclasses.field(default=RUN_SOLVER_BUDGET, metadata={FLAT: True})

    def __post_init__(self):
        if self.backend == "simulated" and (self.path or self.url):
            raise ConfigError(f"solver.backend='simulated' is a stand-in for an LLM and loads no model, but "
                              f"solver.path={self.path!r} / solver.url={self.url!r} name one: set backend to "
                              "'embedded' or 'sglang' for a real model, or clear path and url")

    @property
    def simulated(self) -> bool:
        return self.backend == "simulated"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    # Task suite: "reasoning_gym", "multihop_qa", a task file "path/to/task.py" or "package.module:NAME"
    # (hljax/tasks/suite.py, docs/tasks.md).
    suite: str = "reasoning_gym"
    # reasoning_gym: which family list of hljax/tasks/rg_families.py; "train" is the SFT and RL lists together.
    role: Literal["sft", "rl", "heldout", "train"] = "rl"
    families: tuple[str, ...] = ()  # reasoning_gym: a subset of that list; a task file: some of its task names.
    qa_files: tuple[str, ...] = ()  # multihop_qa: "dataset:path" entries (hotpotqa, musique, 2wikimultihopqa).
    qa_aliases: str = ""  # 2WikiMultihopQA's id_aliases.json, if given.
    feedback: int = 4  # Questions per feedback round (the report).
    scoring: int = 64  # Size of the scoring split.
    eval: int = 64  # Size of the evaluation split.
    pool_size: int = 5000  # Questions generated per family before splitting.
    formats: tuple[str, ...] = ()  # Answer formats; () = all.


# ----- a run dir remembers its config -----

ANY, GROW = "any", "grow"

# What a rerun on a run dir (or a collection's output) may change from the config saved there; any
# other change is refused, since the files already there were computed under the saved values. ANY:
# where and how the run executes, not what it computes (servers, devices, worker counts, checkpoint
# cadence, logging, plots). GROW: a longer run of the same thing; a number may only increase, a tuple
# may only gain entries. A key ending in "." covers its whole block. Keys are `--config.` keys.
RERUN_CHANGES: dict[str, dict[str, str]] = {
    "train": {
        "run_dir": ANY, "distributed.": ANY, "mesh.": ANY, "checkpoint.": ANY, "metrics.": ANY, "export.": ANY,
        "rollout.url": ANY, "rollout.sync_dir": ANY, "rollout.max_batch": ANY,
        "solver.url": ANY, "solver.max_batch": ANY,
        "sandbox.workers": ANY, "sandbox.slots_per_worker": ANY, "sandbox.bwrap": ANY, "sandbox.start_timeout_s": ANY,
        # Steps are numbered globally (SFT first), so more SFT steps are refused once GRPO has begun
        # (preflight.train reads the checkpoints for that).
        "sft.steps": GROW, "grpo.steps": GROW,
    },
    "evaluate": {
        "run_dir": ANY, "distributed.": ANY, "mesh.": ANY, "report.": ANY,
        "proposer.max_batch": ANY, "solver.url": ANY, "solver.max_batch": ANY,
        "sandbox.workers": ANY, "sandbox.slots_per_worker": ANY, "sandbox.bwrap": ANY, "sandbox.start_timeout_s": ANY,
        # Each task's results sit in their own folder: a rerun may cover other families.
        "tasks.families": ANY,
        "adapt.rounds": GROW, "adapt.runs": GROW, "proposers": GROW,
        # Turning it on adds each proposer's "+history" row beside the rows already there.
        "evaluation.compare_history": GROW,
    },
    "collect": {
        "out": ANY, "run_dir": ANY, "rounds": ANY, "mesh.": ANY, "sandbox.": ANY, "tasks.families": ANY,
        "teacher.url": ANY, "teacher.api_key_env": ANY, "teacher.timeout_s": ANY, "teacher.max_batch": ANY,
        "teacher.max_seq_len": ANY, "solver.url": ANY, "solver.max_batch": ANY, "solver.max_seq_len": ANY,
    },
}


# What to do instead, when a rerun is refused.
RERUN_FIX = {"train": "give --config.run_dir=<a new dir> for a new run",
             "evaluate": "give --config.run_dir=<a new dir> for a new run",
             "collect": "give --config.out=<a new file> for a new collection"}


@dataclasses.dataclass(frozen=True)
class Change:
    key: str  # The `--config.` key.
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {self.old!r} -> {self.new!r}"


def to_json(cfg) -> dict:
    """A config dataclass as the JSON a run dir keeps (config.json)."""
    return _jsonable(dataclasses.asdict(cfg))


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def config_changes(cls, saved: dict, current: dict) -> list[Change]:
    """Keys whose value differs between two `to_json` dicts of config class `cls`. A key the saved
    one lacks counts as its default (the field is newer than the run); one only it has (a field
    since removed) is ignored."""
    default = _flatten(cls, _default_json(cls))
    old, new = _flatten(cls, saved), _flatten(cls, current)
    return [Change(k, old.get(k, default.get(k)), v) for k, v in new.items() if old.get(k, default.get(k)) != v]


def rule(kind: str, key: str) -> str | None:
    """RERUN_CHANGES' rule for `key` in a `kind` run (ANY, GROW, or None: refused)."""
    table = RERUN_CHANGES[kind]
    if key in table:
        return table[key]
    blocks = [k for k in table if k.endswith(".") and key.startswith(k)]
    return table[max(blocks, key=len)] if blocks else None


def allowed(kind: str, change: Change) -> bool:
    r = rule(kind, change.key)
    if r == GROW:
        if isinstance(change.old, list) and isinstance(change.new, list):
            return all(v in change.new for v in change.old)
        return isinstance(change.old, (int, float)) and isinstance(change.new, (int, float)) and change.new >= change.old
    return r == ANY


def check_rerun(path: str, cfg, kind: str) -> list[Change]:
    """Compare `cfg` with the config saved at `path` (if any): a change RERUN_CHANGES[kind] does not
    allow is a ConfigError naming every such key with its old and new value, and RERUN_FIX[kind].
    -> the allowed changes. Writes nothing: the caller saves the config once the check passed."""
    fix = RERUN_FIX[kind]
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the config this run was started with ({e}): {fix}") from None
    changes = config_changes(type(cfg), saved, to_json(cfg))
    refused = [c for c in changes if not allowed(kind, c)]
    if refused:
        raise ConfigError(f"{os.path.dirname(path) or '.'} holds a run made with another config ({path}): "
                          f"{'; '.join(map(str, refused))}. These change what it computes: {fix}, or restore "
                          "those values to resume it")
    return [c for c in changes if allowed(kind, c)]


def save_config(path: str, cfg) -> None:
    """Write `cfg` as `path` (atomically: a kill mid-write leaves the previous one)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(to_json(cfg), f, indent=2)
    os.replace(tmp, path)


def _default_json(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        try:
            value = _field_default(cls, f)
        except TypeError:
            continue
        out[f.name] = _jsonable(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value)
    return out


def _flat_children_keys(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    return {k for f in dataclasses.fields(cls) if f.metadata.get(FLAT) for k in _flat_keys(hints[f.name])}


def _flatten(cls, d: dict, prefix: str = "", flat: bool = False) -> dict:
    """A `to_json` dict -> {`--config.` key: value}; FLAT blocks' keys sit in their parent's block."""
    out = {}
    hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    for k, v in d.items():
        hint = hints.get(k)
        if isinstance(v, dict) and hint is not None and dataclasses.is_dataclass(hint):
            inner = flat or bool(fields[k].metadata.get(FLAT))
            out.update(_flatten(hint, v, prefix if inner else f"{prefix}{k}.", inner))
        elif k in fields or not fields or k in _flat_children_keys(cls):  # A key saved before its block nested.
            out[f"{prefix}{k}"] = v
    return out
