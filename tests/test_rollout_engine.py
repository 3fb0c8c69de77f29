"""The rollout engine: shared prefills, continuous batching, ignore_eos / min_new_tokens, length buckets.

References are independent: transformers (greedy tokens, teacher-forced logprobs, its own
min_new_tokens), the engine with sharing off, and each request served alone."""

import logging

import jax
import numpy as np
import pytest
import torch
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Request, bucket
from hljax.generate.local import expand
from hljax.generate.batcher import Batcher
from hljax.generate.types import SamplingParams
from tests import tiny_qwen3_5 as tq
from tests.test_generate import _hf_greedy, _hf_logprobs

P, G = 2, 4


@pytest.fixture(scope="module")
def qwen3(tiny_untied):
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_untied, mesh)
    shared = Engine(model, mesh, EngineConfig(max_batch=8, max_seq_len=128, decode_chunk=4))
    unshared = Engine(model, mesh, EngineConfig(max_batch=8, max_seq_len=128, decode_chunk=4, share_prefixes=False))
    rng = np.random.default_rng(1)
    prompts = [tuple(rng.integers(3, 160, n).tolist()) for n in (11, 23)]
    return ref, shared, unshared, prompts, model


def _prefilled(engine, requests):
    before = engine.stats.prompt_tokens_prefilled, engine.stats.prompt_tokens_received
    outs = engine.generate(requests)
    return outs, engine.stats.prompt_tokens_prefilled - before[0], engine.stats.prompt_tokens_received - before[1]


def test_n_samples_are_prefilled_once_and_equal_the_unshared_path(qwen3):
    ref, shared, unshared, prompts, _ = qwen3
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3, stop_token_ids=())
    requests = expand(prompts, sp, G)  # Prompt-major: p0 x G, p1 x G, each copy its own seed.
    outs, prefilled, received = _prefilled(shared, requests)
    assert prefilled == sum(map(len, prompts)) and received == G * sum(map(len, prompts))
    want, prefilled_unshared, _ = _prefilled(unshared, requests)
    assert prefilled_unshared == received
    for o, w, r in zip(outs, want, requests):
        assert o.token_ids == w.token_ids
        np.testing.assert_allclose(o.logprobs, w.logprobs, atol=1e-5)
        np.testing.assert_allclose(o.logprobs, _hf_logprobs(ref, r.prompt_ids, o.token_ids, 1.0), atol=1e-4)
    for p in range(P):
        group = [o.token_ids for o in outs[p * G : (p + 1) * G]]
        assert len(set(map(tuple, group))) == G, "sampled copies of one prompt must differ"
    # Identical prompts across separate requests of one batch share too.
    again, prefilled, _ = _prefilled(shared, [requests[0], requests[G], requests[1]])
    assert prefilled == sum(map(len, prompts))
    assert [o.token_ids for o in again] == [outs[0].token_ids, outs[G].token_ids, outs[1].token_ids]


def test_greedy_samples_of_a_prompt_are_equal_and_match_transformers(qwen3):
    ref, shared, _, prompts, _ = qwen3
    sp = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=())
    outs, prefilled, _ = _prefilled(shared, expand(prompts, sp, G))
    assert prefilled == sum(map(len, prompts))
    for p, prompt in enumerate(prompts):
        want = _hf_greedy(ref, prompt, 12)
        if 2 in want:  # The model's EOS stops us, not transformers (eos_token_id=None).
            want = want[: want.index(2) + 1]
        assert all(o.token_ids == want for o in outs[p * G : (p + 1) * G])


def test_more_rows_than_slots_and_a_prompt_split_across_waves(qwen3):
    """3 prompts x 3 samples over 4 slots: later rows join as slots free up; a prompt whose samples join
    in different waves is still prefilled once; every row equals the row served alone."""
    _, _, _, prompts, model = qwen3
    small = Engine(model, shd.single_device_mesh(), EngineConfig(max_batch=4, max_seq_len=128, decode_chunk=4))
    three = prompts + [prompts[0][:7]]
    requests = [Request(r.prompt_ids, SamplingParams(**{**r.sampling.__dict__, "max_new_tokens": m}))
                for r, m in zip(expand(three, SamplingParams(temperature=0.8, seed=9, stop_token_ids=()), 3),
                                [5, 9, 3, 12, 4, 7, 6, 2, 8])]
    outs, prefilled, _ = _prefilled(small, requests)
    assert prefilled == sum(map(len, three))
    assert max(o.joined_at for o in outs) > 0, "some rows must have joined a running batch"
    for o, r in zip(outs, requests):
        alone = small.generate([r])[0]
        assert o.token_ids == alone.token_ids
        np.testing.assert_allclose(o.logprobs, alone.logprobs, atol=1e-5)


def test_a_request_joins_a_running_batch_and_finishes_first(qwen3):
    _, shared, _, prompts, _ = qwen3
    long = Request(prompts[0], SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True))
    short = Request(prompts[1], SamplingParams(max_new_tokens=5, temperature=0.7, seed=4, stop_token_ids=()))
    batcher = Batcher(shared)
    t_long = batcher.add([long])
    for _ in range(3):
        batcher.step()
    assert not t_long.done and batcher.chunks == 3
    t_short = batcher.add([short])
    while not t_short.done:
        batcher.step()
    assert not t_long.done, "the short request must finish while the long one still decodes"
    while not t_long.done:
        batcher.step()
    (a,), (b,) = t_long.outputs, t_short.outputs
    assert b.joined_at == 3 and b.finished_at < a.finished_at and len(a.token_ids) == 40
    for got, r in ((a, long), (b, short)):
        alone = shared.generate([r])[0]
        assert got.token_ids == alone.token_ids
        np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=1e-5)


