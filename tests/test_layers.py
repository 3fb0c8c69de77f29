"""Every import goes down the layer order of the README's Layout section (or stays in its layer),
and no import closes a cycle, between files or between packages: the imports of every module of
hljax/, sandbox/ and launch/ are read with ast, function-level and TYPE_CHECKING ones included, so a
new upward import or cycle fails here the moment it is written. Packages of one layer may import each
other, but only one way round."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("hljax", "sandbox", "launch")

# Top to bottom; a module may import from its own layer and the layers below. The small top-level
# modules sit where their imports and importers put them (README, Layout).
LAYERS = (
    ("configs",),  # Experiment files: nothing in the packages imports them.
    ("launch",),
    ("hljax.api",),  # The Python API: the launchers' objects behind a few functions.
    ("hljax.preflight",),  # The launchers' start-up checks, over every typed config.
    ("hljax.loop", "hljax.rl", "hljax.data"),
    ("hljax.endpoints",),  # Generator construction: every backend opened in one place.
    ("hljax.config",),  # Shared config machinery and specs, above the components they name.
    ("hljax.harness", "hljax.tasks", "hljax.generate", "sandbox"),
    ("hljax.checkpoint",),
    ("hljax.models", "hljax.kernels"),
    ("hljax.sharding", "hljax.mesh", "hljax.distributed", "hljax.seeding", "hljax.metrics", "hljax.tokenizer",
     "hljax"),
)


def layer(module: str) -> int | None:
    """Index in LAYERS of `module` (longest matching prefix); None for modules outside the project."""
    best, rank = "", None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, rank = p, i
    return rank


def modules() -> list[tuple[str, str]]:
    out = []
    for package in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                    out.append((rel.removesuffix(".__init__"), path))
    return sorted(out)


def imports(module: str, path: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement in the file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # `from hljax import sharding` imports the submodule hljax.sharding.
            out += [(node.lineno, f"{base}.{alias.name}" if layer(f"{base}.{alias.name}") is not None
                     and base in ("hljax", "sandbox", "launch") else base) for alias in node.names]
    return out


def test_every_module_is_in_a_layer():
    assert [m for m, _ in modules() if layer(m) is None] == []


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_imports_go_down(module, path):
    mine = layer(module)
    upward = [f"line {line}: {name} ({' / '.join(LAYERS[layer(name)])})" for line, name in imports(module, path)
              if layer(name) is not None and layer(name) < mine]
    assert not upward, f"{module} ({' / '.join(LAYERS[mine])}) imports upward: {upward}"


def package(module: str) -> str:
    """hljax.generate.client -> hljax.generate; sandbox.pool -> sandbox; hljax.config -> hljax.config."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "hljax" else parts[0]


def graph(level) -> dict[str, set[str]]:
    """Import edges between project modules mapped through `level` (a module -> its node)."""
    known = {m for m, _ in modules()}
    edges: dict[str, set[str]] = {}
    for module, path in modules():
        for _, name in imports(module, path):
            while name and name not in known:  # `from hljax.x import f`: the module hljax.x.
                name = name.rpartition(".")[0]
            if name and level(name) != level(module):
                edges.setdefault(level(module), set()).add(level(name))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


@pytest.mark.parametrize("level", ["file", "package"])
def test_no_import_cycles(level):
    assert cycles(graph(package if level == "package" else (lambda m: m))) == []


def test_the_readme_states_the_order():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "launch -> loop/rl/data -> harness/tasks/generate/sandbox -> checkpoint -> models -> sharding" in readme
