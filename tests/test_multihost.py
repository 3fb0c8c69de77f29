"""A 2-process "pod" on localhost (4 forced CPU devices each, gloo collectives) against one process
on 8 forced devices: the GRPO step, the per-process data split, checkpoints across process counts,
and a dead peer.

The pytest process already has its own 8-device backend (conftest), so every JAX run here is a fresh
subprocess executing this file's `worker` (python -m tests.test_multihost ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from sandbox.isolation import bwrap_path as _bwrap_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, M, G = 16, 2, 4  # GRPO rows per step, micro-batches, group size: 4 states per step.
SFT_BATCH, SFT_ROWS = 16, 84
L = 32


# ----- the worker (runs in the subprocesses) -----


def _fixed_rollouts():
    """A step's rollouts as the trainer would have them: 4 groups of 4, contiguous, in step order."""
    from hljax.rl.rollout import COL, KINDS, STATS

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 160, 3 + s).tolist() for s in range(B // G) for _ in range(G)]
    completions = [rng.integers(3, 160, 2 + (r * 7) % 11).tolist() for r in range(B)]
    stats = np.zeros((B, len(STATS)))
    stats[:, COL["reward"]] = rng.choice([0.0, 0.1, 0.2, 0.7, 1.2], B)
    stats[5, COL["reward"]] = np.nan  # An infrastructure error: its whole group (rows 4-7) leaves the loss.
    stats[:, COL["kind"]] = KINDS.index("ran")
    stats[5, COL["kind"]] = KINDS.index("infra_error")
    return prompts, completions, stats


def _params(model) -> dict[str, np.ndarray]:
    from flax import nnx
    from jax.experimental import multihost_utils

    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model)):
        v = var.get_value()
        out["/".join(map(str, path))] = np.asarray(multihost_utils.process_allgather(v, tiled=True)
                                                    if not v.is_fully_addressable else v)
    return out


