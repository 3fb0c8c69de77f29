"""The CPU kernels of `cpu_decode.cc` (a skinny packed matmul, a row-dot matmul for a tied
embedding, one-token attention, in-place KV-cache writes and prefilled-row copies, the embedding
lookup), `cpu_attention.cc` (training and prefill attention: hljax/kernels/cpu_attention.py) and `cpu_amx.cc`
(a prefill's bf16 products on AMX tiles, or by AVX-512 BF16 dots): build,
register, call. They run on CPUs only, with fp32 or bf16 weights and caches; accelerators run
everything through XLA.

The C++ files are compiled into one library on first use with the system C++ compiler against the
XLA FFI headers that jaxlib ships, for this CPU's instruction set: AVX-512F (packed panels of 48
columns) or else AVX2 + FMA (panels of 24). `HLJAX_CPU_ISA=avx2` forces the AVX2 build on an
AVX-512 CPU (to test it). The library is cached by sources, flags, compiler and jaxlib version
(`build_key`) under `$HLJAX_KERNEL_CACHE` (default `~/.cache/hljax/kernels`). `availability()` says
whether the kernels can run here and, if not, why; callers decide what to do with that (the engine
logs it, or raises when told to insist).
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
import jaxlib.version
import numpy as np

_DIR = os.path.dirname(os.path.abspath(__file__))
# Compiled into one library; the header is part of the build key.
_SOURCES = [os.path.join(_DIR, name) for name in ("cpu_decode.cc", "cpu_attention.cc", "cpu_amx.cc")]
_HEADERS = [os.path.join(_DIR, "cpu_simd.h")]
_BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC"]
# Instruction set -> (compiler flags, columns per packed panel: kPw in cpu_simd.h).
ISAS = {"avx512": (["-mavx512f", "-mfma"], 48), "avx2": (["-mavx2", "-mfma"], 24)}
WEIGHT_DTYPES = (jnp.float32, jnp.bfloat16)


class KernelUnavailable(RuntimeError):
    """The CPU kernels cannot run on this machine; the message says why."""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def isa() -> str:
    """The instruction set the kernels are built for here; raises KernelUnavailable if none fits."""
    flags = _cpu_flags()
    supported = [name for name, need in (("avx512", {"avx512f", "fma"}), ("avx2", {"avx2", "fma"})) if need <= flags]
    forced = os.environ.get("HLJAX_CPU_ISA")
    if forced:
        if forced not in ISAS:
            raise KernelUnavailable(f"HLJAX_CPU_ISA={forced!r} is not one of {sorted(ISAS)}")
        if forced not in supported:
            raise KernelUnavailable(f"HLJAX_CPU_ISA={forced!r} but this CPU lacks it")
        return forced
    if not supported:
        raise KernelUnavailable("this CPU has neither AVX-512F nor AVX2 + FMA")
    return supported[0]


def _cache_dir() -> str:
    return os.environ.get("HLJAX_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hljax", "kernels")


def build_key(source: bytes, flags: list[str], compiler: str, jaxlib_version: str, include_dir: str) -> str:
    """The cache folder's name: it changes with anything that changes the library (the source, the
    flags, the compiler and its version, jaxlib's FFI headers' version and place)."""
    parts = [source, "\0".join(flags).encode(), compiler.encode(), jaxlib_version.encode(), include_dir.encode()]
    return hashlib.sha256(b"\0\0".join(parts)).hexdigest()[:16]


def _compiler_id(compiler: str) -> str:
    """The compiler's resolved path and the first line of its --version."""
    path = shutil.which(compiler) or compiler
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{os.path.realpath(path)} {out.splitlines()[0] if out else ''}"


