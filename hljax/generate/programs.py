"""The engine's jitted programs, compiled ahead of time once per argument signature.

`jax.jit` keeps, besides each executable, the traced jaxpr of every signature it has seen, to
retrace without re-running Python. The engine's programs unroll the model's layers, so on a CPU a
28-layer model's prefill or decode jaxpr holds ~15 MB that the engine never uses again: it calls
each signature's executable and never retraces it. A `Program` compiles each new signature from a
throwaway `jax.jit` wrapper, whose trace cache entry goes with it, and keeps only the executable.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax


class Program:
    """fn, jitted with these static and donated arguments, compiled once per signature.

    Calls take every argument, static ones included, like the jitted function; `lower` gives jit's
    `Lowered` (to inspect the program)."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int], donate_argnums: Sequence[int] = ()):
        self.fn = fn
        self.static_argnums = tuple(static_argnums)
        self.donate_argnums = tuple(donate_argnums)
        self._compiled: dict[Any, Any] = {}
        functools.update_wrapper(self, fn)

    def _jit(self):
        def traced(*args):
            return self.fn(*args)

        functools.update_wrapper(traced, self.fn)  # Logs and profiles name the program, not `traced`.
        return jax.jit(traced, static_argnums=self.static_argnums, donate_argnums=self.donate_argnums)

    def lower(self, *args):
        return self._jit().lower(*args)

    def _split(self, args) -> tuple[tuple, list]:
        static = tuple(args[i] for i in self.static_argnums)
        return static, [a for i, a in enumerate(args) if i not in self.static_argnums]

    def __call__(self, *args):
        static, dynamic = self._split(args)
        leaves, tree = jax.tree.flatten(dynamic)
        key = (static, tree, tuple(jax.typeof(x) for x in leaves))
        shardings = [getattr(x, "sharding", None) for x in leaves]
        compiled_for = self._compiled.setdefault(key, [])
        for known, compiled in compiled_for:
            # Equivalent, not equal: on a mesh of size-1 axes P() and P('tensor', 'fsdp') place alike.
            if all(a is b or a == b or (a is not None and b is not None and a.is_equivalent_to(b, x.ndim))
                   for a, b, x in zip(known, shardings, leaves)):
                return compiled(*dynamic)
        compiled = self.lower(*args).compile()
        compiled_for.append((shardings, compiled))
        return compiled(*dynamic)

    def cache_size(self) -> int:
        """Signatures compiled so far."""
        return sum(map(len, self._compiled.values()))


def program(*, static_argnums: Sequence[int], donate_argnums: Sequence[int] = ()) -> Callable[[Callable], Program]:
    """Decorator form of `Program`."""
    return lambda fn: Program(fn, static_argnums, donate_argnums)
