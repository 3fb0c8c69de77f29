"""The JAX engine against transformers on the same tiny random weights."""

import copy

import numpy as np
import pytest
import torch
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.engine import Engine, EngineConfig, Request, RequestError
from hljax.generate.local import LocalGenerator
from hljax.generate.types import SamplingParams
from hljax.mesh import MeshConfig

LENGTHS = [5, 17, 9, 1, 30]


@pytest.fixture(scope="module")
def setup(tiny_untied):
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_untied)
    mesh = shd.single_device_mesh()
    engine = Engine(hf.load_hf(tiny_untied, mesh), mesh, EngineConfig(max_batch=8, max_seq_len=256), tok)
    rng = np.random.default_rng(0)
    prompts = [tuple(rng.integers(3, 160, n).tolist()) for n in LENGTHS]
    return ref, tok, engine, prompts


def _hf_greedy(ref, prompt, n):
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _hf_logprobs(ref, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = ref(ids).logits[0, len(prompt) - 1 : -1].double()
    lsm = torch.log_softmax(logits / temperature, dim=-1)
    return lsm[torch.arange(len(completion)), torch.tensor(completion)].numpy()


def test_greedy_matches_transformers_in_a_left_padded_batch(setup):
    ref, _, engine, prompts = setup
    sp = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=())
    # The model's EOS (id 2) would stop us but not HF (eos_token_id=None): drop rows that hit it.
    outs = engine.generate([Request(p, sp) for p in prompts])
    for p, o in zip(prompts, outs):
        want = _hf_greedy(ref, p, 24)
        if 2 in want:
            want = want[: want.index(2) + 1]
        assert o.token_ids == want


