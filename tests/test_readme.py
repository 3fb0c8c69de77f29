"""The README's example runs as written (its shell command, then its Python block)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks(lang):
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Load a Qwen3 checkpoint and score a prompt", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_load_and_score_example(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": ""}
    (shell,) = _blocks("bash")
    argv = shell.strip().split()
    assert argv[0] == "python"
    subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, env=env, check=True, capture_output=True)
    (code,) = _blocks("python")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"sum logprob: -\d+\.\d+", out.stdout), out.stdout
    assert os.path.exists(tmp_path / "runs/tiny-qwen3-export/model.safetensors")
