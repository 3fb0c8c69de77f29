"""Every config file in configs/ parses into its typed config (required paths given dummy values);
the list comes from the folder, so a new config is covered the moment it is added. The typed
dataclasses are the one schema: every field is a `--config.` key of every config of its kind, and
the schema files hold no default of their own."""

import dataclasses
import glob
import importlib
import json
import os
import subprocess
import sys
import typing

import pytest
from absl import flags
from ml_collections import config_flags

from hljax import config as hc
from hljax.config import ConfigError, SolverSpec, TaskSpec, typed
from hljax.data.collect_config import CollectConfig
from hljax.loop.run_config import EvalRunConfig
from hljax.rl.run_config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPERS = {"__init__", "setups"}  # Modules of configs/ that are no config (no get_config).
NAMES = sorted(n for n in (os.path.splitext(os.path.basename(p))[0]
                           for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))) if n not in HELPERS)
SCHEMA = {"train": RunConfig, "eval": EvalRunConfig, "collect": CollectConfig}


def _load(name: str):
    return importlib.import_module(f"configs.{name}").get_config()


def _kind(c) -> str:
    if "proposers" in c:
        return "eval"
    if "teacher" in c:
        return "collect"
    return "train"


def _fill_required(c, kind: str):
    """Dummy values for the fields a shipped config leaves to the user."""
    if kind == "eval" and not c.proposers:
        c.proposers = ("rl=/models/rl",)
    if kind == "train" and not c.model.path and not c.model.preset:
        c.model.path = "/models/proposer"
    if kind == "train" and c.tasks.suite == "multihop_qa" and not c.tasks.qa_files:
        c.tasks.qa_files = ("hotpotqa:/data/hotpot_train_v1.1.json",)
    if c.solver.backend == "sglang":
        c.solver.path = c.solver.path or "/models/solver"
        c.solver.url = c.solver.url or "http://127.0.0.1:30000"
    if kind == "collect" and c.teacher.backend == "remote":
        c.teacher.url = c.teacher.url or "http://127.0.0.1:30001"
        c.teacher.model = c.teacher.model or "teacher"
        c.teacher.path = c.teacher.path or "/models/teacher"
    return c


@pytest.mark.parametrize("name", NAMES)
def test_every_config_parses(name):
    c = _load(name)
    kind = _kind(c)
    try:
        cfg = SCHEMA[kind].from_config(_fill_required(c, kind))
    except ConfigError as e:
        pytest.fail(f"configs/{name}.py does not parse with dummy required paths: {e}")
    assert isinstance(cfg, SCHEMA[kind])