def worker(args) -> None:
    from hljax import distributed as dist
    from hljax.config import DistributedSpec

    spec = DistributedSpec(coordinator=args.coordinator, num_processes=args.num_processes,
                           process_id=args.process_id, heartbeat_timeout_s=args.heartbeat_s, init_timeout_s=60,
                           shutdown_timeout_s=30) if args.num_processes else DistributedSpec()
    multi = dist.initialize(spec)
    assert dist.initialize(spec) == multi  # Idempotent.

    import jax
    import optax
    from flax import nnx

    from hljax import sharding as shd
    from hljax.mesh import MeshConfig
    from hljax.checkpoint import hf
    from hljax.checkpoint.orbax import TrainCheckpointer
    from hljax.rl import sft_data
    from hljax.rl.batching import pack, split_micro
    from hljax.rl.config import LossConfig
    from hljax.rl.rollout import score_groups
    from hljax.rl.train_step import TrainBatch, global_batch, local_logprobs, process_rows, train_step
    from hljax.rl.trainer import _slots

    pid, out = dist.process_index(), args.out
    os.makedirs(out, exist_ok=True)
    assert jax.device_count() == 8 and jax.local_device_count() == 8 // max(1, args.num_processes)
    mesh = shd.make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    cfg = LossConfig(beta=0.04, logprob_chunk=8, std_scaling="batch")  # Batch std: needs every row.

    def fresh():
        model = hf.load_hf(args.model, mesh)
        with shd.use_mesh(mesh):
            # Plain SGD: Adam's g / sqrt(g^2) turns float noise in tiny gradients into visible updates.
            return model, nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)

    # Which data this process takes, over a few steps (SFT rows, GRPO states).
    split = {"sft": [], "grpo": []}
    for step in range(3):
        sft_rows = process_rows(mesh, SFT_BATCH, M)
        idx = sft_data.batch_indices(SFT_ROWS, SFT_BATCH, 0, step)
        split["sft"].append([[int(r), idx[r]] for r in sft_rows])
        grpo_rows = process_rows(mesh, B, M)
        split["grpo"].append([[int(s), step * (B // G) + s] for s in _slots(grpo_rows, G)])
    with open(os.path.join(out, f"split_p{pid}.json"), "w") as f:
        json.dump(split, f)

    if args.restore:  # A checkpoint from the other process count, into a fresh model.
        model, opt = fresh()
        TrainCheckpointer(args.restore).restore(model, opt)
        restored = {**{f"model/{k}": v for k, v in _params(model).items()}, **{f"opt/{k}": v for k, v in _params(opt).items()}}
        if dist.is_main():
            np.savez(os.path.join(out, "restored.npz"), **restored)
        if args.restore_only:
            return

    # One GRPO step on this process's rows, exactly as the trainer assembles it.
    model, opt = fresh()
    prompts, completions, stats = _fixed_rollouts()
    rows = process_rows(mesh, B, M)
    all_stats = dist.gather_rows(rows, stats[rows], B)
    adv, keep, metrics = score_groups(all_stats, G, cfg)
    seqs = pack([prompts[r] for r in rows], [completions[r] for r in rows], L)
    old = local_logprobs(model, mesh, seqs, B, M, 1.0, 8)
    ref = old - 0.05 * np.arange(L, dtype=np.float32)  # A reference that differs: the KL term is live.
    seqs = dataclasses.replace(seqs, loss_mask=seqs.loss_mask * keep[rows][:, None].astype(np.float32))
    m = lambda x: split_micro(np.asarray(x, np.float32), M)  # noqa: E731
    local = TrainBatch(seqs=jax.tree.map(lambda x: split_micro(np.asarray(x), M), seqs),
                       advantages=m(np.where(keep, adv, 0.0)[rows]), old_logp=m(old), ref_logp=m(ref),
                       sampler_logp=m(old))
    with shd.use_mesh(mesh):
        step_metrics = jax.device_get(train_step(model, opt, global_batch(local, mesh, B), cfg))
    # Collective: every process gathers, process 0 writes.
    params = {**{f"model/{k}": v for k, v in _params(model).items()}, **{f"opt/{k}": v for k, v in _params(opt).items()}}
    ckpt = TrainCheckpointer(os.path.join(out, "ckpt"), async_save=False)
    ckpt.save(1, model, opt, {"processes": dist.process_count()})
    ckpt.close()
    old_sum = float(dist.allgather(old.sum()).sum())  # Collective: outside the main-only block.
    if dist.is_main():
        np.savez(os.path.join(out, "params.npz"), **params)
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump({**{k: float(v) for k, v in step_metrics.items()}, **metrics,
                       "old_logp_sum": old_sum}, f)
    if args.loop:  # Keep stepping until a peer dies (the dead-peer test kills one of us).
        print(f"looping p{pid}", flush=True)
        while True:
            with shd.use_mesh(mesh):
                jax.device_get(train_step(model, opt, global_batch(local, mesh, B), cfg))
            time.sleep(0.05)


# ----- the tests (run in pytest) -----


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out, model, n_proc, *extra, heartbeat_s=30, log_dir=None):
    """Start the worker as `n_proc` processes sharing 8 CPU devices; -> Popen handles. Output goes to
    pipes, or to log_dir/p{i}.log when given (to watch it while they run)."""
    devices = 8 // n_proc
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "PYTHONPATH": ROOT,
           "JAX_PLATFORMS": "cpu"}
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    base = [sys.executable, "-m", "tests.test_multihost", "--out", str(out), "--model", model,
            "--heartbeat-s", str(heartbeat_s), *extra]
    def stdout(i):
        return open(os.path.join(log_dir, f"p{i}.log"), "w") if log_dir else subprocess.PIPE

    if n_proc == 1:
        return [subprocess.Popen(base, cwd=ROOT, env=env, stdout=stdout(0), stderr=subprocess.STDOUT, text=True)]
    coordinator = f"127.0.0.1:{_free_port()}"
    return [subprocess.Popen([*base, "--coordinator", coordinator, "--num-processes", str(n_proc), "--process-id",
                              str(i)], cwd=ROOT, env=env, stdout=stdout(i), stderr=subprocess.STDOUT, text=True)
            for i in range(n_proc)]


def _run(out, model, n_proc, *extra, timeout=400):
    procs = _launch(out, model, n_proc, *extra)
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    _assert_all_exited_0(procs, logs)


def _assert_all_exited_0(procs, logs):
    # Every failed process's log: the first to fail is often not process 0 (the others wait on it).
    failed = [f"process {i} of {len(procs)} exited {p.returncode}:\n{log[-4000:]}"
              for i, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    assert not failed, "\n\n".join(failed)


def _npz(path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return dict(z)


@pytest.mark.slow
def test_two_processes_match_one_and_checkpoints_cross(tiny_untied, tmp_path):
    one, two, back = tmp_path / "one", tmp_path / "two", tmp_path / "back"
    t = time.perf_counter()
    _run(one, tiny_untied, 1)
    _run(two, tiny_untied, 2, "--restore", str(one / "ckpt"))
    _run(back, tiny_untied, 1, "--restore", str(two / "ckpt"), "--restore-only")
    print(f"3 runs: {time.perf_counter() - t:.0f}s")

    # The GRPO step: same loss, metrics and updated parameters as one process on 8 devices.
    m1, m2 = (json.load(open(d / "metrics.json")) for d in (one, two))
    assert m1.keys() == m2.keys()
    for k in m1:
        np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
    p1, p2 = _npz(one / "params.npz"), _npz(two / "params.npz")
    assert p1.keys() == p2.keys()
    worst = max(float(np.abs(p1[k] - p2[k]).max()) for k in p1)
    print(f"max |param 2-proc - 1-proc| = {worst:.2e}")
    assert worst <= 1e-5
    from flax import nnx

    from hljax.checkpoint import hf

    start = nnx.to_flat_state(nnx.state(hf.load_hf(tiny_untied)))
    moved = max(float(np.abs(np.asarray(v.get_value()) - p1["model/" + "/".join(map(str, path))]).max())
                for path, v in start)
    assert moved > 1e-3  # The step did change the parameters.

    # Checkpoints cross process counts exactly: 1 -> 2 and 2 -> 1.
    for restored, saved in ((_npz(two / "restored.npz"), p1), (_npz(back / "restored.npz"), p2)):
        assert restored.keys() == saved.keys()
        for k in saved:
            np.testing.assert_array_equal(restored[k], saved[k], err_msg=k)

    # Data: the processes take disjoint rows whose union, placed by position, is the 1-process list.
    s1 = json.load(open(one / "split_p0.json"))
    parts = [json.load(open(two / f"split_p{i}.json")) for i in range(2)]
    for kind in ("sft", "grpo"):
        for step in range(3):
            mine = [{pos for pos, _ in p[kind][step]} for p in parts]
            assert mine[0] and mine[1] and not mine[0] & mine[1], (kind, step, mine)
            merged = sorted(parts[0][kind][step] + parts[1][kind][step])
            assert merged == s1[kind][step], (kind, step)
    assert [s for _, s in s1["grpo"][1]] == [4, 5, 6, 7] and len({i for _, i in s1["sft"][0]}) == SFT_BATCH


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_peer_is_an_error_not_a_hang(tiny_untied, tmp_path, victim):
    procs = _launch(tmp_path, tiny_untied, 2, "--loop", heartbeat_s=5, log_dir=tmp_path)
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(f"looping p{i}" in logs[i].read_text() for i in range(2)):
            for i, p in enumerate(procs):
                assert p.poll() is None, logs[i].read_text()[-3000:]
            time.sleep(0.2)
        assert all(f"looping p{i}" in logs[i].read_text() for i in range(2)), "the workers never reached their loop"
        killed = time.monotonic()
        procs[victim].kill()
        survivor = procs[1 - victim]
        survivor.wait(timeout=60)  # Bounded: heartbeat 5 s, or gloo sees the reset at once.
        took = time.monotonic() - killed
        log = logs[1 - victim].read_text()
        print(f"process {1 - victim} exited {survivor.returncode} {took:.1f}s after process {victim} was killed")
        assert survivor.returncode != 0
        assert any(s in log for s in ("another task died", "stopped sending heartbeats", "Connection reset by peer",
                                      "Gloo all-reduce failed")), log[-3000:]
    finally:
        for p in procs:
            p.kill()


def _train(run_dir, n_proc, *overrides):
    """launch.train on configs/tiny.py as `n_proc` processes sharing 8 CPU devices; -> logs."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // n_proc}", "PYTHONPATH": ROOT,
           "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "launch.train", "--config", os.path.join(ROOT, "configs/tiny.py"),
            f"--config.run_dir={run_dir}", *overrides]
    if n_proc > 1:
        coordinator = f"127.0.0.1:{_free_port()}"
        argvs = [[*argv, f"--config.distributed.coordinator={coordinator}", f"--config.distributed.num_processes={n_proc}",
                  f"--config.distributed.process_id={i}"] for i in range(n_proc)]
    else:
        argvs = [argv]
    procs = [subprocess.Popen(a, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a in argvs]
    try:
        logs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    _assert_all_exited_0(procs, logs)
    return logs


@pytest.mark.slow
def test_trainer_sft_two_processes_match_one(tmp_path):
    """The trainer end to end (SFT, validity, checkpoints, export): each process loads only its rows."""
    common = ["--config.mode=sft", "--config.sft.steps=2", "--config.sft.batch_size=8", "--config.sft.eval_rows=2",
              "--config.sft.eval_max_new_tokens=4", "--config.metrics.plots=False", "--config.metrics.backends=('jsonl',)",
              "--config.checkpoint.every=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    _train(one, 1, *common)
    logs = _train(two, 2, *common)
    assert "run finished" in logs[0] and "run finished" not in logs[1]  # Reported once.
    rows = [[json.loads(line) for line in open(d / "metrics.jsonl")] for d in (one, two)]
    assert [r["step"] for r in rows[1]] == [0, 1]  # Written once, by process 0.
    for a, b in zip(*rows):
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
    from safetensors.numpy import load_file

    want, got = (load_file(str(d / "export" / "model.safetensors")) for d in (one, two))
    assert want.keys() == got.keys() and max(float(np.abs(want[k] - got[k]).max()) for k in want) <= 1e-5
    assert sorted(os.listdir(two / "checkpoints")) == ["0", "1"]
    assert not any(n.startswith("init.discard") for n in os.listdir(two))


@pytest.mark.slow
@pytest.mark.skipif(_bwrap_path() is None, reason="bubblewrap (bwrap) not installed: the sandbox refuses to start")
@pytest.mark.parametrize("backend", ["embedded_server", "colocated"])
def test_trainer_grpo_two_processes_sample_what_one_does(tmp_path, backend):
    """GRPO through the trainer: each process serves, samples and scores its own group (its own engine,
    behind an embedded server or colocated, and sandbox pool, weights synced to each); the gathered
    statistics equal one process's."""
    common = [f"--config.rollout.backend={backend}", "--config.mode=grpo", "--config.grpo.steps=2",
              "--config.grpo.prompts_per_step=2", "--config.grpo.max_new_tokens=24",
              "--config.grpo.scoring_questions=2", "--config.sandbox.workers=1", "--config.metrics.plots=False",
              "--config.metrics.backends=('jsonl',)", "--config.export.at_end=False", "--config.checkpoint.every=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    _train(one, 1, *common)
    _train(two, 2, *common)
    rows = [[json.loads(line) for line in open(d / "metrics.jsonl")] for d in (one, two)]
    assert [r["step"] for r in rows[1]] == [0, 1]
    for a, b in zip(*rows):
        for key in ("completion_tokens", "completion_len", "truncated_rate", "valid_rate", "reward/mean", "loss"):
            assert b[key] == a[key], (a["step"], key, a[key], b[key])
        np.testing.assert_allclose(b["entropy"], a["entropy"], rtol=1e-4)
        assert b["sampler_logprob_gap"] < 1e-3
    if backend == "embedded_server":
        assert {"sync-p0", "sync-p1"} <= set(os.listdir(two))  # One export per process, for its own server.
    else:  # Handed over in memory: nothing exported.
        assert not [n for n in os.listdir(two) if n.startswith("sync")]


def test_resolve_reads_config_then_environment(monkeypatch):
    from hljax import distributed as dist
    from hljax.config import DistributedSpec

    for k in (dist.ENV_COORDINATOR, dist.ENV_NUM_PROCESSES, dist.ENV_PROCESS_ID):
        monkeypatch.delenv(k, raising=False)
    assert not dist.wanted(DistributedSpec())
    assert dist.wanted(DistributedSpec(initialize=True))
    kw = dist.resolve(DistributedSpec(coordinator="10.0.0.1:1234", num_processes=4, process_id=3,
                                      heartbeat_timeout_s=7))
    assert kw["coordinator_address"] == "10.0.0.1:1234" and kw["num_processes"] == 4 and kw["process_id"] == 3
    assert kw["heartbeat_timeout_seconds"] == 7
    assert "coordinator_address" not in dist.resolve(DistributedSpec(initialize=True))  # JAX auto-detects.

    monkeypatch.setenv(dist.ENV_COORDINATOR, "h0:99")
    monkeypatch.setenv(dist.ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(dist.ENV_PROCESS_ID, "1")
    assert dist.wanted(DistributedSpec())
    kw = dist.resolve(DistributedSpec(process_id=0))  # A config field wins over its variable.
    assert (kw["coordinator_address"], kw["num_processes"], kw["process_id"]) == ("h0:99", 2, 0)

    monkeypatch.setenv(dist.ENV_PROCESS_ID, "2")
    with pytest.raises(dist.DistributedError, match=r"process_id=2 is not in \[0, num_processes=2\)"):
        dist.resolve(DistributedSpec())
    monkeypatch.setenv(dist.ENV_PROCESS_ID, "x")
    with pytest.raises(dist.DistributedError, match="JAX_PROCESS_ID='x' is not an integer"):
        dist.resolve(DistributedSpec())
    monkeypatch.delenv(dist.ENV_PROCESS_ID)
    monkeypatch.delenv(dist.ENV_NUM_PROCESSES)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("OMPI_MCA_orte_hnp_uri", raising=False)
    with pytest.raises(dist.DistributedError, match=r"not \['num_processes', 'process_id'\]"):
        dist.resolve(DistributedSpec())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--num-processes", type=int, default=0)
    parser.add_argument("--process-id", type=int, default=-1)
    parser.add_argument("--heartbeat-s", type=int, default=30)
    parser.add_argument("--restore", default="")
    parser.add_argument("--restore-only", action="store_true")
    parser.add_argument("--loop", action="store_true")
    worker(parser.parse_args())
