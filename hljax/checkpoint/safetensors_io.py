"""Minimal safetensors reader/writer over numpy memmaps.

Reading is lazy: a tensor is a memmap view, so slicing it for one device's shard reads only that
shard from disk. bf16 and fp8 map to `ml_dtypes`, which numpy (and the `safetensors` package's
numpy backend) lack natively.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A malformed safetensors file; the message names the file."""


def read_header(path: str) -> tuple[dict, int]:
    """-> (header without __metadata__, byte offset where tensor data starts)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise SafetensorsError(f"{path}: header length {n} is implausible")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def open_tensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one file as read-only memmap views (no data is read yet)."""
    header, start = read_header(path)
    size = os.path.getsize(path)
    out = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        dtype = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) or start + end > size:
            raise SafetensorsError(f"{path}: tensor {name!r} has inconsistent offsets {begin}..{end}")
        if end == begin:
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
    return out


def save_file(tensors: Mapping[str, np.ndarray], path: str, metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` (in the given order) to `path` atomically."""
    if np.little_endian is False:
        raise SafetensorsError("writing safetensors on a big-endian host is not supported")
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {arr.dtype}")
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # Data starts 8-byte aligned, as the format recommends.
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.reshape(-1).view(np.uint8).data)  # Native order; safetensors is little-endian.
    os.replace(tmp, path)
