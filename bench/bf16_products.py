"""A bf16 model's projections on CPU, one at a time: each route `ops.dense` can take vs torch's bf16 matmul.

    python bench/bf16_products.py [--rows 8,16,32,64,128,512] [--shapes 1024x3072,3072x1024,1024x2048,2048x1024]
                                  [--reps 20] [--allow-load]

For bf16 activations [rows, K] and a bf16 weight [K, N] packed as the engine holds it (Qwen3-0.6B's
projection shapes by default), the time of one product by each route this CPU can run:
`fp32-fma` (the packed kernel on fp32 activations: decode's route), `xla` (XLA's bf16 dot on the
weight unpacked for the call), `amx` / `avx512_bf16` (our bf16 kernels on the packed panels, where the
CPU has the instructions), and torch's `torch.matmul` on bf16 tensors (oneDNN) with as many threads.
Ours are timed inside one jitted program of `--reps` dependent calls, as they run inside the engine's
programs (a call from Python would add its dispatch and a fresh output buffer); torch's as a loop of
calls. Both cycle through distinct weights four times the size of the last-level cache, so that each
product reads its weight from memory as a model's layers do (with one weight, cached, a decode's few
rows looked 1.2x faster on a kernel that was 0.9x in the engine). Last, for each bf16 kernel this CPU
runs, the fewest measured rows from which it beat the fp32 kernel on every shape, beside the constant
`ops.dense` uses (`ops.AMX_ROWS`, `ops.AVX512_BF16_ROWS`): the measurement that sets them. Prints ms per product, GFLOP/s, and each route's speed against torch's and against the route
`ops.dense` takes at that row count. The host's load is checked first (bench/host.py).
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench import host  # noqa: E402
from hljax.kernels import cpu_decode  # noqa: E402
from hljax.models import ops  # noqa: E402


def routes() -> dict:
    """Route name -> fn(x bf16 [M, K], packed, K, N) -> [M, N] fp32, for the routes this CPU runs."""
    out = {
        "fp32-fma": lambda x, p, k, n: cpu_decode.matmul_packed(x.astype(jnp.float32), p, n),
        "xla": lambda x, p, k, n: jnp.dot(x, cpu_decode.unpack(p, k, n, after=x), preferred_element_type=jnp.float32),
    }
    if cpu_decode.amx():
        out["amx"] = lambda x, p, k, n: cpu_decode.matmul_packed_amx(x, p, n)
    if cpu_decode.avx512_bf16():
        out["avx512_bf16"] = lambda x, p, k, n: cpu_decode.matmul_packed_bf16dot(x, p, n)
    return out


def ours_ms(fn, x, packed: list, k: int, n: int, reps: int, rounds: int = 3) -> float:
    """ms per product, `reps` dependent products in one jitted program (each output's first element is
    written into the next input, in place, so XLA neither hoists nor overlaps them), each with the
    next of the weights `packed` (more bytes than the last-level cache, so that each product reads its
    weight from memory, as a model's layers do; unrolled, as the layers are, since a slice of stacked
    weights would be copied for the call), best of `rounds`."""

    @jax.jit
    def chain(x, ws):
        for i in range(reps):
            x = x.at[0, 0].set(fn(x, ws[i % len(ws)], k, n)[0, 0].astype(x.dtype))
        return x

    jax.block_until_ready(chain(x, packed))
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(chain(x, packed))
        best = min(best, time.perf_counter() - t)
    return best / reps * 1e3


def torch_ms(x, ws, reps: int, rounds: int = 3) -> float:
    """The same with torch.matmul on the weights `ws` in turn."""
    torch.matmul(x, ws[0])
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(reps):
            torch.matmul(x, ws[i % len(ws)])
        best = min(best, time.perf_counter() - t)
    return best / reps * 1e3


def taken(rows: int) -> str:
    """The route ops.dense takes for `rows` rows of a packed bf16 weight on this CPU."""
    route = ops._bf16_route(rows)
    return "fp32-fma" if route is None else route


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16,32,64,128,512")
    parser.add_argument("--shapes", default="1024x3072,3072x1024,1024x2048,2048x1024", help="KxN, comma-separated")
    parser.add_argument("--reps", type=int, default=40)
    host.add_args(parser)
    args = parser.parse_args()
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
        shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    except ValueError:
        parser.error(f"--rows wants counts like 8,64 and --shapes KxN pairs like 1024x3072 (got --rows "
                     f"{args.rows!r}, --shapes {args.shapes!r})")
    if any(r < 1 for r in rows_list) or any(len(s) != 2 or min(s) < 1 for s in shapes) or args.reps < 1:
        parser.error("--rows, the --shapes dimensions and --reps must be positive; each shape is KxN")
    host.check_args(args)
    if (reason := cpu_decode.availability()) is not None:
        sys.exit(f"the CPU kernels cannot run here: {reason}")
    torch.set_num_threads(os.cpu_count())
    table = routes()
    print(f"routes: {', '.join(table)}; torch {torch.__version__} bf16 matmul, {torch.get_num_threads()} threads; "
          f"ops.dense: {', '.join(f'{r} rows -> {taken(r)}' for r in (8, 16, 64, 128))}", flush=True)
    rng = np.random.default_rng(0)
    times = {}  # (shape, rows) -> {route: ms}
    for k, n in shapes:
        # Distinct weights filling 4x the last-level cache (at least 2): a model's products stream
        # their weights from memory, and few rows are bound by that stream.
        # (No more than --reps: the chain uses only that many.)
        copies = min(args.reps, max(2, -(-4 * host.llc_bytes() // (2 * k * n))))
        w = jnp.asarray(rng.standard_normal((k, n)) * 0.02, jnp.bfloat16)
        packed = jax.block_until_ready([cpu_decode.pack(w * (1 + i / 64)) for i in range(copies)])
        tw = torch.tensor(np.asarray(w.astype(jnp.float32))).to(torch.bfloat16)
        tws = [tw * (1 + i / 64) for i in range(copies)]
        for rows in rows_list:
            x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
            tx = torch.tensor(np.asarray(x.astype(jnp.float32))).to(torch.bfloat16)
            ms = {name: ours_ms(fn, x, packed, k, n, args.reps) for name, fn in table.items()}
            ms["torch"] = torch_ms(tx, tws, args.reps)
            times[(k, n), rows] = ms
            flop = 2 * rows * k * n
            cells = " | ".join(f"{name} {t:.3f} ms ({flop / t / 1e6:.0f} GFLOP/s)" for name, t in ms.items())
            route = taken(rows)
            print(f"{k}x{n}, {rows} rows: {cells}", flush=True)
            print(f"{k}x{n}, {rows} rows: ops.dense takes {route}: {ms['torch'] / ms[route]:.2f}x torch; "
                  + ", ".join(f"{name} {ms[route] / t:.2f}x" for name, t in ms.items() if name not in (route, "torch"))
                  + f" the speed of {route}", flush=True)
    for kernel, constant in (("amx", "AMX_ROWS"), ("avx512_bf16", "AVX512_BF16_ROWS")):
        if kernel in table:
            print(f"{kernel}: {crossover(times, shapes, rows_list, kernel)}; ops.{constant} = "
                  f"{getattr(ops, constant)}", flush=True)


def crossover(times: dict, shapes: list, rows_list: list[int], kernel: str) -> str:
    """The fewest measured rows from which `kernel` beat the fp32 kernel on every shape at every
    measured row count, as a sentence."""
    wins = [all(times[s, r][kernel] < times[s, r]["fp32-fma"] for s in shapes) for r in sorted(rows_list)]
    for i, r in enumerate(sorted(rows_list)):
        if all(wins[i:]):
            return f"faster than the fp32 kernel on every shape from {r} rows (of {','.join(map(str, sorted(rows_list)))})"
    return "not faster than the fp32 kernel on every shape at the most rows measured"


if __name__ == "__main__":
    main()
