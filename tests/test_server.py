"""The SGLang-compatible server over real HTTP on localhost, driven by raw requests and by the client."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.client import ClientConfig, ServerError, SGLangGenerator
from hljax.generate.engine import EngineConfig
from hljax.generate.local import LocalGenerator
from hljax.generate.server import Server
from hljax.generate.types import SamplingParams
from tests import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def server(tiny_untied):
    gen = LocalGenerator.from_pretrained(tiny_untied, shd.single_device_mesh(), EngineConfig(max_seq_len=128))
    with Server(gen, tiny_untied) as s:
        yield s


def _post(url, path, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url, path):
    with urllib.request.urlopen(url + path, timeout=120) as r:
        return r.status, json.loads(r.read())


def test_generate_batch_n4_logprobs_stop(server):
    body = {"text": ["def solve", "the answer is"], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "n": 4, "sampling_seed": 1}}
    status, out = _post(server.url, "/generate", body)
    assert status == 200 and len(out) == 8
    for o in out:
        meta = o["meta_info"]
        assert len(o["output_ids"]) == meta["completion_tokens"] == len(meta["output_token_logprobs"])
        assert [t for _, t, _ in meta["output_token_logprobs"]] == o["output_ids"]
        assert meta["finish_reason"]["type"] in ("stop", "length") and meta["weight_version"] == "0"
    # Prompt-major order: rows 0-3 answer "def solve" (SGLang's order for parallel samples).
    assert {o["meta_info"]["prompt_tokens"] for o in out[:4]} == {len(server.app.tokenizer.encode("def solve"))}

    status, greedy = _post(server.url, "/generate", {"text": "def solve", "sampling_params":
                                                     {"max_new_tokens": 12, "temperature": 0}})
    assert status == 200 and isinstance(greedy, dict)
    stop = greedy["text"][4:7]
    status, cut = _post(server.url, "/generate", {"text": "def solve", "sampling_params":
                                                  {"max_new_tokens": 12, "temperature": 0, "stop": [stop]}})
    assert cut["text"] == greedy["text"][: greedy["text"].index(stop)]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_openai_endpoints(server):
    status, out = _post(server.url, "/v1/completions", {"prompt": ["def solve", "the answer"], "max_tokens": 3, "n": 2,
                                                         "temperature": 0.5, "logprobs": 1})
    assert status == 200 and out["object"] == "text_completion" and len(out["choices"]) == 4
    assert len(out["choices"][0]["logprobs"]["token_logprobs"]) == 3
    generated = [len(c["logprobs"]["token_logprobs"]) for c in out["choices"]]
    assert all(1 <= g <= 3 for g in generated) and out["usage"]["completion_tokens"] == sum(generated)
    status, out = _post(server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(out["choices"][0]["message"]["content"], str)


def test_bad_requests_get_400_and_the_server_keeps_serving(server):
    cases = [
        (None, b"{not json"),
        ({"text": "x", "sampling_params": {"max_new_tokens": "ten"}}, None),
        ({"text": "x", "sampling_params": {"temprature": 0.5}}, None),
        ({"text": 5}, None),
        ({"input_ids": [1, 2, 999]}, None),
        ({"text": "x" * 50, "sampling_params": {"max_new_tokens": 120}}, None),
        ({"text": "x", "input_ids": [1]}, None),
        ({"text": "x", "stream": True}, None),
    ]
    for body, raw in cases:
        status, out = _post(server.url, "/generate", body, raw)
        assert status == 400, (body, out)
        assert out["error"]["message"]
    _, msg = _post(server.url, "/generate", {"text": "x", "sampling_params": {"temprature": 0.5}})
    assert "temprature" in msg["error"]["message"]
    assert _get(server.url, "/health")[0] == 200


def test_client_and_weight_updates(server, tiny_untied, tmp_path):
    client = SGLangGenerator(server.url, tokenizer=server.app.tokenizer,
                             config=ClientConfig(max_retries=1, backoff_s=0.05))
    client.wait_until_ready(30)
    sp = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = client.generate(["def solve"], sp)[0][0]
    local = server.app.generator.generate(["def solve"], sp)[0][0]
    assert before.token_ids == local.token_ids and before.text == local.text

    other = tiny.save_hf_qwen3(tmp_path / "other", tie=False, rope="yarn", seed=1)
    exported = hf.save_hf(hf.load_hf(other), str(tmp_path / "export"))
    client.update_weights_from_disk(exported, weight_version="7")
    after = client.generate(["def solve"], sp)[0][0]
    assert after.weight_version == "7" and client.model_info()["weight_version"] == "7"
    assert after.token_ids != before.token_ids

    with pytest.raises(ServerError, match="did not take the weights at /nonexistent"):
        client.update_weights_from_disk("/nonexistent", weight_version="8")
    again = client.generate(["def solve"], sp)[0][0]
    assert again.token_ids == after.token_ids and again.weight_version == "7"

    client.update_weights_from_disk(tiny_untied, weight_version="9")
    assert client.generate(["def solve"], sp)[0][0].token_ids == before.token_ids


def test_a_route_under_another_method_is_405_and_an_unknown_one_404(server):
    """What SGLangGenerator.servers_without_weight_updates asks (FastAPI answers the same way)."""
    for path, code in (("/update_weights_from_disk", 405), ("/no_such_route", 404)):
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(server.url, path)
        assert e.value.code == code
    assert SGLangGenerator(server.url).servers_without_weight_updates() == []


def test_concurrent_clients_are_all_answered(server):
    client = SGLangGenerator(server.url)
    results = {}

    def ask(i):
        results[i] = client.generate([f"prompt {i}"], SamplingParams(max_new_tokens=4, temperature=0.0))[0][0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(6))
    solo = client.generate(["prompt 3"], SamplingParams(max_new_tokens=4, temperature=0.0))[0][0]
    assert results[3].token_ids == solo.token_ids


def test_client_retries_then_names_the_server():
    client = SGLangGenerator("http://127.0.0.1:9", config=ClientConfig(max_retries=2, backoff_s=0.01))
    with pytest.raises(ServerError, match=r"http://127\.0\.0\.1:9/generate: failed after 3 attempt"):
        client.generate(["x"], SamplingParams(max_new_tokens=2))
    assert np.isfinite(0)


# ----- launch.serve: bad inputs are one line, before JAX or the model loads -----


def _serve(*argv) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launch.serve", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    return proc, time.monotonic() - start


def test_serve_a_missing_model_is_one_line_in_seconds():
    proc, elapsed = _serve("--model", "/nonexist")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("launch.serve: error: --model='/nonexist': no such directory"), lines[0]
    assert elapsed < 5, elapsed


def test_serve_a_port_in_use_is_reported_before_the_model_loads(tiny_untied):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        proc, elapsed = _serve("--model", tiny_untied, "--port", str(port))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], proc.stderr
    assert elapsed < 5, elapsed


def test_ignore_eos_min_new_tokens_and_context_errors(server):
    greedy = {"max_new_tokens": 20, "temperature": 0}
    status, out = _post(server.url, "/generate", {"text": "def solve", "sampling_params": {**greedy, "ignore_eos": True}})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 20
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    status, out = _post(server.url, "/generate", {"text": "def solve", "sampling_params": {**greedy, "min_new_tokens": 7}})
    assert status == 200 and out["meta_info"]["completion_tokens"] >= 7
    for bad in ({"ignore_eos": "yes"}, {"min_new_tokens": 21}, {"min_new_tokens": -1}):
        status, out = _post(server.url, "/generate", {"text": "x", "sampling_params": {**greedy, **bad}})
        assert status == 400, bad
    # The context is the model's max_position_embeddings (128); the errors name the numbers, as SGLang's do.
    status, out = _post(server.url, "/generate", {"input_ids": [5] * 130, "sampling_params": {"max_new_tokens": 1}})
    assert status == 400
    assert "The input (130 tokens) is longer than the model's context length (128 tokens)" in out["error"]["message"]
    status, out = _post(server.url, "/generate", {"input_ids": [5] * 50, "sampling_params": {"max_new_tokens": 100}})
    assert status == 400
    assert ("maximum context length of 128 tokens. You requested a total of 150 tokens: 50 tokens from the input "
            "messages and 100 tokens for the completion") in out["error"]["message"]
    status, out = _post(server.url, "/v1/completions", {"prompt": "def", "max_tokens": 6, "temperature": 0,
                                                         "ignore_eos": True, "min_tokens": 6})
    assert status == 200 and out["usage"]["completion_tokens"] == 6


def test_model_and_server_info_and_prefill_counts(server):
    status, info = _get(server.url, "/get_model_info")
    assert status == 200 and info["is_generation"] is True and info["model_path"] == server.app.model_path
    assert info["model_type"] == "qwen3" and info["architectures"] == ["Qwen3ForCausalLM"]
    status, before = _get(server.url, "/get_server_info")
    assert status == 200 and before["context_length"] == 128 and before["port"] == int(server.url.rsplit(":", 1)[1])
    assert before["max_running_requests"] == 16 and before["share_prefixes"] is True
    ids = [7, 8, 9, 10, 11]
    status, out = _post(server.url, "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": 3, "temperature": 1.0, "n": 4, "sampling_seed": 2}})
    assert status == 200 and len(out) == 4
    after = _get(server.url, "/get_server_info")[1]
    delta = {k: after["internal_states"][0][k] - before["internal_states"][0][k]
             for k in ("prompt_tokens_received", "prompt_tokens_prefilled", "rows")}
    assert delta == {"prompt_tokens_received": 20, "prompt_tokens_prefilled": 5, "rows": 4}


def test_a_request_joins_the_running_batch_over_http(server, monkeypatch):
    """A short request sent while a long one decodes joins it and finishes first; both equal their
    outputs served alone. The runner is held after its first chunk until the short one is queued."""
    runner = server.app.runner
    batcher = runner.batcher
    started, queued, order = threading.Event(), threading.Event(), []
    step = batcher.step

    def held_step():
        completed = step()
        order.extend(len(t.outputs[0].token_ids) for t in completed)
        if batcher.chunks >= 1 and not started.is_set():
            started.set()
            assert queued.wait(60)
        return completed

    monkeypatch.setattr(batcher, "step", held_step)
    bodies = {"long": {"text": "def solve", "sampling_params": {"max_new_tokens": 100, "temperature": 0,
                                                                "ignore_eos": True}},
              "short": {"text": "the answer", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}}
    results = {}
    post = lambda name: results.__setitem__(name, _post(server.url, "/generate", bodies[name]))  # noqa: E731
    threads = {name: threading.Thread(target=post, args=(name,)) for name in bodies}
    threads["long"].start()
    assert started.wait(60)
    threads["short"].start()
    for _ in range(600):
        if runner.queued:
            break
        threading.Event().wait(0.05)
    queued.set()
    for t in threads.values():
        t.join(120)
    assert order == [len(results["short"][1]["output_ids"]), 100], order
    for name, body in bodies.items():
        assert results[name][0] == 200
        assert _post(server.url, "/generate", body)[1]["output_ids"] == results[name][1]["output_ids"]
