"""The CPU decode kernels of `cpu_decode.cc` (a skinny matmul, one-token attention): build, register, call.

The C++ file is compiled on first use with the system C++ compiler against the XLA FFI headers that
jaxlib ships, and cached by source hash under `$HLJAX_KERNEL_CACHE` (default
`~/.cache/hljax/kernels`). `availability()` says whether the kernels can run here and, if not, why;
callers decide what to do with that (the engine logs it, or raises when told to insist).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

PANEL = 48  # Must match kPanel in cpu_decode.cc.
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_decode.cc")
_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-mavx512f", "-mfma"]


class KernelUnavailable(RuntimeError):
    """The CPU kernels cannot run on this machine; the message says why."""


def _cpu_has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def _cache_dir() -> str:
    return os.environ.get("HLJAX_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hljax", "kernels")


def _build() -> str:
    """Path of the compiled library, compiling it if this source has not been built yet."""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler {compiler!r} found (set CXX or install g++)")
    with open(_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(source + " ".join(_FLAGS).encode() + jax.ffi.include_dir().encode()).hexdigest()[:16]
    out_dir = os.path.join(_cache_dir(), key)
    lib = os.path.join(out_dir, "libhljax_cpu_decode.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    # Build beside the target and rename: concurrent processes never load a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", _SOURCE, "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise KernelUnavailable(f"compiling {_SOURCE} failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    os.replace(tmp, lib)
    return lib


@functools.cache
def availability() -> str | None:
    """None when the kernels can run here (they are then registered with XLA), else the reason they
    cannot. Decided once per process."""
    if jax.default_backend() != "cpu":
        return f"the default JAX backend is {jax.default_backend()!r}, not 'cpu'"
    if not _cpu_has_avx512f():
        return "this CPU has no AVX-512F"
    try:
        lib = ctypes.CDLL(_build())
    except (KernelUnavailable, OSError) as e:
        return str(e)
    for name, symbol in (("hljax_matmul_packed", lib.HljaxMatmulPacked),
                         ("hljax_decode_attention", lib.HljaxDecodeAttention)):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
    return None


def pack(w: jax.Array) -> jax.Array:
    """w: [K, N] -> [ceil(N / 48), K, 48] fp32 column panels, zero-padded on the right."""
    K, N = w.shape
    P = -(-N // PANEL)
    w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, P * PANEL - N)))
    return w.reshape(K, P, PANEL).transpose(1, 0, 2)


def matmul_packed(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x: [M, K] fp32; packed: pack(w) of a [K, n] w -> x @ w [M, n] fp32."""
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call("hljax_matmul_packed", out)(x, packed)


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, scale: float) -> jax.Array:
    """One query token per row: q [B, K, G, H]; k, v [B, K, S, H]; valid [B, S] bool -> [B, K, G, H] fp32.

    softmax(scale * q.k over valid slots) . v, masked slots scored -1e30 (a fully masked row is uniform)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call("hljax_decode_attention", out)(q, k, v, valid, scale=np.float32(scale))