def _paths(cls, prefix: str = "", flat: bool = False) -> list[str]:
    """The config key of every field of `cls`, as config_tree lays them out."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(hc.DERIVED):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            sub_flat = flat or f.metadata.get(hc.FLAT, False)
            out += _paths(hints[f.name], prefix if sub_flat else f"{prefix}{f.name}.", sub_flat)
        else:
            out.append(prefix + f.name)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_a_config_key(name):
    """...with a type the command line can set (a bare None could not be overridden)."""
    c = _load(name)
    missing, untyped = [], []
    for path in _paths(SCHEMA[_kind(c)]):
        *parents, key = path.split(".")
        node = c
        for p in parents:
            node = node[p] if p in node else None
            if node is None:
                break
        if node is None or key not in node:
            missing.append(path)
        elif node.get_type(key) is type(None):
            untyped.append(path)
    assert not missing, f"configs/{name}.py lacks keys {missing}"
    assert not untyped, f"configs/{name}.py: {untyped} are None without a type"


@pytest.mark.parametrize("schema,cls,overrides", [
    ("base", RunConfig, {}),
    ("adapt_base", EvalRunConfig, {}),
    ("collect_base", CollectConfig, {}),
])
def test_schema_files_hold_only_the_dataclass_defaults(schema, cls, overrides):
    assert _load(schema).to_dict() == {**hc.defaults(cls), **overrides}


def test_fields_no_config_set_before_are_settable_from_the_command_line():
    argv = [
        "prog", "--config", os.path.join(ROOT, "configs", "tiny.py"),
        "--config.loss.eps_high=0.3", "--config.loss.max_tokens=512", "--config.sandbox.max_tasks=600",
        "--config.sandbox.wall_timeout_s=250", "--config.prompt.report_max_tokens=900",
        "--config.solver.batch_window_s=0.01", "--config.solver.seed=3", "--config.solver.stop=('END',)",
    ]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
    fv(argv)
    cfg = RunConfig.from_config(fv.config)
    assert (cfg.loss.eps_high, cfg.loss.max_tokens) == (0.3, 512)
    assert (cfg.sandbox.max_tasks, cfg.sandbox.wall_timeout_s) == (600, 250.0)
    assert cfg.prompt.report_max_tokens == 900
    assert cfg.solver.budget.batch_window_s == 0.01
    assert (cfg.solver.budget.sampling.seed, cfg.solver.budget.sampling.stop) == (3, ("END",))
    assert cfg.solver.budget.sampling.max_new_tokens == 256  # tiny.py's own value, untouched.


def test_run_defaults_that_differ_from_a_components_own():
    """Resolved once, in the run configs (see the comments where they are declared)."""
    cfg = RunConfig()
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28)
    assert (cfg.sft_optim.learning_rate, cfg.sft_optim.warmup_steps, cfg.sft_optim.b2) == (1e-5, 10, 0.95)
    assert (cfg.optim.learning_rate, cfg.optim.warmup_steps, cfg.optim.b2) == (1e-6, 0, 0.999)
    assert cfg.sandbox.timeout_s == EvalRunConfig.__dataclass_fields__["sandbox"].default.timeout_s == 20.0
    assert (cfg.solver.budget.sampling.temperature, cfg.solver.budget.max_calls) == (0.0, 4)
    assert cfg.loss.std_ddof == 1  # torch.std's sample std, as TRL 1.16, verl and Tunix.
    assert (cfg.loss.tis_cap, cfg.loss.zero_variance_groups, cfg.grpo.mu) == (None, "keep", 1)
    # The refresh follows the training proposals' sampling unless a config sets it.
    r = cfg.states.refresh
    assert (r.max_new_tokens, r.temperature, r.top_p, r.top_k) == (256, 1.0, 1.0, -1)


def test_derived_fields_are_not_config_keys():
    c = _load("base")
    assert "mode" not in c.loss and "temperature" not in c.loss
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['temperature'\]"):
        typed(RunConfig, {"loss": {"temperature": 0.7}}, "config")


def test_a_partial_solver_block_keeps_the_run_defaults():
    """Keys a block leaves out come from the field's default, as in the tree: here the run's solver
    budget (greedy), not SamplingParams' own temperature of 1.0."""
    spec = typed(SolverSpec, {"max_calls": 3, "top_k": 5}, "config.solver")
    assert (spec.budget.max_calls, spec.budget.max_tokens) == (3, 2048)
    assert (spec.budget.sampling.top_k, spec.budget.sampling.temperature) == (5, 0.0)
    with pytest.raises(ConfigError, match=r"config\.solver: unknown key\(s\) \['temprature'\]"):
        typed(SolverSpec, {"temprature": 0.5}, "config.solver")


def test_tiny_resolves_to_the_values_the_learning_benchmark_was_measured_with():
    """bench/learning.py and docs/benchmarks.md depend on configs/tiny.py: a change of any default it
    inherits must be deliberate (then update tests/data/tiny_run_config.json with it)."""
    with open(os.path.join(ROOT, "tests", "data", "tiny_run_config.json")) as f:
        expected = json.load(f)
    resolved = json.loads(json.dumps(dataclasses.asdict(RunConfig.from_config(_load("tiny")))))
    assert resolved == expected


