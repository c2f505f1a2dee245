"""No two modules of bmlmpi (bmlmpi.kernels included) import each other, directly or through
others. Imports are read with ``ast`` from the source, so an import inside a function (a lazy
import) or under ``TYPE_CHECKING`` counts like one at the top of the module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_modules() -> dict[str, Path]:
    """Module name -> file: bmlmpi/ as it is, kernels/ shipped as bmlmpi.kernels."""
    mods = {}
    for folder, package in ((ROOT / "bmlmpi", "bmlmpi"), (ROOT / "kernels", "bmlmpi.kernels")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([package, *parts])] = path
    return mods


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The bmlmpi modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_the_module_reader_sees_lazy_and_relative_imports():
    mods = source_modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    assert "bmlmpi.execute" in graph["bmlmpi.api"]              # from .execute import ...
    assert "bmlmpi.kernels" in graph["bmlmpi.api"]              # from . import kernels
    assert "bmlmpi.calibrate" in graph["bmlmpi.api"]            # inside a method
    assert "bmlmpi.schedules.catalog" in graph["bmlmpi.ft.communicator"]
    assert "bmlmpi.kernels.cupy_backend" in graph["bmlmpi.kernels.dispatch"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_among_bmlmpi_modules():
    mods = source_modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
