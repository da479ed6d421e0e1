"""Print ranksight's import graph by import path: its circles and its arrows against the
layer order.

Usage: ``python tools/import_graph.py [--edges]``. Exit code 0 when there are no circles,
no arrows against the layers and no package that is both ground and roof, else 1.

Files are named by their import path (``ranksight.store.base``), following pyproject's
``package-dir`` (``store/`` is ``ranksight.store``), which mypy and most graph tools do not
follow. An import inside ``if TYPE_CHECKING:`` is not an arrow (it is never run). Imports
inside functions are arrows: they are run, only later.

The layers, lowest first; each may import only layers at or below its own:

1. ground (``ranksight.ground``): shared vocabulary, importing nothing of ranksight above it;
2. hooks and store;
3. collectors, importers, the reference trainer, synthetic runs;
4. agent;
5. analyzer;
6. report and UI (the top package ``ranksight`` itself holds only the report, the demo and
   the version);
7. CLI, demo, launcher, fault matrix.
"""

from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS: list[tuple[int, str]] = [
    (1, "ranksight.ground"),
    (2, "ranksight.trainer_hooks"), (2, "ranksight.store"),
    (3, "ranksight.collectors"), (3, "ranksight.importer"), (3, "ranksight.reference_trainer"),
    (3, "ranksight.synthetic"),
    (4, "ranksight.agent"),
    (5, "ranksight.analyzer"),
    (6, "ranksight"), (6, "ranksight.report"), (6, "ranksight.ui"),
    (7, "ranksight.cli"), (7, "ranksight.demo"), (7, "ranksight.launcher"),
    (7, "ranksight.faultmatrix"),
    (7, "ranksight.agent.command"),
]  # fmt: skip
"""(layer, module prefix); the longest matching prefix decides (``ranksight.agent.command``
is CLI, the rest of ``ranksight.agent`` is the agent). A name ending in ``_cli`` is CLI."""


def package_dirs() -> dict[str, str]:
    """pyproject's ``[tool.setuptools] package-dir``: import path -> folder."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def modules() -> dict[str, str]:
    """import path -> file, for every .py under the package folders."""
    out = {}
    for pkg, folder in sorted(package_dirs().items(), key=lambda kv: -len(kv[0])):
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and d != "autoload"]
            rel = os.path.relpath(dirpath, base)
            parts = [] if rel == "." else rel.split(os.sep)
            if parts and ".".join([pkg, *parts]) in package_dirs():
                continue  # a sub-package with its own package-dir entry is walked on its own
            for name in files:
                if not name.endswith(".py"):
                    continue
                stem = name[:-3]
                mod = ".".join([pkg, *parts] + ([] if stem == "__init__" else [stem]))
                out.setdefault(mod, os.path.join(dirpath, name))
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if hasattr(n, "lineno"):
                        lines.add(n.lineno)
    return lines


def imports_of(mod: str, path: str, known: set[str]) -> set[str]:
    """The ranksight modules ``mod`` imports (resolved to modules that exist)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    skip = _type_checking_lines(tree)
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != mod and name.startswith("ranksight"):
                out.add(name)
    return out


def layer(mod: str) -> int:
    """The layer of ``mod`` (see :data:`LAYERS`)."""
    if mod.rsplit(".", 1)[-1].endswith("_cli"):
        return 7
    best = max(
        (p for p in LAYERS if mod == p[1] or mod.startswith(p[1] + ".")), key=lambda p: len(p[1])
    )
    if best[1] == "ranksight" and mod != "ranksight":
        raise SystemExit(f"{mod}: no layer in tools/import_graph.py LAYERS; give it one")
    return best[0]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def graph() -> dict[str, set[str]]:
    """module -> the ranksight modules it imports. A package's ``__init__`` re-exporting
    its own sub-modules is not counted as an arrow back into it."""
    mods = modules()
    known = set(mods)
    g = {m: imports_of(m, p, known) for m, p in mods.items()}
    for (
        m,
        deps,
    ) in g.items():  # an import of a package means its __init__; its own children are not arrows
        g[m] = {d for d in deps if not (m.startswith(d + ".") and d in mods)}
    return g


def against_layers(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) arrows that point up the layer order."""
    return sorted((a, b) for a, deps in g.items() for b in deps if layer(b) > layer(a))


ROOF = 6
"""Layers from here up are roof (rendering, commands)."""


def ground_and_roof(mods: list[str]) -> list[str]:
    """Packages whose own modules (not their sub-packages') are both ground (layer 1) and roof
    (layer >= :data:`ROOF`); a package's ``__init__`` counts as one of its modules."""
    packages = {m.rsplit(".", 1)[0] for m in mods if "." in m}
    children: dict[str, set[str]] = defaultdict(set)
    for m in mods:
        if m in packages or "." not in m:
            children[m].add(m)  # a package's own __init__ belongs to it, not to its parent
        else:
            children[m.rsplit(".", 1)[0]].add(m)
    return sorted(
        p
        for p, ms in children.items()
        if any(layer(m) == 1 for m in ms) and any(layer(m) >= ROOF for m in ms)
    )


def main(argv: list[str]) -> int:
    g = graph()
    folders = defaultdict(set)
    for a, deps in g.items():
        for b in deps:
            folders[a.rsplit(".", 1)[0]].add(b.rsplit(".", 1)[0])
    if "--edges" in argv:
        for a in sorted(g):
            print(f"{a} [{layer(a)}] -> {', '.join(sorted(g[a]))}")
    circ = circles(g)
    bad = against_layers(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} arrows")
    print(f"{len(circ)} import circles")
    for c in circ:
        print("  circle: " + " <-> ".join(c))
    print(f"{len(bad)} arrows against the layers")
    for a, b in bad:
        print(f"  {a} [{layer(a)}] -> {b} [{layer(b)}]")
    both = ground_and_roof(sorted(g))
    print(f"{len(both)} packages both ground and roof")
    for p in both:
        print(f"  {p}")
    return 0 if not circ and not bad and not both else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
