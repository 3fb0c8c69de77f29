"""Generator construction (hljax/endpoints.py) and the one HTTP call (hljax/generate/http.py)."""

import http.server
import json
import threading

import pytest

from hljax import sharding as shd
from hljax.config import ServingSpec, SolverSpec
from hljax.endpoints import BACKENDS, Endpoint, GeneratorSpec, Opened, solver_spec, to_generator_spec
from hljax.generate.http import ClientConfig, ServerError, request_json
from hljax.tasks.simulated_solver import SimulatedSolver


def test_each_backend_takes_only_the_fields_it_uses():
    serving = ServingSpec(max_batch=3, max_seq_len=512, dtype="bfloat16")
    assert to_generator_spec("simulated", seed=7) == GeneratorSpec("simulated", seed=7)
    emb = to_generator_spec("embedded", url="http://ignored", serving=serving, default_path="/init")
    assert (emb.path, emb.url, emb.serving) == ("/init", "", serving)
    remote = to_generator_spec("sglang", url="http://h:1", default_path="/tokenizer")
    assert (remote.path, remote.url) == ("/tokenizer", "http://h:1")
    assert to_generator_spec("embedded_server", path="/mine", default_path="/init").path == "/mine"
    solver = solver_spec(SolverSpec(backend="simulated"), "/init", seed=3)
    assert (solver.backend, solver.path, solver.seed) == ("simulated", "", 3)


def test_bad_specs_name_what_is_wrong():
    with pytest.raises(ValueError, match="unknown generator backend 'vllm'.*embedded_server"):
        GeneratorSpec("vllm", path="/x")
    with pytest.raises(ValueError, match="needs a url"):
        GeneratorSpec("sglang")
    with pytest.raises(ValueError, match="loads no model"):
        GeneratorSpec("simulated", path="/x")
    with pytest.raises(ValueError, match="api='openai' needs"):
        GeneratorSpec("embedded", path="/x", api="openai")


def test_the_simulated_solver_is_a_backend_like_the_others():
    with Endpoint(GeneratorSpec("simulated", seed=2), shd.make_mesh()) as e:
        assert isinstance(e.generator, SimulatedSolver) and e.generator.seed == 2 and e.server is None


def test_a_registered_backend_is_opened_through_the_registry(monkeypatch):
    opened = []

    def fake(spec, mesh, tokenizer, name):
        opened.append((spec.path, name))
        return Opened(generator="fake generator")

    monkeypatch.setitem(BACKENDS, "fake", fake)
    with Endpoint(GeneratorSpec("fake", path="/weights"), shd.make_mesh(), name="solver") as e:
        assert e.generator == "fake generator"
    assert opened == [("/weights", "solver")]


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body) of the server's script."""

    def do_POST(self):
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.server.auth.append(self.headers.get("Authorization"))
        status, body = self.server.script.pop(0)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.script, server.bodies, server.auth = [], [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_request_json_retries_rate_limits_and_server_errors_not_bad_requests(flaky):
    url = f"http://127.0.0.1:{flaky.server_address[1]}/v1/x"
    config = ClientConfig(max_retries=3, backoff_s=0.01)
    flaky.script = [(429, {"error": "slow down"}), (503, {"error": "busy"}), (200, {"ok": 1})]
    assert request_json(url, "POST", {"a": 1}, config=config, headers={"Authorization": "Bearer k"}) == {"ok": 1}
    assert flaky.bodies == [{"a": 1}] * 3 and flaky.auth == ["Bearer k"] * 3
    flaky.script = [(400, {"error": "bad field"}), (200, {"ok": 2})]
    with pytest.raises(ServerError, match=r"/v1/x: HTTP 400: .*bad field"):
        request_json(url, "POST", {"a": 2}, config=config)
    assert len(flaky.bodies) == 4  # The 400 was not sent again.
