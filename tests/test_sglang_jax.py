"""Against a real sglang-jax server on CPU (scripts/sglang_jax.sh setup makes its venv; CI sets
HLJAX_REQUIRE_SGLANG_JAX=1 so that a missing venv fails instead of skipping).

One server for the module, started by `ManagedSGLangJax` on a tiny random Qwen3 whose head_dim (128)
sglang-jax's attention takes; references are transformers' greedy decoding and our trainer's log-probs."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf, presets
from hljax.generate import sglang_jax
from hljax.generate.client import SGLangGenerator
from hljax.generate.types import SamplingParams
from hljax.preflight import PreflightError, check_weight_updates
from hljax.rl.logprobs import Sequences, sequence_logprobs
from tests import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _have_venv() -> bool:
    try:
        sglang_jax.venv_python()
        return True
    except sglang_jax.SGLangJaxUnavailable:
        return False


if not _have_venv() and os.environ.get("HLJAX_REQUIRE_SGLANG_JAX") == "1":
    raise RuntimeError("HLJAX_REQUIRE_SGLANG_JAX=1 but there is no sglang-jax venv: run scripts/sglang_jax.sh setup")
pytestmark = [pytest.mark.sglang_jax, pytest.mark.timeout(900),
              pytest.mark.skipif(not _have_venv(), reason="no sglang-jax venv: run scripts/sglang_jax.sh setup")]

PROMPTS = ["def solve(question, solver):", "The answer is"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang_jax")
    return [presets.init_model("tiny-hd128", str(root / f"seed{s}"), seed=s) for s in (0, 1)]


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders[0])
    log = str(tmp_path_factory.mktemp("sglang_jax_log") / "server.log")
    managed = sglang_jax.ManagedSGLangJax(folders[0], tokenizer, max_batch=8, max_seq_len=2048, pool_tokens=4096,
                                          log_path=log)
    yield managed
    managed.stop()


GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


def test_greedy_tokens_equal_transformers(server, folders):
    want = tiny.hf_greedy_texts(folders[0], PROMPTS, 12)
    got = server.generate(PROMPTS, GREEDY)
    assert [list(r[0].token_ids) for r in got] == want
    ids = [server.tokenizer(p).input_ids for p in PROMPTS]
    assert [list(r[0].token_ids) for r in server.generate_ids(ids, GREEDY)] == want


def test_logprobs_equal_our_trainers(server, folders):
    """The gap the trainer records as sampler_logprob_gap, here on sglang-jax's samples: 120 tokens, past
    the 50-token flushes whose log-probs sglang-jax repeats in its reply (the client keeps the reply's)."""
    sampling = SamplingParams(max_new_tokens=120, temperature=1.0, seed=5, ignore_eos=True)
    (row,) = server.generate([PROMPTS[0]], sampling, n=2, return_logprobs=True)
    prompt = server.tokenizer(PROMPTS[0]).input_ids
    model = hf.load_hf(folders[0], shd.make_mesh(), dtype=jnp.float32)
    L = 256
    gaps = []
    for c in row:
        seq = prompt + list(c.token_ids)
        tokens = np.zeros((1, L), np.int32)
        tokens[0, :len(seq)] = seq
        mask = (np.arange(L) < len(seq)).astype(np.int32)[None]
        loss = np.zeros((1, L), np.float32)
        loss[0, len(prompt) - 1:len(seq) - 1] = 1
        logp, _ = sequence_logprobs(model, Sequences(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(loss)))
        ours = np.asarray(logp)[0, len(prompt) - 1:len(seq) - 1]
        assert len(c.logprobs) == len(c.token_ids) == 120
        gaps.append(np.abs(ours - np.asarray(c.logprobs)).max())
    assert max(gaps) < 1e-3, gaps


def test_stop_strings_and_chat(server, folders):
    (row,) = server.generate([PROMPTS[1]], GREEDY)
    text = row[0].text
    cut = text[3:5]  # A stop string the greedy text contains: the reply ends before its first occurrence.
    (stopped,) = server.generate([PROMPTS[1]], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(cut,)))
    assert stopped[0].text == text[:text.index(cut)] and stopped[0].finish_reason == "stop"
    messages = [{"role": "user", "content": "hello"}]
    (chat,) = server.chat([messages], GREEDY)
    rendered = server.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                    enable_thinking=False)  # chat()'s default.
    assert list(chat[0].token_ids) == tiny.hf_greedy_texts(folders[0], [rendered], 12)[0]


def test_seeded_samples_reproduce(server):
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11, ignore_eos=True)
    a = server.generate([PROMPTS[0]], sampling, n=3)
    b = server.generate([PROMPTS[0]], sampling, n=3)
    c = server.generate([PROMPTS[0]], SamplingParams(**{**sampling.__dict__, "seed": 12}), n=3)
    ids = lambda out: [r.token_ids for r in out[0]]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c) and len(set(ids(a))) == 3


