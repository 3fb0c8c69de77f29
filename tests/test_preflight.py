"""Start-up checks (hljax/preflight.py) and one-line start-up errors (launch/common.py).

Each bad input runs the launcher as a user does (`python -m launch.train ...`); it must exit non-zero
within 20 s with exactly one line on stderr and no traceback. They run one at a time, so that each
time is the launcher's own; most of it is importing JAX and transformers (about 4 s on 2 cores).
"""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from hljax import preflight
from hljax.models.config import ModelConfig
from sandbox.config import SandboxConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "hljax", "assets", "tokenizer")
LIMIT_S = 20.0
# A closed local port: connection refused at once (nothing listens on the discard port).
DEAD_URL = "http://127.0.0.1:9"


def _hf_folder(path, model_type="qwen3") -> str:
    """A config.json (of `model_type`) and a one-tensor model.safetensors."""
    os.makedirs(path, exist_ok=True)
    hf = ModelConfig.tiny(256).to_hf_dict()
    hf["model_type"] = model_type
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
    save_file({"model.embed_tokens.weight": np.zeros((256, 128), np.float32)}, os.path.join(path, "model.safetensors"))
    return str(path)


def _cases(tmp) -> dict[str, tuple[list[str], dict, str]]:
    """name -> (argv after `python -m`, extra environment, a phrase the error line must contain)."""
    run = ["--config.run_dir", os.path.join(tmp, "run")]
    tiny = ["launch.train", "--config", "configs/tiny.py", *run]
    llama = _hf_folder(os.path.join(tmp, "llama"), "llama")
    broken = os.path.join(tmp, "broken_config.py")
    with open(broken, "w") as f:
        f.write("def get_config():\n    raise ValueError('tasks.families: no such family')\n")
    blocker = os.path.join(tmp, "a-file")
    with open(blocker, "w") as f:
        f.write("in the way")
    return {
        "config file missing": (["launch.train", "--config", "configs/no_such_config.py"], {}, "no such file"),
        "model path missing": ([*tiny, "--config.model.path=/nonexist"], {}, "/nonexist"),
        "non-Qwen config.json": ([*tiny, f"--config.model.path={llama}"], {}, "model_type='llama'"),
        "config file raises": (["launch.train", "--config", broken], {}, "ValueError: tasks.families: no such family"),
        "malformed override": ([*tiny, "--config.grpo.steps=abc"], {}, "--config.grpo.steps=abc"),
        "misspelt key": ([*tiny, "--config.gpro.steps=3"], {}, "'gpro'"),
        "negative draw offset": ([*tiny, "--config.grpo.draw_offset=-4"], {}, "grpo.draw_offset must be >= 0, got -4"),
        "solver unreachable": ([*tiny, "--config.solver.backend=sglang", f"--config.solver.url={DEAD_URL}",
                                f"--config.solver.path={TOKENIZER}"], {}, "solver.url"),
        "QA file missing": (["launch.train", "--config", "configs/qa_grpo.py", *run, f"--config.model.path={llama}",
                             f"--config.solver.url={DEAD_URL}", f"--config.solver.path={TOKENIZER}",
                             "--config.tasks.qa_files=('hotpotqa:/nonexist/hotpot_train_v1.1.json',)"], {},
                            "/nonexist/hotpot_train_v1.1.json"),
        "run dir unwritable": (["launch.train", "--config", "configs/tiny.py", "--config.run_dir",
                                os.path.join(blocker, "run")], {}, "run_dir"),
        "sandbox unavailable": (tiny, {"HLJAX_BWRAP": "/nonexistent"}, "HLJAX_BWRAP"),
        "adapt: config file missing": (["launch.adapt", "--config", "configs/no_such_config.py"], {}, "no such file"),
    }


def _launch(argv, extra_env) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if k != "HLJAX_BWRAP"}
    env.update(extra_env)
    start = time.monotonic()
    # The timeout only guards against a check that lets a real run start.
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr, time.monotonic() - start


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("preflight"))
    cases = _cases(tmp)
    return {name: (*_launch(argv, env), phrase) for name, (argv, env, phrase) in cases.items()}


CASES = ["config file missing", "config file raises", "model path missing", "non-Qwen config.json", "malformed override", "misspelt key", "negative draw offset",
         "solver unreachable", "QA file missing", "run dir unwritable", "sandbox unavailable",
         "adapt: config file missing"]


@pytest.mark.slow  # All cases together: about 30 s on 2 cores.
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_within_seconds(outcomes, case):
    rc, stderr, elapsed, phrase = outcomes[case]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc != 0, stderr
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("launch.") and ": error: " in lines[0], lines[0]
    assert phrase in lines[0], lines[0]
    assert elapsed < LIMIT_S, f"{case}: {elapsed:.1f} s"


def test_verbose_shows_the_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--config", "configs/tiny.py", "--verbose",
                           f"--config.run_dir={tmp_path}/run", "--config.grpo.steps=abc"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "IllegalFlagValueError" in proc.stderr


# ----- the checks in this process -----


def test_good_tiny_config_passes(tmp_path):
    from configs import tiny
    from hljax.rl.run_config import RunConfig

    c = tiny.get_config()
    c.run_dir = str(tmp_path / "run")
    done = preflight.train(RunConfig.from_config(c))
    assert [d.split()[0] for d in done] == ["run_dir", "run_dir", "metrics.backends", "sft.data", "tasks",
                                          "model.preset", "disk", "sandbox"]
    assert os.listdir(tmp_path) == []  # The probe file is gone, and the folder made for it.


