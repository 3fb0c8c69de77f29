"""Mainline SGLang's weight push, end to end, against a real mainline SGLang 0.5.23 server on CPU.

Opt-in, not in CI (the server's venv is ~2.5 GB and its start-up ~1 min on 2 cores):

    HLJAX_SGLANG_MAINLINE=1 .venv/bin/python -m pytest tests/test_sglang_mainline.py -q

The first run makes the server's venv (scripts/sglang_mainline.sh setup: a few minutes; later runs find
it done). That venv is off SGLang's documented path (FACTS.md, "Real SGLang on this kind of machine"):
CPU torch, the sglang wheel without its CUDA dependencies, and test-only stand-ins for `sgl_kernel` and
`torchvision` (tests/sglang_stubs/).

What runs is the trainer's weight sync (`Rollouts.sync`): `hf.save_hf` of a model built by hljax into one
sync folder (replaced on every sync), then `SGLangGenerator.update_weights_from_disk` of that folder with
a new weight version. The reference is transformers' greedy decoding of the very folder pushed.
"""

import os
import signal
import socket
import subprocess

import pytest
import transformers

from hljax import sharding as shd
from hljax.checkpoint import hf, presets
from hljax.generate.client import SGLangGenerator
from hljax.generate.http import ClientConfig, ServerError
from hljax.generate.types import SamplingParams
from hljax.models import registry
from hljax.models.config import ModelConfig
from hljax.preflight import check_weight_updates
from hljax.rl.run_config import WRITER
from tests import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sglang_mainline.sh")
SETUP_S = 1200  # A first setup installs ~2.5 GB (about 4 min here); later ones return at once.
READY_S = 600  # Start-up took 42-70 s on 2 CPU cores; far longer when the machine is busy.

pytestmark = [pytest.mark.sglang_mainline, pytest.mark.timeout(SETUP_S + READY_S + 600),
              pytest.mark.skipif(os.environ.get("HLJAX_SGLANG_MAINLINE") != "1",
                                 reason="opt-in: HLJAX_SGLANG_MAINLINE=1 runs mainline SGLang on CPU "
                                        "(its venv: scripts/sglang_mainline.sh setup, ~2.5 GB)")]

PROMPTS = ["def solve(question, solver):", "The answer is"]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


def _model(seed: int):
    """The embedded default's shape, built by hljax, with untied embeddings: tied, a random tiny Qwen3
    greedily repeats the prompt's last token whatever its weights, so two seeds would decode alike."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(presets.TOKENIZER_DIR)
    ids = tokenizer.convert_tokens_to_ids
    cfg = ModelConfig.tiny(-(-len(tokenizer) // 64) * 64, tie_word_embeddings=False,
                           eos_token_ids=(ids("<|im_end|>"), ids("<|endoftext|>")), pad_token_id=ids("<|endoftext|>"))
    return registry.create(cfg, shd.make_mesh(), seed=seed)


def _export(model, sync_dir: str) -> str:
    """What `Rollouts.sync` writes before each push: the sync folder, replaced whole."""
    return hf.save_hf(model, sync_dir, dtype="float32", source_dir=presets.TOKENIZER_DIR, writer=WRITER, replace=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 6000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


@pytest.fixture(scope="module")
def models():
    return {"A": _model(0), "B": _model(1)}


@pytest.fixture(scope="module")
def sync_dir(models, tmp_path_factory):
    """The sync folder, holding A's export: what the server starts on."""
    return _export(models["A"], str(tmp_path_factory.mktemp("sglang_mainline") / "sync"))


@pytest.fixture(scope="module")
def want_a(sync_dir):
    return tiny.hf_greedy_texts(sync_dir, PROMPTS)


