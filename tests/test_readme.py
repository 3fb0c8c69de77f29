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


def test_doc_links_resolve_inside_the_repo():
    """Every relative link in README.md and docs/*.md names a file of this repository (no ../ outside it)."""
    import glob

    for doc in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        text = open(doc).read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            assert path.startswith(ROOT + os.sep), f"{doc}: link {target} leaves the repository"
            assert os.path.exists(path), f"{doc}: link {target} does not resolve"
        assert "../shared/" not in text, f"{doc} points outside the repository"