def test_config_files_load_without_jax():
    """The launchers read the config file while parsing flags: a flag error comes back before JAX,
    transformers or reasoning-gym load, so the schema modules config files import stay free of them."""
    code = ("import importlib, sys\n"
            f"for name in {NAMES!r}:\n"
            "    importlib.import_module(f'configs.{name}').get_config()\n"
            "print(sorted({'jax', 'flax', 'transformers', 'reasoning_gym', 'torch'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_string_for_a_tuple_field_names_the_key():
    """`--config.tasks.qa_files=(1` reaches the schema as the string "(1"."""
    with pytest.raises(ConfigError, match=r"tasks\.qa_files='\(1' must be a tuple"):
        typed(TaskSpec, {"qa_files": "(1"}, "config.tasks")


def test_docs_configs_md_is_current_and_documents_every_key():
    """docs/configs.md is generated from the dataclasses: regenerate with `python -m launch.config_docs >
    docs/configs.md` when a field changes."""
    from launch import config_docs

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "configs.md")
    with open(path) as f:
        assert f.read() == config_docs.markdown(), "docs/configs.md is stale: python -m launch.config_docs > docs/configs.md"
    undocumented = [line for line in config_docs.markdown().splitlines() if line.endswith("|  |")]
    assert not undocumented, undocumented


# A setting's default is stated once: a name declared by two config classes with different defaults
# is refused, unless it names a different setting in each (listed here with why), or the class only
# follows another block (SamplingOverride: None = the followed block's value).
DIFFERENT_SETTINGS = {
    "backend": "what serves the solver, the rollouts, the teacher: each has its own backends",
    "data": "the mesh's data axis (devices); the SFT data file",
    "dtype": "a model's, a server's compute dtype; an export's ('' = the checkpoint's)",
    "max_len": "an SFT row's, a GRPO rollout's token bucket",
    "max_tokens": "a job's solver token budget; a history's token budget; the loss's length normaliser",
    "mode": "a run's stages, where GRPO's states come from, how history is shown",
    "proposals": "candidates per state refresh round, per adaptation round, per collected state",
    "rounds": "state refresh rounds, adaptation rounds, collection rounds: runs of different sizes",
    "run_dir": "where a training, an evaluation, a collection writes",
    "scoring_questions": "questions per candidate in a refresh, a GRPO step, an adaptation, a collection",
    "seed": "a run's root seed; a request's sampling seed (None: drawn)",
    "timeout_s": "a sandbox job's time limit; a teacher HTTP request's",
}
FOLLOWERS = ("SamplingOverride",)


def _config_classes() -> list[type]:
    seen: dict[type, None] = {}

    def walk(cls):
        if cls in seen:
            return
        seen[cls] = None
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            for t in (hints[f.name], *typing.get_args(hints[f.name])):
                if dataclasses.is_dataclass(t):
                    walk(t)

    for cls in SCHEMA.values():
        walk(cls)
    return list(seen)


def _declared_settings() -> dict[str, dict[str, object]]:
    """Setting name -> {class: default} over every config class (blocks and derived fields left out)."""
    out: dict[str, dict[str, object]] = {}
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get(hc.DERIVED) or dataclasses.is_dataclass(hints[f.name]):
                continue
            if cls.__name__ in FOLLOWERS and f.default is None:
                continue
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                continue  # A required field (ProposerEntry.label) has no default to disagree on.
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.setdefault(f.name, {})[cls.__qualname__] = default
    return out


def test_each_setting_has_one_default():
    declared = _declared_settings()
    differing = {name: by_class for name, by_class in declared.items()
                 if len(by_class) > 1 and len({repr(v) for v in by_class.values()}) > 1}
    assert sorted(set(differing) - set(DIFFERENT_SETTINGS)) == [], (
        f"declared with different defaults in several config classes: "
        f"{ {k: differing[k] for k in set(differing) - set(DIFFERENT_SETTINGS)} }; nest one shared block "
        "(like generate.types.Sampling) or, if each is another setting, say why in DIFFERENT_SETTINGS")
    assert sorted(set(DIFFERENT_SETTINGS) - set(differing)) == [], "stale DIFFERENT_SETTINGS entries"


def test_the_sampling_settings_are_declared_in_one_block():
    from hljax.generate.types import Sampling, SamplingParams

    declared = _declared_settings()
    for name in ("max_new_tokens", "temperature", "top_p", "top_k"):
        # SamplingParams, a request's knobs, takes its defaults from Sampling (types.py).
        assert set(declared[name]) == {"Sampling", "SamplingParams"}, name
        assert getattr(SamplingParams(), name) == getattr(Sampling(), name)
