"""Seeds derived from names: everything a step or round draws depends only on what it is."""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A sampling seed that depends only on `parts` (run seed, step, index), so reruns repeat."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=4).digest(), "little") % 2**31
