"""GRPO's weight sync: the disk path vs the colocated backend's in-memory handoff, in one run.

Disk (`rollout.backend=embedded_server` or `sglang`): `hf.save_hf` of the trainer's model in the
served dtype, then the engine reloads the folder (what `/update_weights_from_disk` does in our server).
In memory (`rollout.backend=colocated`): `served_copy` casts and reshards each parameter, then
`Engine.set_model` swaps it in (packing it for the CPU kernels where they are on). Same trainer
model (fp32), same engine, per shape and served dtype; the median of `--repeats` syncs each, and the
peak resident memory above the start of each sync (sampled every 5 ms) against the served weights' bytes.

    python bench/sync.py [--sizes tiny,0.6b] [--dtypes float32,bfloat16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import psutil
import torch
import transformers
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.generate import SIZES  # noqa: E402
from hljax import sharding as shd  # noqa: E402
from hljax.checkpoint import hf  # noqa: E402
from hljax.generate.colocated import served_copy  # noqa: E402
from hljax.generate.engine import Engine, EngineConfig  # noqa: E402
from hljax.generate.local import load_engine_weights  # noqa: E402
from hljax.checkpoint.presets import TOKENIZER_DIR  # noqa: E402

# The tiny default's shape (hljax.models.config.ModelConfig.tiny, with the bundled tokenizer's vocabulary).
SHAPES = {"tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, tie_word_embeddings=True), "0.6b": SIZES["0.6b"]}


class PeakRSS:
    """Peak resident bytes of this process above its value at entry, sampled every 5 ms."""

    def __enter__(self):
        self.proc, self.start, self.peak, self._stop = psutil.Process(), 0, 0, threading.Event()
        self.start = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def above(self) -> int:
        return self.peak - self.start


def folder(size: str, root: str) -> str:
    torch.manual_seed(0)
    shape = dict(SHAPES[size])
    if size == "tiny":
        shape["vocab_size"] = len(transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR))
    cfg = transformers.Qwen3Config(**shape, max_position_embeddings=4096,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    path = os.path.join(root, size)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def ready(engine: Engine) -> None:
    jax.block_until_ready(engine.snapshot()[1])


def measure(trainer, engine: Engine, dtype: str, sync_dir: str, repeats: int) -> dict:
    out = {"disk": [], "export": [], "memory": [], "disk_peak": 0, "memory_peak": 0}
    # Untimed first: each path's first sync compiles its casts and packing.
    engine.set_model(served_copy(trainer, engine.model_config, engine.mesh))
    load_engine_weights(engine, hf.save_hf(trainer, sync_dir, dtype=dtype, replace=True) or sync_dir)
    for i in range(repeats):
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            hf.save_hf(trainer, sync_dir, dtype=dtype, replace=True)
            t1 = time.perf_counter()
            load_engine_weights(engine, sync_dir, f"disk-{i}")
            ready(engine)
            t2 = time.perf_counter()
        out["disk"].append(t2 - t0)
        out["export"].append(t1 - t0)
        out["disk_peak"] = max(out["disk_peak"], mem.above)
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            engine.set_model(served_copy(trainer, engine.model_config, engine.mesh), f"memory-{i}")
            ready(engine)
            out["memory"].append(time.perf_counter() - t0)
        out["memory_peak"] = max(out["memory_peak"], mem.above)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,0.6b")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="the served dtypes (the trainer is fp32)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (1 min); the trainer "
          "is fp32; figures are medians of the syncs after an untimed first one", flush=True)
    mesh = shd.single_device_mesh()
    rates = {}
    with tempfile.TemporaryDirectory(prefix="hljax-bench-sync-") as root:
        for size in args.sizes.split(","):
            path = folder(size, root)
            trainer = hf.load_hf(path, mesh)
            for dtype in args.dtypes.split(","):
                engine = Engine(hf.load_hf(path, mesh, dtype=getattr(jnp, dtype)), mesh, EngineConfig(max_batch=8))
                served = sum(x.size for x in jax.tree.leaves(nnx.state(trainer))) * jnp.dtype(dtype).itemsize
                r = measure(trainer, engine, dtype, os.path.join(root, "sync"), args.repeats)
                disk, export, memory = (statistics.median(r[k]) for k in ("disk", "export", "memory"))
                rates[dtype] = (served / disk, served / memory)
                print(f"{size:>5} {dtype:>8} ({served / 2**20:8.1f} MiB served): disk {disk:7.3f} s (export "
                      f"{export:.3f} s, reload {disk - export:.3f} s), peak +{r['disk_peak'] / 2**20:.0f} MiB | in "
                      f"memory {memory:7.3f} s, peak +{r['memory_peak'] / 2**20:.0f} MiB | disk / memory "
                      f"{disk / memory:5.1f}x", flush=True)
                del engine
    if "bfloat16" in rates:
        b = 4.02e9 * 2  # Qwen3-4B's parameters in bf16.
        disk_rate, memory_rate = rates["bfloat16"]
        print(f"projection, 4B proposer in bf16 ({b / 1e9:.1f} GB) at the last shape's bf16 rates: disk "
              f"{b / disk_rate:.1f} s, in memory {b / memory_rate:.1f} s per sync, per host holding a full copy")


if __name__ == "__main__":
    main()