def test_a_server_without_weight_updates_is_named_at_preflight(server):
    client = SGLangGenerator(server.url, server.tokenizer)
    assert client.servers_without_weight_updates() == [server.url]
    assert client.servers_ignoring_seeds() == []  # Started with --enable-deterministic-sampling.
    assert client.model_info()["is_generation"]  # /get_model_info: sglang-jax has no /model_info.
    with pytest.raises(PreflightError, match="rollout.backend=sglang_jax"):
        check_weight_updates(server.url, "rollout.url")


def test_sandbox_solver_is_sglang_jax(server, folders):
    from sandbox.config import SandboxConfig, SolverConfig
    from sandbox.pool import SandboxPool
    from sandbox.results import Job

    code = "def solve(question, solver):\n    return solver.generate(question, temperature=0.0, max_new_tokens=8)\n"
    with SandboxPool(SandboxConfig(workers=1), server, SolverConfig(prompt_mode="raw")) as pool:
        results = pool.run([Job(code, p) for p in PROMPTS])
    assert [r.status for r in results] == ["ok", "ok"]
    tok = server.tokenizer
    want = [tok.decode(ids) for ids in tiny.hf_greedy_texts(folders[0], PROMPTS, 8)]
    # EOS may end a greedy reply early on sglang-jax (no ignore_eos here): compare the common prefix.
    assert all(w.startswith(r.answer) and r.answer for r, w in zip(results, want)), ([r.answer for r in results], want)


def test_a_restart_serves_the_new_weights(server, folders):
    """The weight sync of a server that cannot load in place: greedy output then equals transformers'
    for the new checkpoint, and completions carry the new weight version."""
    before = server.generate(PROMPTS, GREEDY)
    server.update_weights_from_disk(folders[1], weight_version="7")
    after = server.generate(PROMPTS, GREEDY)
    assert [list(r[0].token_ids) for r in after] == tiny.hf_greedy_texts(folders[1], PROMPTS, 12)
    assert [list(r[0].token_ids) for r in after] != [list(r[0].token_ids) for r in before]
    assert {r[0].weight_version for r in after} == {"7"}
    server.update_weights_from_disk(folders[0], weight_version="8")  # Back, for tests that run after.


@pytest.mark.slow
def test_an_adaptation_round_with_sglang_jax_proposing(server, folders, tmp_path):
    """launch.adapt with the proposer served by sglang-jax ('label=URL|tokenizer folder'): two rounds of
    two proposals, each one recorded with the completion the server sampled."""
    from hljax.loop import records as rec

    run = str(tmp_path / "adapt")
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT}
    argv = [sys.executable, "-m", "launch.adapt", "--config", os.path.join(ROOT, "configs/adapt_tiny.py"),
            f"--config.run_dir={run}", "--config.tasks.families=('aiw',)", "--config.adapt.rounds=2",
            "--config.adapt.proposals=2", "--config.report.html=False", "--config.adapt.max_new_tokens=64",
            f"--config.proposers=('sj={server.url}|{folders[0]}',)"]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    rounds = rec.RunStore(os.path.join(run, "sj", "rg_aiw", "run0")).rounds()
    assert [r.round for r in rounds] == [0, 1]
    assert all(len(r.candidates) == 2 and all(c.completion for c in r.candidates) for r in rounds)


@pytest.mark.slow
def test_grpo_steps_with_sglang_jax_rollouts(tmp_path):
    """launch.train with rollout.backend=sglang_jax: two GRPO steps, each followed by a restart on the
    trainer's export. The sampled tokens' log-probs equal the trainer's recomputed ones at every step,
    so the server sampled from the trainer's weights after each sync."""
    import json

    run = str(tmp_path / "grpo")
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT}
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(ROOT, "configs/tiny.py"),
            f"--config.run_dir={run}", "--config.model.preset=tiny-hd128", "--config.rollout.backend=sglang_jax",
            "--config.sft.steps=2", "--config.sft.eval_rows=0", "--config.grpo.steps=2",
            "--config.grpo.prompts_per_step=2", "--config.rollout.max_seq_len=2048", "--config.metrics.plots=False",
            "--config.metrics.backends=('jsonl',)"]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    grpo = [r for r in rows if r["stage"] == "grpo"]
    assert len(grpo) == 2 and all(r["completion_tokens"] > 0 for r in grpo)
    assert all(r["sampler_logprob_gap"] < 1e-3 for r in grpo), [r["sampler_logprob_gap"] for r in grpo]