def test_greedy_on_a_sharded_mesh_equals_single_device(setup, tiny_untied):
    _, tok, engine, prompts = setup
    sp = SamplingParams(max_new_tokens=12, temperature=0.0)
    want = [o.token_ids for o in engine.generate([Request(p, sp) for p in prompts])]
    mesh = shd.make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    sharded = Engine(hf.load_hf(tiny_untied, mesh), mesh, EngineConfig(max_batch=8, max_seq_len=256), tok)
    assert [o.token_ids for o in sharded.generate([Request(p, sp) for p in prompts])] == want


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 20, 0.9)])
def test_sampled_logprobs_equal_teacher_forced_transformers(setup, temperature, top_k, top_p):
    ref, _, engine, prompts = setup
    sp = SamplingParams(max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    for p, o in zip(prompts, engine.generate([Request(p, sp) for p in prompts])):
        assert len(o.token_ids) == len(o.logprobs) > 0
        np.testing.assert_allclose(o.logprobs, _hf_logprobs(ref, p, o.token_ids, temperature), atol=1e-4)


def test_seeds_reproduce_across_batches_and_differ_between_seeds(setup):
    _, _, engine, prompts = setup
    sp = lambda s: SamplingParams(max_new_tokens=16, temperature=1.0, seed=s)  # noqa: E731
    alone = engine.generate([Request(prompts[1], sp(5))])[0].token_ids
    in_batch = engine.generate([Request(prompts[0], sp(1)), Request(prompts[1], sp(5)), Request(prompts[2], sp(2))])
    assert in_batch[1].token_ids == alone
    others = [engine.generate([Request(prompts[1], sp(s))])[0].token_ids for s in (6, 7, 8)]
    assert all(o != alone for o in others)


def test_stop_token_ids_stop_strings_and_per_row_lengths(setup):
    _, tok, engine, prompts = setup
    greedy = engine.generate([Request(prompts[2], SamplingParams(max_new_tokens=20, temperature=0.0))])[0]
    stop_id = greedy.token_ids[6]
    first = greedy.token_ids.index(stop_id)
    out = engine.generate([Request(prompts[2], SamplingParams(max_new_tokens=20, temperature=0.0,
                                                              stop_token_ids=(stop_id,)))])[0]
    assert out.token_ids == greedy.token_ids[: first + 1] and out.finish_reason == "stop" and out.matched == stop_id

    text = greedy.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    out = engine.generate([Request(prompts[2], SamplingParams(max_new_tokens=20, temperature=0.0, stop=(stop,)))])[0]
    assert out.finish_reason == "stop" and out.matched == stop
    assert out.text == text[: text.index(stop)]
    assert stop in tok.decode(out.token_ids) and stop not in tok.decode(out.token_ids[:-1])

    mixed = engine.generate([Request(p, SamplingParams(max_new_tokens=m, temperature=0.0))
                             for p, m in zip(prompts, [1, 3, 7, 2, 5])])
    for o, m in zip(mixed, [1, 3, 7, 2, 5]):
        assert len(o.token_ids) == m or o.finish_reason == "stop"


def test_requests_over_the_context_are_rejected(setup):
    _, _, engine, prompts = setup
    # max_seq_len=256 is capped by the model's max_position_embeddings (128), as SGLang's --context-length.
    assert engine.context_length == 128
    with pytest.raises(RequestError, match=r"maximum context length of 128 tokens\. You requested a total of 305 "
                                           r"tokens: 5 tokens from the input messages and 300 tokens"):
        engine.generate([Request(prompts[0], SamplingParams(max_new_tokens=300))])
    with pytest.raises(RequestError, match=r"The input \(130 tokens\) is longer than the model's context length "
                                           r"\(128 tokens\)"):
        engine.generate([Request((5,) * 130, SamplingParams(max_new_tokens=1))])
    with pytest.raises(RequestError, match=r"token ids must be in \[0, 160\)"):
        engine.generate([Request((5, 999), SamplingParams(max_new_tokens=3))])


def test_local_generator_n_samples_and_chat(setup):
    _, tok, engine, _ = setup
    tok = copy.deepcopy(tok)  # The chat template is changed below.
    gen = LocalGenerator(engine, tok)
    out = gen.generate(["def solve", "the answer"], SamplingParams(max_new_tokens=8, seed=3), n=4,
                       return_logprobs=True)
    assert [len(row) for row in out] == [4, 4]
    assert len({c.token_ids for c in out[0]}) > 1, "the n copies must get distinct seeds"
    again = gen.generate(["def solve"], SamplingParams(max_new_tokens=8, seed=3), n=4)
    assert [c.token_ids for c in again[0]] == [c.token_ids for c in out[0]]
    assert out[0][0].prompt_tokens == len(tok.encode("def solve"))
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for row in out for c in row)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    (chat,) = gen.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=4, temperature=0.0))
    (plain,) = gen.generate(["user: hi\nassistant:"], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert chat[0].token_ids == plain[0].token_ids


@pytest.mark.parametrize("cpu_kernels", ["auto", "off"])
def test_bf16_weights_follow_transformers_on_the_same_rounded_weights(tiny_untied, cpu_kernels):
    # bf16 weights: with the CPU kernels the activations run in fp32 and the KV cache in bf16; on XLA
    # alone everything is bf16. Reference: transformers in fp64 on the same bf16-rounded weights, fed
    # our tokens; each of our tokens must be (near) its argmax and our logprobs close to its own.
    import jax.numpy as jnp

    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_untied, attn_implementation="eager").eval()
    ref = ref.to(torch.bfloat16).to(torch.float64)
    mesh = shd.single_device_mesh()
    engine = Engine(hf.load_hf(tiny_untied, mesh, dtype=jnp.bfloat16), mesh,
                    EngineConfig(max_batch=8, max_seq_len=256, cpu_kernels=cpu_kernels))
    rng = np.random.default_rng(3)
    prompts = [tuple(rng.integers(3, 160, n).tolist()) for n in LENGTHS]
    sp = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
    tol = 0.03 if engine.kernels else 0.15  # bf16 activations round every op; fp32 ones only the weights and cache.
    for p, o in zip(prompts, engine.generate([Request(p, sp) for p in prompts])):
        ids = torch.tensor([list(p) + o.token_ids])
        with torch.no_grad():
            lsm = torch.log_softmax(ref(ids).logits[0, len(p) - 1 : -1], dim=-1).numpy()
        ours = lsm[np.arange(len(o.token_ids)), o.token_ids]
        assert np.all(ours >= lsm.max(-1) - 2 * tol), (ours, lsm.max(-1))
        np.testing.assert_allclose(o.logprobs, ours, atol=tol)
