"""The layers of bmlmpi (bmlmpi.kernels included), bottom up, as docs/architecture.md draws
them: a module imports only from its own layer or below, no two modules import each other
(directly or through others), and no two packages do either. Imports are read with ``ast``
from the source, so an import inside a function (a lazy import) or under ``TYPE_CHECKING``
counts like one at the top of the module. The one exception is a module's top-level
``if __name__ == "__main__":`` block: it runs only when the file is started as a program
(``python -m bmlmpi.calibrate`` hands over to ``bmlmpi.cli.calibrate``), never when another
module imports it, so it adds no dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The layers, bottom up: (name, the modules and packages in it). A module belongs to the
#: entry naming it or the package holding it (the longest name that matches); ``bmlmpi`` is
#: the package's own ``__init__`` only.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("bmlmpi", "bmlmpi.config", "bmlmpi.ops", "bmlmpi.dlpack")),
    ("topology (MPI-free)", ("bmlmpi.topology",)),
    ("schedules (MPI-free)", ("bmlmpi.schedules",)),
    ("model (MPI-free)", ("bmlmpi.model",)),
    ("kernels", ("bmlmpi.kernels",)),
    ("reproducible (MPI-free)", ("bmlmpi.reproducible",)),
    ("transport", ("bmlmpi.execute", "bmlmpi.deferred", "bmlmpi.shm", "bmlmpi.binding",
                   "bmlmpi.executors")),
    ("core", ("bmlmpi.agreement", "bmlmpi.selection", "bmlmpi.calibrate", "bmlmpi.buffers",
              "bmlmpi.recorder", "bmlmpi.fr_format", "bmlmpi.timeline", "bmlmpi.watchdog",
              "bmlmpi.handles",
              "bmlmpi.finalize", "bmlmpi.placement", "bmlmpi.plans", "bmlmpi.call_gate",
              "bmlmpi.call_numbers", "bmlmpi.call_policy", "bmlmpi.pair_tables",
              "bmlmpi.progress", "bmlmpi.tuner",
              "bmlmpi.tuning_table", "bmlmpi.auto_tuning")),
    ("api", ("bmlmpi.api", "bmlmpi.dropin", "bmlmpi.calls", "bmlmpi.fast_path", "bmlmpi.family",
             "bmlmpi.collectives", "bmlmpi.persistent", "bmlmpi.call_agreement",
             "bmlmpi.call_log", "bmlmpi.call_formats",
             "bmlmpi.ft", "bmlmpi.compression", "bmlmpi.training", "bmlmpi.variants")),
    ("frameworks", ("bmlmpi.torch",)),
    ("cli", ("bmlmpi.cli", "bmlmpi.bench")),
)


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


def is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``, the block only a program's start runs."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The bmlmpi modules ``name`` imports anywhere in its source, but for its top-level
    ``if __name__ == "__main__":`` block."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    tree.body = [stmt for stmt in tree.body if not is_main_guard(stmt)]
    for node in ast.walk(tree):
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


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer in :data:`LAYERS`, None when no entry names it."""
    best, found = -1, None
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            inside = module.startswith(m + ".") and m != "bmlmpi"
            if (module == m or inside) and len(m) > best:
                best, found = len(m), i
    return found


def package_of(module: str) -> str:
    """The package a module stands for in the package graph: its folder under bmlmpi
    (``bmlmpi.ft.ledger`` -> ``bmlmpi.ft``), or the module itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2])


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
    assert "bmlmpi.kernels" in graph["bmlmpi.calls"]            # from . import kernels
    assert "bmlmpi.timeline" in graph["bmlmpi.api"]             # inside a method
    assert "bmlmpi.ft.recovery" in graph["bmlmpi.ft.policy"]
    assert "bmlmpi.kernels.cupy_backend" in graph["bmlmpi.kernels.dispatch"]
    # python -m bmlmpi.calibrate starts bmlmpi.cli.calibrate: a program's start, no dependency
    assert "bmlmpi.cli.calibrate" not in graph["bmlmpi.calibrate"]
    assert "bmlmpi.cli.calibrate" in (ROOT / "bmlmpi" / "calibrate.py").read_text()
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_among_bmlmpi_modules():
    mods = source_modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in source_modules() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return [f"{m} ({LAYERS[layer_of(m)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
            for m in sorted(graph) for dep in sorted(graph[m]) if layer_of(dep) > layer_of(m)]


def test_each_module_imports_only_its_own_layer_or_below():
    mods = source_modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    violations = upward_imports(graph)
    assert not violations, "imports up the layers:\n" + "\n".join(violations)


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("bmlmpi.ft.ledger") == layer_of("bmlmpi.api")
    assert layer_of("bmlmpi.schedules.bml") < layer_of("bmlmpi.model.cost")
    assert layer_of("bmlmpi.kernels.dispatch") < layer_of("bmlmpi.execute")
    assert layer_of("bmlmpi.cli.bench") == len(LAYERS) - 1
    assert layer_of("bmlmpi.nonexistent") is None
    assert upward_imports({"bmlmpi.execute": {"bmlmpi.api", "bmlmpi.config"},
                           "bmlmpi.schedules.recovery": {"bmlmpi.model.cost"}}) == [
        "bmlmpi.execute (transport) imports bmlmpi.api (api)",
        "bmlmpi.schedules.recovery (schedules (MPI-free)) imports bmlmpi.model.cost "
        "(model (MPI-free))"]


def test_no_import_cycle_among_bmlmpi_packages():
    mods = source_modules()
    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        deps = {package_of(d) for d in imports_of(m, p, set(mods))} - {package_of(m)}
        graph.setdefault(package_of(m), set()).update(deps)
    for deps in list(graph.values()):
        for d in deps:
            graph.setdefault(d, set())
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_the_base_communicator_never_reaches_fault_tolerance():
    """The fault-tolerant communicator plugs into the base through one declared seam
    (:mod:`bmlmpi.variants`): nothing the base communicator imports, directly or through
    others, is in ``bmlmpi.ft``, and the package's ``__init__`` loads no module by a name
    the import reader cannot see beyond its table of exports."""
    mods = source_modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    reached, todo = set(), ["bmlmpi.api"]
    while todo:
        for dep in graph[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert not sorted(m for m in reached if m.startswith("bmlmpi.ft")), reached
    assert "bmlmpi.ft.communicator" in graph["bmlmpi.variants"]
    init = ast.parse((ROOT / "bmlmpi" / "__init__.py").read_text())
    names = {n.id for n in ast.walk(init) if isinstance(n, ast.Name)}
    assert "_ALSO_LOADS" not in names