def _build(isa_name: str) -> str:
    """Path of the library compiled for `isa_name`, compiling it if this source has not been built yet."""
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler {compiler!r} found (set CXX or install g++)")
    source = b""
    for path in _SOURCES + _HEADERS:
        with open(path, "rb") as f:
            source += f.read()
    flags = _BASE_FLAGS + ISAS[isa_name][0]
    key = build_key(source, flags, _compiler_id(compiler), jaxlib.version.__version__, jax.ffi.include_dir())
    out_dir = os.path.join(_cache_dir(), key)
    lib = os.path.join(out_dir, "libhljax_cpu_decode.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    # Build beside the target and rename: concurrent processes never load a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [compiler, *flags, f"-I{jax.ffi.include_dir()}", f"-I{_DIR}", *_SOURCES, "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise KernelUnavailable(f"compiling {', '.join(_SOURCES)} failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    os.replace(tmp, lib)
    return lib


@functools.cache
def _library(isa_name: str) -> ctypes.CDLL:
    return ctypes.CDLL(_build(isa_name))


@functools.cache
def availability() -> str | None:
    """None when the kernels can run here (they are then registered with XLA), else the reason they
    cannot. Decided once per process."""
    if jax.default_backend() != "cpu":
        return f"the default JAX backend is {jax.default_backend()!r}, not 'cpu' (accelerators run XLA only)"
    try:
        name = isa()
        lib = _library(name)
    except (KernelUnavailable, OSError) as e:
        return str(e)
    if lib.HljaxPanelWidth() != ISAS[name][1]:
        return f"the library's panel width {lib.HljaxPanelWidth()} is not {ISAS[name][1]} (stale build?)"
    for target, symbol in (("hljax_matmul_packed", lib.HljaxMatmulPacked), ("hljax_matmul_nt", lib.HljaxMatmulNt),
                           ("hljax_decode_attention", lib.HljaxDecodeAttention), ("hljax_kv_write", lib.HljaxKvWrite),
                           ("hljax_take_rows", lib.HljaxTakeRows), ("hljax_copy_rows", lib.HljaxCopyRows),
                           ("hljax_unpack", lib.HljaxUnpack), ("hljax_matmul_packed_amx", lib.HljaxMatmulPackedAmx),
                           ("hljax_matmul_packed_bf16dot", lib.HljaxMatmulPackedBf16Dot),
                           ("hljax_attention_forward", lib.HljaxAttentionForward),
                           ("hljax_attention_backward", lib.HljaxAttentionBackward),
                           ("hljax_prefill_attention", lib.HljaxPrefillAttention)):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
    return None


def panel_width() -> int:
    """Columns per packed panel of the kernels built here (call after `availability()` is None)."""
    return ISAS[isa()][1]


def pack(w: jax.Array) -> jax.Array:
    """w: [K, N] fp32 or bf16 -> its column panels, flat, in w's dtype: N // panel full panels [K, panel],
    then the last r = N % panel columns as one panel [K, r] and panel - r zeros (the kernel reads the
    narrow panel's rows as whole panel rows). Each panel is one contiguous stream for `matmul_packed`,
    and only the panel - r zeros are stored beyond w's own elements."""
    if w.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"the CPU kernels take fp32 or bf16 weights, not {w.dtype}")
    K, N = w.shape
    panel = panel_width()
    full, r = divmod(N, panel)
    parts = [w[:, : full * panel].reshape(K, full, panel).transpose(1, 0, 2).reshape(-1)]
    if r:
        parts += [w[:, full * panel :].reshape(-1), jnp.zeros(panel - r, w.dtype)]
    return jnp.concatenate(parts)


def unpack(packed: jax.Array, k: int, n: int, after: jax.Array) -> jax.Array:
    """The inverse of `pack`: packed panels of a [k, n] w -> w, in a new buffer (memory-bound copies of
    each panel row; XLA's transpose of the same ran under 1 GB/s). `after` (not read): an array the
    copy waits for, the product's input, so that each layer's copy lives only for its product."""
    return jax.ffi.ffi_call("hljax_unpack", jax.ShapeDtypeStruct((k, n), packed.dtype))(packed, after)


@functools.lru_cache(maxsize=None)
def bf16_dots() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AMX or AVX-512 BF16): XLA's bf16 products
    into fp32 then outrun the kernels' fp32 FMAs on many rows (docs/benchmarks.md)."""
    return bool({"amx_bf16", "avx512_bf16"} & _cpu_flags())


@functools.cache
def amx() -> bool:
    """Whether `matmul_packed_amx` runs here: the kernels' AVX-512 build on a CPU with AMX bf16 tiles,
    and Linux granted this process the tile state (decided once per process)."""
    if not {"amx_bf16", "amx_tile"} <= _cpu_flags() or availability() is not None or isa() != "avx512":
        return False
    return _library(isa()).HljaxAmxInit() == 0


@functools.cache
def avx512_bf16() -> bool:
    """Whether `matmul_packed_bf16dot` runs here: the kernels' AVX-512 build on a CPU with AVX-512 BF16
    dot instructions."""
    return "avx512_bf16" in _cpu_flags() and availability() is None and isa() == "avx512"


