"""Adaptation/evaluation configs parse into typed configs with clear errors; results tables by hand."""

import importlib

import pytest

from hljax.config import ConfigError
from hljax.loop import tables
from hljax.loop.run_config import EvalRunConfig, ProposerEntry

CONFIGS = ["adapt_tiny", "adapt_rg", "adapt_qa", "eval_rg_single", "eval_rg_multistep", "eval_qa_single",
           "eval_qa_rounds"]


@pytest.mark.parametrize("name", CONFIGS)
def test_named_configs_parse(name):
    c = importlib.import_module(f"configs.{name}").get_config()
    if not c.proposers:
        c.proposers = ("rl=/models/rl",)
    if c.solver.backend == "sglang":
        c.solver.path = "/models/solver"
    cfg = EvalRunConfig.from_config(c)
    assert cfg.adapt.proposals >= 1 and cfg.proposers


def test_paper_protocol_numbers():
    def load(name):
        return importlib.import_module(f"configs.{name}").get_config()

    single = load("eval_rg_single")
    assert (single.evaluation.protocol, single.adapt.proposals, single.tasks.role) == ("single", 8, "heldout")
    multi = load("eval_rg_multistep")
    assert (multi.adapt.rounds, multi.adapt.proposals, multi.adapt.policy) == (5, 1, "keep_if_better")
    qa = load("eval_qa_rounds")
    assert (qa.adapt.runs, qa.adapt.rounds, qa.adapt.proposals, qa.adapt.policy) == (4, 10, 8, "best_of_g")
    assert load("eval_qa_single").adapt.proposals == 80


def test_the_proposers_thinking_mode_is_one_setting():
    from configs import adapt_rg

    c = adapt_rg.get_config()
    c.proposers = ("rl=/models/rl",)
    c.solver.path = "/models/solver"
    assert EvalRunConfig.from_config(c).proposer.enable_thinking is False
    c.proposer.enable_thinking = True
    cfg = EvalRunConfig.from_config(c)
    assert cfg.proposer.enable_thinking is True and cfg.adapt.sampling.max_new_tokens == 4096
    assert "enable_thinking" not in c.adapt  # One setting: the adapt block has none of its own.


def test_typo_and_bad_values_name_the_key():
    from configs import adapt_tiny

    c = adapt_tiny.get_config()
    c.adapt.polcy = "best_of_g"  # The launchers lock the config first; the typed config catches it regardless.
    with pytest.raises(ConfigError, match="polcy"):
        EvalRunConfig.from_config(c)
    c = adapt_tiny.get_config()
    c.lock()
    with pytest.raises(AttributeError, match="polcy"):
        c.adapt.polcy = "best_of_g"
    c.adapt.policy = "best_of_n"
    with pytest.raises(ConfigError, match="adapt.policy"):
        EvalRunConfig.from_config(c)
    c = adapt_tiny.get_config()
    c.proposers = ()
    with pytest.raises(ConfigError, match="proposers"):
        EvalRunConfig.from_config(c)


def test_proposer_entries():
    assert ProposerEntry.parse("rl=runs/x/export") == ProposerEntry("rl", "runs/x/export", "")
    assert ProposerEntry.parse("t=http://h:1|/tok") == ProposerEntry("t", "/tok", "http://h:1")
    with pytest.raises(ConfigError, match="label="):
        ProposerEntry.parse("runs/x/export")


def test_results_table_layout_and_means():
    rows = [
        tables.TaskResult("rl", "rg/maze", 0.5, 0.9, 8, 0.25, 0.5),
        tables.TaskResult("seed", "rg/maze", 0.4, 0.4, 0, 0.0, 0.0),
        tables.TaskResult("seed", "rg/aiw", 0.2, 0.2, 0, 0.0, 0.0),
        tables.TaskResult("rl", "rg/aiw", 0.7, 1.0, 8, 0.0, 0.125),
    ]
    md = tables.results_markdown(rows, "single")
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert lines[0] == "| proposer | rg/maze | rg/aiw | mean |"
    assert lines[1] == "| seed | 0.400 | 0.200 | 0.300 |"  # Seed row first whatever the input order.
    assert lines[2] == "| rl | 0.500 | 0.700 | 0.600 |"
    assert "| rl | 0.900 | 1.000 | 0.950 |" in md  # The oracle table.
    assert "| rl | 16 | 0.125 | 0.312 |" in md  # Pooled rates: (2 + 0) / 16 invalid, (4 + 1) / 16 zero.
    assert tables.to_csv(rows).splitlines()[0].startswith("proposer,task,mean,oracle")
