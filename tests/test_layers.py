"""The package's layers, read from its own imports: no module imports a layer above its own,
and no group of modules imports itself round in a loop.

Every import counts, at module level or inside a function or a TYPE_CHECKING block: a lazy
import is still a dependency a newcomer has to know about.
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"

# Lowest first. A module may import its own layer and those below it.
LAYERS = ("records", "checkers", "devices", "sanitizer", "faults", "protocol", "engines", "input", "model", "run",
          "api", "examples", "report", "studies", "frontends")


def _module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in HARNESS.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """The harness modules `name` imports (a package's submodule when `from package import module`)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("harness")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return len(LAYERS)  # harness/__init__ and __main__: the top
    return LAYERS.index(parts[1])


# Entry points above every layer: `python -m harness`.
TOP = ("__main__",)


def test_every_module_sits_in_a_layer():
    loose = [n for n in MODULES if n.count(".") == 1 and n.split(".")[1] not in (*LAYERS, *TOP)]
    assert not loose, f"modules outside every layer: {loose}"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{a} imports {b}" for a, deps in GRAPH.items() for b in deps if _layer(b) > _layer(a))
    assert not upward, "\n".join(upward)


def test_no_import_loops():
    # Tarjan's strongly connected components: any with two or more modules is a loop.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not loops, loops