@pytest.fixture(scope="module")
def server(sync_dir, want_a, tmp_path_factory):
    """A mainline SGLang server on the sync folder (A), started by scripts/sglang_mainline.sh; its log is
    shown when it does not come up. Killed (its whole process group) at the end."""
    logs = tmp_path_factory.mktemp("sglang_mainline_log")
    setup_log = str(logs / "setup.log")
    with open(setup_log, "w") as out:
        try:
            done = subprocess.run([SCRIPT, "setup"], stdout=out, stderr=subprocess.STDOUT, timeout=SETUP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"scripts/sglang_mainline.sh setup took over {SETUP_S} s; its log:\n{_tail(setup_log)}")
    assert done.returncode == 0, f"scripts/sglang_mainline.sh setup failed; its log:\n{_tail(setup_log)}"

    port = _free_port()
    log = str(logs / "server.log")
    with open(log, "w") as out:
        proc = subprocess.Popen([SCRIPT, "serve", sync_dir, "--host", "127.0.0.1", "--port", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(sync_dir)
        client = SGLangGenerator(f"http://127.0.0.1:{port}", tokenizer, ClientConfig(timeout_s=300, max_retries=1))

        def died(what: str) -> None:
            if proc.poll() is not None:
                raise ServerError(f"mainline SGLang exited with {proc.returncode} ({what})")

        try:
            client.wait_until_ready(READY_S, name="mainline SGLang", stop=died)
        except ServerError as e:
            pytest.fail(f"{e}; its log ({log}):\n{_tail(log)}")
        yield client
    finally:
        _stop(proc)
        print(f"mainline SGLang log: {log}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher, which takes its scheduler and detokenizer down with it; then SIGKILL to
    whatever is left of its process group (started with start_new_session: the group is the server's)."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tokens(rows) -> list[list[int]]:
    return [list(r[0].token_ids) for r in rows]


def test_greedy_tokens_equal_transformers(server, want_a):
    assert _tokens(server.generate(PROMPTS, GREEDY)) == want_a
    ids = [server.tokenizer(p).input_ids for p in PROMPTS]
    assert _tokens(server.generate_ids(ids, GREEDY)) == want_a


def test_the_client_sees_a_server_that_takes_weights(server):
    """What the trainer's preflight and `Rollouts` ask before the first push."""
    assert server.servers_without_weight_updates() == []  # GET /update_weights_from_disk: 405, not 404.
    check_weight_updates(server.url, "rollout.url")  # Raises PreflightError if the server had none.
    info = server.model_info()  # /model_info (mainline has it; /get_model_info is deprecated there).
    assert info["is_generation"] and info["model_type"] == "qwen3" and "weight_version" in info
    # --enable-deterministic-inference refuses torch_native attention: seeds are not honoured here.
    assert server.servers_ignoring_seeds() == [server.url]


def test_a_weight_push_serves_the_new_weights(server, models, sync_dir, want_a):
    """Two syncs the trainer's way (export into the sync folder, push it with a new version): after each,
    greedy tokens equal transformers' on the folder pushed, and the weight version moved."""
    before = server.model_info()["weight_version"]
    _export(models["B"], sync_dir)
    want_b = tiny.hf_greedy_texts(sync_dir, PROMPTS)
    assert want_b != want_a  # The two weight sets decode differently, so the check below can fail.
    server.update_weights_from_disk(sync_dir, weight_version="1")
    info = server.model_info()
    assert info["weight_version"] == "1" != before
    assert info["model_path"] == sync_dir
    after = server.generate(PROMPTS, GREEDY)
    assert _tokens(after) == want_b
    assert {r[0].weight_version for r in after} == {"1"}

    _export(models["A"], sync_dir)  # The next step's sync: same folder, replaced again.
    server.update_weights_from_disk(sync_dir, weight_version="2")
    assert server.model_info()["weight_version"] == "2"
    back = server.generate(PROMPTS, GREEDY)
    assert _tokens(back) == want_a
    assert {r[0].weight_version for r in back} == {"2"}


def test_a_push_of_a_missing_folder_is_an_error_naming_the_server(server, want_a, tmp_path):
    """A failed load is reported (success false), not taken silently, and the old weights stay served."""
    version = server.model_info()["weight_version"]
    with pytest.raises(ServerError, match="did not take the weights"):
        server.update_weights_from_disk(str(tmp_path / "nothing-here"), weight_version="broken")
    assert server.model_info()["weight_version"] == version
    assert _tokens(server.generate(PROMPTS, GREEDY)) == want_a  # The sync folder holds A again by now.
