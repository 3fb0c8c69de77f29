"""Nothing a user owns is deleted: every launcher that writes an output path refuses an existing one in
one line (exit 2, naming the path and --overwrite), and --overwrite replaces only that launcher's own
earlier output (hljax.checkpoint.owner), never a run directory, a user's folder or file, or another
command's output. A training run refuses an export folder it did not write."""

import os
import subprocess
import sys

import optax
import pytest
from flax import nnx

from hljax import sharding as shd
from hljax.checkpoint import hf, owner
from hljax.checkpoint.orbax import TrainCheckpointer
from launch import export as export_launcher
from launch import init_model as init_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(path) -> dict[str, bytes]:
    """Every file under `path` (or `path` itself) with its bytes: what must survive a refusal."""
    path = str(path)
    if os.path.isfile(path):
        return {"": open(path, "rb").read()}
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, path)] = open(full, "rb").read()
    return out


def _run(launcher, argv, monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `launcher.main()` with `argv`."""
    monkeypatch.setattr(sys, "argv", [launcher.__name__, *argv])
    try:
        launcher.main()
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(code: int, err: str, path, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and all(w in lines[0] for w in words), lines[0]


@pytest.fixture(scope="module")
def run_dir(tiny_tied, tmp_path_factory):
    """A training run's folder as launch.export reads it: config.json, a checkpoint, metrics."""
    run = tmp_path_factory.mktemp("victim")
    (run / "config.json").write_text(f'{{"model": {{"path": "{tiny_tied}", "param_dtype": "float32"}}}}\n')
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    mesh = shd.single_device_mesh()
    model = hf.load_hf(tiny_tied, mesh)
    with shd.use_mesh(mesh):
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    ckpt = TrainCheckpointer(str(run / "checkpoints"), async_save=False)
    ckpt.save(0, model, opt, {"step": 0, "stage": "sft", "seed": 0})
    ckpt.close()
    return run


@pytest.fixture
def user_things(tmp_path):
    """A user's folder of files and a user's file: no launcher may touch either."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    (folder / "config.json").write_text('{"mine": true}\n')
    single = tmp_path / "config.json"
    single.write_text('{"also": "mine"}\n')
    return folder, single


def test_export_refuses_an_existing_out_and_keeps_it(run_dir, user_things, monkeypatch, capsys):
    ckpt = str(run_dir / "checkpoints")
    for target in (run_dir, *user_things):
        before = _tree(target)
        for flag in ([], ["--overwrite"]):
            code, out, err = _run(export_launcher, ["--checkpoint", ckpt, "--out", str(target), *flag], monkeypatch,
                                  capsys)
            _refused(code, err, target, "--overwrite", *(["not a launch.export output"] if flag else []))
            assert "wrote" not in out
            assert _tree(target) == before, f"{target} changed"
    assert not [n for n in os.listdir(run_dir.parent) if ".tmp-" in n or ".old-" in n]


def test_export_overwrite_replaces_only_its_own_export(run_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "hf"
    argv = ["--checkpoint", str(run_dir / "checkpoints"), "--out", str(out_dir)]
    code, out, err = _run(export_launcher, argv, monkeypatch, capsys)
    assert code == 0 and f"wrote {out_dir}" in out, err
    assert owner.writer_of(str(out_dir)) == "launch.export"
    _refused(*_run(export_launcher, argv, monkeypatch, capsys)[::2], out_dir, "exists", "--overwrite")
    (out_dir / "stale.txt").write_text("from the earlier export\n")
    code, out, err = _run(export_launcher, [*argv, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and f"wrote {out_dir}" in out, err
    assert not (out_dir / "stale.txt").exists() and (out_dir / hf.SINGLE_FILE).exists()
    # Another command's output is not the export's to replace, nor the export init_model's.
    before = _tree(out_dir)
    code, _, err = _run(init_launcher, ["--out", str(out_dir), "--overwrite"], monkeypatch, capsys)
    _refused(code, err, out_dir, "a launch.export output", "--overwrite")
    assert _tree(out_dir) == before


def test_init_model_refuses_an_existing_out_and_keeps_it(run_dir, user_things, monkeypatch, capsys):
    # The case: --out naming a run's config.json moved it aside and made a folder in its place.
    for target in (run_dir, run_dir / "config.json", *user_things):
        before = _tree(target)
        for flag in ([], ["--overwrite"]):
            code, out, err = _run(init_launcher, ["--out", str(target), *flag], monkeypatch, capsys)
            _refused(code, err, target, "--overwrite", *(["not a launch.init_model output"] if flag else []))
            assert _tree(target) == before, f"{target} changed"
    assert not [n for n in os.listdir(run_dir) if n.startswith("config.json.")]


def test_init_model_overwrite_replaces_only_its_own_folder(tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "tiny"
    code, out, err = _run(init_launcher, ["--out", str(out_dir)], monkeypatch, capsys)
    assert code == 0 and f"wrote {out_dir}" in out, err
    first = (out_dir / hf.SINGLE_FILE).read_bytes()
    _refused(*_run(init_launcher, ["--out", str(out_dir), "--seed", "1"], monkeypatch, capsys)[::2], out_dir,
             "exists", "--overwrite")
    assert (out_dir / hf.SINGLE_FILE).read_bytes() == first
    code, out, err = _run(init_launcher, ["--out", str(out_dir), "--seed", "1", "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert (out_dir / hf.SINGLE_FILE).read_bytes() != first
    assert owner.writer_of(str(out_dir)) == "launch.init_model"


def test_save_hf_replaces_nothing_but_its_writers_folder(tiny_tied, user_things, tmp_path):
    model = hf.load_hf(tiny_tied, shd.single_device_mesh())
    folder, single = user_things
    for target in (folder, single):
        before = _tree(target)
        for replace in (False, True):
            with pytest.raises(owner.OutputExists, match="replace=True"):
                hf.save_hf(model, str(target), writer="me", replace=replace)
            assert _tree(target) == before
    mine = str(tmp_path / "export")
    os.mkdir(mine)  # An empty folder holds nothing to lose: it is taken.
    hf.save_hf(model, mine, writer="me")
    with pytest.raises(owner.OutputExists, match="a me output"):
        hf.save_hf(model, mine, writer="someone else", replace=True)
    hf.save_hf(model, mine, writer="me", replace=True)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "export", "mine"]  # No temporary folder left.


def test_a_training_run_refuses_an_export_folder_it_did_not_write(tmp_path):
    run = tmp_path / "run"
    (run / "export").mkdir(parents=True)
    (run / "export" / "notes.txt").write_text("mine\n")
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(ROOT, "configs/tiny.py"),
            f"--config.run_dir={run}", "--config.mode=sft", "--config.sft.steps=1", "--config.sft.eval_rows=0"]
    out = subprocess.run(argv, cwd=ROOT, env={**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT},
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stderr.splitlines() if line.startswith("launch.train: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert f"{run / 'export'} is not a launch.train output" in errors[0] and "Traceback" not in out.stderr
    assert (run / "export" / "notes.txt").read_text() == "mine\n"
    assert not (run / "init").exists()  # Refused before any model was made.
