"""SGLangGenerator over several servers: requests spread to all, weights reach all, a dead one is named."""

import collections

import pytest

from hljax import sharding as shd
from hljax.checkpoint import hf
from hljax.generate.client import ClientConfig, ServerError, SGLangGenerator, parse_urls
from hljax.generate.engine import EngineConfig
from hljax.generate.local import LocalGenerator
from hljax.generate.server import Server
from hljax.generate.types import SamplingParams
from tests import tiny


@pytest.fixture(scope="module")
def two_servers(tiny_untied):
    """Two embedded servers on their own ports, each counting the /generate requests it answers."""
    servers, hits = [], collections.Counter()
    try:
        for _ in range(2):
            gen = LocalGenerator.from_pretrained(tiny_untied, shd.single_device_mesh(), EngineConfig(max_seq_len=128))
            s = Server(gen, tiny_untied).start()
            route = s.app.routes[("POST", "/generate")]

            def counted(body, route=route, url=s.url):
                hits[url] += 1
                return route(body)

            s.app.routes[("POST", "/generate")] = counted
            servers.append(s)
        yield servers, hits
    finally:
        for s in servers:
            s.stop()


def test_parse_urls():
    assert parse_urls("http://a:1/, http://b:2") == ("http://a:1", "http://b:2")
    for bad in ("", "http://a:1,,http://b:2", ["http://a:1", "http://a:1/"]):
        with pytest.raises(ValueError):
            parse_urls(bad)


def test_requests_and_weights_reach_every_server(two_servers, tiny_untied, tmp_path):
    servers, hits = two_servers
    urls = [s.url for s in servers]
    client = SGLangGenerator(",".join(urls), servers[0].app.tokenizer, ClientConfig(max_retries=0))
    client.wait_until_ready(30)
    single = SGLangGenerator(urls[0], servers[0].app.tokenizer)
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    hits.clear()
    spread = client.generate(["def solve", "the answer is"], sp, n=2)
    assert set(hits) == set(urls), hits  # One call of 4 rows was split across both servers.
    # Per-row seeds: the same completions as one server gives.
    alone = single.generate(["def solve", "the answer is"], sp, n=2)
    assert [[c.token_ids for c in g] for g in spread] == [[c.token_ids for c in g] for g in alone]

    other = tiny.save_hf_qwen3(tmp_path / "other", tie=False, rope="yarn", seed=1)
    exported = hf.save_hf(hf.load_hf(other), str(tmp_path / "export"))
    client.update_weights_from_disk(exported, weight_version="5")
    assert [client.model_info(u)["weight_version"] for u in urls] == ["5", "5"]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    outs = [SGLangGenerator(u).generate(["def solve"], greedy)[0][0] for u in urls]
    assert outs[0].token_ids == outs[1].token_ids and {o.weight_version for o in outs} == {"5"}
    client.update_weights_from_disk(tiny_untied, weight_version="6")  # Back to the fixture's weights.


def test_a_server_down_is_named(two_servers, tiny_untied):
    servers, _ = two_servers
    dead = "http://127.0.0.1:9"  # Port 9 (discard): nothing listens there.
    client = SGLangGenerator([servers[0].url, dead], servers[0].app.tokenizer,
                             ClientConfig(max_retries=1, backoff_s=0.01))
    with pytest.raises(ServerError, match=r"http://127\.0\.0\.1:9 did not take the weights at .*\(1 other server") as e:
        client.update_weights_from_disk(tiny_untied, weight_version="7")
    assert servers[0].url + " did not" not in str(e.value)
    assert client.model_info(servers[0].url)["weight_version"] == "7"  # The live one did load them.
    with pytest.raises(ServerError, match=r"127\.0\.0\.1:9'\] not ready"):
        client.wait_until_ready(1, poll_s=0.2)
    with pytest.raises(ServerError, match=r"http://127\.0\.0\.1:9/generate: failed after 2 attempt"):
        client.generate(["a", "b"], SamplingParams(max_new_tokens=2))


def _reply(ids, entries):
    return {"text": "", "output_ids": ids, "meta_info": {"finish_reason": {"type": "length"}, "prompt_tokens": 3,
                                                         "output_token_logprobs": entries}}


def test_logprobs_are_paired_with_their_own_tokens():
    """sglang-jax 0.1.0rc0 puts each 50-token flush's entries before the whole list: the reply's are the
    last ones; entries whose token ids do not match the reply's are an error, never a misalignment."""
    from hljax.generate.client import _completion
    from hljax.generate.http import ServerError

    ids = [7, 8, 9]
    whole = [[-0.1, 7, "a"], [-0.2, 8, "b"], [-0.3, 9, "c"]]
    assert _completion(_reply(ids, whole), True).logprobs == (-0.1, -0.2, -0.3)
    assert _completion(_reply(ids, whole[:2] + whole), True).logprobs == (-0.1, -0.2, -0.3)
    for bad in (whole[:2], [[-0.1, 7, "a"], [-0.2, 9, "c"], [-0.3, 8, "b"]], whole + whole[:1]):
        with pytest.raises(ServerError, match="do not match"):
            _completion(_reply(ids, bad), True)
    assert _completion(_reply(ids, []), False).logprobs is None
    # At times output_ids carry a flush's ids before the whole list too: completion_tokens says how many are the reply's.
    dup = _reply(ids[:2] + ids, whole[:2] + whole)
    dup["meta_info"]["completion_tokens"] = 3
    c = _completion(dup, True)
    assert (c.token_ids, c.logprobs) == ((7, 8, 9), (-0.1, -0.2, -0.3))
    # ...or a flush repeated inside them (measured: ids[100:150] repeating ids[50:100] of a 120-token reply,
    # the log-probs' ids the ones its text decodes to): then the log-probs' ids are the reply's.
    inside = _reply([7, 8, 8, 9], whole)
    inside["meta_info"]["completion_tokens"] = 3
    c = _completion(inside, True)
    assert (c.token_ids, c.logprobs) == ((7, 8, 9), (-0.1, -0.2, -0.3))
    with pytest.raises(ServerError, match="repeated part of its reply"):
        _completion(inside, False)


def test_which_servers_honour_seeds_is_read_from_their_flags(two_servers):
    from hljax.generate.client import SGLangGenerator, _honours_seeds

    servers, _ = two_servers
    assert SGLangGenerator([s.url for s in servers]).servers_ignoring_seeds() == []  # Ours always do.
    assert not _honours_seeds({"enable_deterministic_sampling": False})  # sglang-jax without its flag.
    assert not _honours_seeds({"enable_deterministic_inference": False, "host": "x"})  # SGLang without its flag.
    assert _honours_seeds({"enable_deterministic_inference": True})
