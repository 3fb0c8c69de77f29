"""The shape of the device mesh as a config. Free of JAX, so that config files, which name it, load
without it (a flag error comes back at once); hljax/sharding.py builds the mesh."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape; -1 on one axis means "all remaining devices"."""

    data: int = 1  # Data-parallel axis (replicated weights).
    fsdp: int = -1  # Fully sharded data-parallel axis (weights sharded, gathered per layer).
    tensor: int = 1  # Tensor-parallel axis (heads and MLP columns split).

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {self}")
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh axis sizes must be positive or -1, got {self}")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"{num_devices} devices do not divide into mesh {self}")
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(f"mesh {self} needs {math.prod(sizes)} devices, have {num_devices}")
        return tuple(sizes)