def matmul_packed_bf16dot(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x: [M, K] bf16; packed: pack(w) of a bf16 [K, n] w -> x @ w [M, n] fp32, products by AVX-512
    BF16 dot instructions (fp32 sums). Only where `avx512_bf16()`."""
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call("hljax_matmul_packed_bf16dot", out)(x, packed)


def matmul_packed_amx(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x: [M, K] bf16; packed: pack(w) of a bf16 [K, n] w -> x @ w [M, n] fp32, products on AMX tiles
    (fp32 sums). Only where `amx()`."""
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call("hljax_matmul_packed_amx", out)(x, packed)


def matmul_packed(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x: [M, K] fp32; packed: pack(w) of a [K, n] w (fp32 or bf16) -> x @ w [M, n] fp32."""
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call("hljax_matmul_packed", out)(x, packed)


def matmul_nt(x: jax.Array, e: jax.Array) -> jax.Array:
    """x: [M, K] fp32; e: [N, K] fp32 or bf16 (a tied embedding) -> x @ e.T [M, N] fp32."""
    out = jax.ShapeDtypeStruct((x.shape[0], e.shape[0]), jnp.float32)
    return jax.ffi.ffi_call("hljax_matmul_nt", out)(x, e)


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, filled: jax.Array,
                     scale: float) -> jax.Array:
    """One query token per row: q [B, K, G, H] fp32; k, v [B, K, S, H] (both fp32 or both bf16);
    valid [B, S] bool; filled [] int32 -> [B, K, G, H] fp32.

    softmax(scale * q.k over valid slots) . v, reading only slots < filled (clipped to [1, S]): a step
    costs the filled part of the cache, not its bucketed length. Masked slots are scored -1e30, so a
    row with no valid slot below `filled` averages those slots uniformly."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call("hljax_decode_attention", out)(
        q, k, v, valid, jnp.asarray(filled, jnp.int32), scale=np.float32(scale))


def kv_write(cache: jax.Array, x: jax.Array, slots: jax.Array) -> jax.Array:
    """cache: [B, K, S, H] fp32 or bf16; x: [B, K, H] of its dtype; slots: [B] int32 -> cache with row
    b's x at slot slots[b] (out of range: not written), in place.

    XLA:CPU scatters a bf16 cache by converting all of it to fp32 and back (seen in the optimized HLO;
    bf16 decode at 512 new tokens on 28 layers of the 0.6B shape: 221 ms a step with that scatter done
    as 16-bit integers, 117 ms with this call); this writes B x K rows whatever the cache's length."""
    out = jax.ShapeDtypeStruct(cache.shape, cache.dtype)
    return jax.ffi.ffi_call("hljax_kv_write", out, input_output_aliases={0: 0})(cache, x, slots.astype(jnp.int32))


def take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table: [V, D] fp32 or bf16; ids: [N] int -> table[ids] as fp32 [N, D] (an id outside [0, V): a
    NaN row, as jnp.take).

    XLA:CPU gathers from a bf16 table by converting all of it first (to fp32, or as raw bits to
    uint16): a table-sized temporary, 0.31-0.62 GB for the Qwen3-0.6B shape, at every decode chunk."""
    out = jax.ShapeDtypeStruct((ids.shape[0], table.shape[1]), jnp.float32)
    return jax.ffi.ffi_call("hljax_take_rows", out)(table, ids.astype(jnp.int32))


def copy_rows(dst: jax.Array, src: jax.Array, src_rows: jax.Array, dst_rows: jax.Array) -> jax.Array:
    """dst: [B, K, S, H] fp32 or bf16; src: [U, K, W, H] of its dtype (W <= S); src_rows, dst_rows: [R]
    -> dst with src's row src_rows[r] in slots [0, W) of row dst_rows[r] (an index out of range: nothing
    copied), in place.

    XLA gathers the R source rows of every layer into one temporary before scattering them: 28 x 2 x
    R x prefill-cache rows, 7.5 GB for a 4 x 8 rollout of 1,000-token prompts on the fp32 0.6B shape."""
    out = jax.ShapeDtypeStruct(dst.shape, dst.dtype)
    return jax.ffi.ffi_call("hljax_copy_rows", out, input_output_aliases={0: 0})(
        dst, src, src_rows.astype(jnp.int32), dst_rows.astype(jnp.int32))