def test_ignore_eos_and_min_new_tokens_against_transformers(qwen3):
    ref, shared, _, prompts, _ = qwen3
    prompt = prompts[1]
    greedy = shared.generate([Request(prompt, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))])[0]
    assert len(greedy.token_ids) == 16 and greedy.finish_reason == "length"
    stop = greedy.token_ids[3]
    first = greedy.token_ids.index(stop)
    sp = dict(max_new_tokens=16, temperature=0.0, stop_token_ids=(stop,))
    cut = shared.generate([Request(prompt, SamplingParams(**sp))])[0]
    assert cut.token_ids == greedy.token_ids[: first + 1] and cut.finish_reason == "stop"
    # ignore_eos: no stop token ends the row (SGLang: neither EOS nor stop_token_ids).
    kept = shared.generate([Request(prompt, SamplingParams(**sp, ignore_eos=True))])[0]
    assert kept.token_ids == greedy.token_ids
    # min_new_tokens: stop ids are masked until then; transformers' own min_new_tokens is the reference.
    k = first + 3
    ours = shared.generate([Request(prompt, SamplingParams(**sp, min_new_tokens=k))])[0]
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           do_sample=False, max_new_tokens=16, min_new_tokens=k, eos_token_id=[stop, 2],
                           pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    want = out.sequences[0, len(prompt):].tolist()
    want = want[: next((i + 1 for i, t in enumerate(want) if t in (stop, 2)), len(want))]
    assert ours.token_ids == want and len(ours.token_ids) > k - 1
    assert stop not in ours.token_ids[:k] and 2 not in ours.token_ids[:k]
    # Logprobs are of the masked distribution, as transformers' processed scores.
    hf_lp = [torch.log_softmax(s[0].double(), -1)[t].item() for s, t in zip(out.scores, want)]
    np.testing.assert_allclose(ours.logprobs, hf_lp, atol=1e-4)


def test_qwen3_5_shared_prefill_and_continuous_batching(tmp_path):
    path = tq.save(tmp_path / "q35")
    ref = tq.causal_lm(path)
    mesh = shd.single_device_mesh()
    cfg = dict(max_batch=4, max_seq_len=128, decode_chunk=4)
    model = hf.load_hf(path, mesh, linear_chunk_size=8)
    shared, unshared = Engine(model, mesh, EngineConfig(**cfg)), Engine(model, mesh, EngineConfig(**cfg, share_prefixes=False))
    rng = np.random.default_rng(2)
    prompts = [tuple(rng.integers(3, 160, n).tolist()) for n in (13, 5)]
    requests = expand(prompts, SamplingParams(max_new_tokens=8, temperature=0.9, seed=1, stop_token_ids=()), 3)
    outs, prefilled, _ = _prefilled(shared, requests)  # 6 rows over 4 slots.
    assert prefilled == 18
    want = unshared.generate(requests)
    for o, w, r in zip(outs, want, requests):
        assert o.token_ids == w.token_ids
        np.testing.assert_allclose(o.logprobs, _hf_logprobs(ref, r.prompt_ids, o.token_ids, 0.9), atol=1e-4)
    assert len({tuple(o.token_ids) for o in outs[:3]}) == 3


def test_length_buckets():
    assert [bucket(n, 16, 4) for n in (1, 16, 17, 33, 64, 65, 100, 1000, 1025)] == \
        [16, 16, 32, 48, 64, 80, 112, 1024, 1280]
    assert [bucket(n, 1) for n in (1, 3, 8, 9)] == [1, 4, 8, 16]


def test_serving_compiles_only_the_engines_programs(qwen3, caplog):
    """Each compiled program stays resident (on a CPU ~1 MB for a 28-layer model's small ones): setting
    up the slot batch and moving host arrays must not compile an eager op per array or per shape."""
    *_, prompts, model = qwen3
    engine = Engine(model, shd.single_device_mesh(), EngineConfig(max_batch=3, max_seq_len=80, decode_chunk=3))
    requests = [Request(p, SamplingParams(max_new_tokens=7, temperature=0.5, seed=s)) for s, p in enumerate(prompts)]
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        engine.generate(requests)
        batcher = Batcher(engine)
        first = batcher.add([Request(prompts[0], SamplingParams(max_new_tokens=8, ignore_eos=True))])
        batcher.step()
        # More token columns than the running state has: it grows under the running row.
        second = batcher.add([Request(prompts[1], SamplingParams(max_new_tokens=40, ignore_eos=True))])
        while not (first.done and second.done):
            batcher.step()
    compiled = {m.split("jit(", 1)[1].split(")", 1)[0] for m in caplog.messages if m.startswith("Compiling jit(")}
    assert {"insert", "decode_chunk", "grow"} <= compiled  # (A prefill of these prompts may be cached.)
    assert compiled <= {"empty_state", "grow", "prefill", "insert", "decode_chunk"}, compiled