def test_evaluate_and_collect_name_the_bad_entry(tmp_path):
    from configs import adapt_tiny, collect_tiny
    from hljax.data.collect_config import CollectConfig
    from hljax.loop.run_config import EvalRunConfig

    c = adapt_tiny.get_config()
    c.run_dir = str(tmp_path / "eval")
    c.proposers = (f"tiny={_hf_folder(tmp_path / 'tiny')}", "gone=/nonexist/export")
    with pytest.raises(preflight.PreflightError, match=r"proposers\[gone\]='/nonexist/export': no such directory"):
        preflight.evaluate(EvalRunConfig.from_config(c))
    c = collect_tiny.get_config()
    c.run_dir = str(tmp_path / "collect")
    c.out = str(tmp_path / "collect" / "sft.jsonl")
    c.teacher.backend, c.teacher.api, c.teacher.url, c.teacher.model = "remote", "openai", DEAD_URL, "m"
    c.solver.path = str(tmp_path / "tiny")
    with pytest.raises(preflight.PreflightError, match="teacher.url: no answer from http://127.0.0.1:9 "):
        preflight.collect(CollectConfig.from_config(c))


def test_model_dir_and_serve_checks(tmp_path):
    good = _hf_folder(tmp_path / "qwen3")
    assert preflight.check_model_dir(good).model_type == "qwen3"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        with pytest.raises(preflight.PreflightError, match=f"cannot listen on 127.0.0.1:{port}"):
            preflight.serve(good, "127.0.0.1", port)
    assert [d.split()[0] for d in preflight.serve(good, "127.0.0.1", port)] == ["port", "model"]
    os.remove(os.path.join(good, "model.safetensors"))
    with pytest.raises(preflight.PreflightError, match="no model.safetensors"):
        preflight.check_model_dir(good)
    with open(os.path.join(good, "config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(preflight.PreflightError, match="not a JSON object"):
        preflight.check_model_dir(good)


def test_a_server_that_answers_any_status_passes():
    class Loading(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(503)  # SGLang while it loads.
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        preflight.check_server(url, "rollout.url")
        with pytest.raises(preflight.PreflightError, match=r"rollout.url: no answer from http://127.0.0.1:9/health"):
            preflight.check_server(f"{url},{DEAD_URL}", "rollout.url")
        with pytest.raises(preflight.PreflightError, match="not an http"):
            preflight.check_server("localhost:30000", "solver.url")
    finally:
        server.shutdown()
        server.server_close()


def test_disk_estimate_says_its_numbers(tmp_path, monkeypatch):
    need, why = preflight.checkpoint_bytes(4_000_000_000, "bfloat16", keep=3)
    assert need == 4_000_000_000 * 2 * (3 * 4 + 2)
    assert "4.00B params x 2 B x (3 x (checkpoint.keep=3 + 1) + 2) copies" in why
    floor, why = preflight.checkpoint_bytes(1000, "float32", keep=3)
    assert floor == preflight.DISK_FLOOR_BYTES and "floor" in why
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: type("U", (), {"free": 10**9})())
    with pytest.raises(preflight.PreflightError, match=r"1.00 GB free on its disk, the run needs about 112.00 GB"):
        preflight.check_disk(str(tmp_path), need, "x")
    preflight.check_disk(str(tmp_path), 10**8, "x")


_PROBER = """
import os, sys
from hljax import preflight
root, n = sys.argv[1], int(sys.argv[2])
bad = []
for i in range(n):
    run_dir = os.path.join(root, f"r{i}", "run")
    try:
        preflight.check_run_dir(run_dir)
        preflight.check_disk(run_dir, 1, "x")
    except preflight.PreflightError as e:
        bad.append(str(e))
print(len(bad), bad[:1])
"""


def test_processes_of_one_job_probe_the_same_new_run_dir_at_once(tmp_path):
    """Every process of a multi-process job runs preflight on the same run_dir; one removing the folders
    it made must not fail a peer that is writing its probe there (CI saw process 1 exit 2 this way)."""
    procs = [subprocess.Popen([sys.executable, "-c", _PROBER, str(tmp_path), "300"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [o.split()[0] for o in outs] == ["0"] * 3, outs
    left = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert not left, left[:3]  # Probes all removed; at most empty folders a peer's probe held stay.


def test_qa_files_and_presets(tmp_path):
    data = tmp_path / "hotpot.json"
    data.write_text("[]")
    preflight.check_qa_files([f"hotpotqa:{data}"])
    with pytest.raises(preflight.PreflightError, match="not 'dataset:path'"):
        preflight.check_qa_files([str(data)])
    with pytest.raises(preflight.PreflightError, match="unknown dataset 'hotpot'"):
        preflight.check_qa_files([f"hotpot:{data}"])
    with pytest.raises(preflight.PreflightError, match="is not a preset"):
        preflight.check_preset("tiny3")


def test_sandbox_probe_failure_is_one_line(monkeypatch):
    monkeypatch.setenv("HLJAX_BWRAP", "/bin/false")  # Executable, but no sandbox comes up.
    with pytest.raises(preflight.PreflightError) as e:
        preflight.check_sandbox(SandboxConfig())
    assert "\n" not in str(e.value) and str(e.value).startswith("the sandbox cannot start")
