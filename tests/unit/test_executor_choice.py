"""The choice between the message and the shared-memory executor is made in one place, the
transport layer's :mod:`bmlmpi.executors` (docs/architecture.md): every other module holds a
compiled plan without asking which kind it is and starts it there.

Read with ``ast`` from the source of every module under ``bmlmpi/``:

* a type test (``isinstance``, ``type(x) is``/``is not``/``==``) on a plan or a run class —
  :data:`PLAN_AND_RUN` — is the chooser's alone (a :class:`~bmlmpi.execute.Run` asking
  which earlier runs are message runs sharing its tags is not a choice: :data:`OWN_TESTS`);
* a run class is used as a value (constructed, picked by an ``if``, put in a tuple) only
  inside the transport layer's executors (:data:`EXECUTORS`); elsewhere it may only be
  named in an annotation;
* ``collective_run`` and a plan's ``start_collective`` method are called by the chooser
  only.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHOOSER = "bmlmpi/executors.py"
RUNS = frozenset({"Run", "ShmRun"})
PLAN_AND_RUN = RUNS | {"Plan", "ShmPlan"}
#: the executors themselves, which build their own runs (a shared-memory run's message phases)
EXECUTORS = frozenset({CHOOSER, "bmlmpi/execute.py", "bmlmpi/shm.py"})
#: (module, class) type tests that choose nothing
OWN_TESTS = frozenset({("bmlmpi/execute.py", "Run")})


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _annotations(tree: ast.Module) -> set[int]:
    """The ids of every node inside an annotation."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            roots += [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                             args.vararg, args.kwarg]
                      if a is not None and a.annotation is not None]
            if node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _tested_classes(node: ast.AST) -> list[str]:
    """The plan and run classes a type test names (``isinstance``, ``type(x) is C``)."""
    if isinstance(node, ast.Call) and _name(node.func) == "isinstance" and len(node.args) == 2:
        return [n for leaf in ast.walk(node.args[1]) if (n := _name(leaf)) in PLAN_AND_RUN]
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
            and _name(node.left.func) == "type" \
            and all(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in node.ops):
        return [n for c in node.comparators if (n := _name(c)) in PLAN_AND_RUN]
    return []


def choices(source: str, filename: str) -> list[str]:
    """Every place ``source`` (the module ``filename``, relative to the root) picks an
    executor itself."""
    tree = ast.parse(source, filename)
    annotated = _annotations(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        where = f"{filename}:{line}: "
        tested = [c for c in _tested_classes(node) if (filename, c) not in OWN_TESTS]
        if tested and filename != CHOOSER:
            found.append((line, where + f"type test on {', '.join(tested)}: {ast.unparse(node)}"))
        elif isinstance(node, ast.Name) and node.id in RUNS and isinstance(node.ctx, ast.Load) \
                and id(node) not in annotated and filename not in EXECUTORS:
            found.append((line, where + f"{node.id} used as a value"))
        elif isinstance(node, ast.Call) and filename != CHOOSER and (
                _name(node.func) == "collective_run"
                or isinstance(node.func, ast.Attribute) and node.func.attr == "start_collective"):
            found.append((line, where + f"starts a plan itself: {ast.unparse(node.func)}"))
    return [f for _, f in sorted(found)]


def package_choices(root: Path = ROOT) -> list[str]:
    found = []
    package = (root / "bmlmpi").resolve()
    for path in sorted((root / "bmlmpi").rglob("*.py")):
        if path.resolve().is_relative_to(package):
            name = path.relative_to(root).as_posix()
            found += choices(path.read_text(), name)
    return found


def test_only_the_transport_layer_chooses_the_executor():
    found = package_choices()
    assert not found, "executor chosen outside bmlmpi/executors.py:\n" + "\n".join(found)


def test_the_chooser_is_in_the_transport_layer():
    from test_imports import LAYERS
    transport = dict(LAYERS)["transport"]
    assert "bmlmpi.executors" in transport
    assert {"bmlmpi.execute", "bmlmpi.shm"} <= set(transport)


def test_the_finder_sees_every_way_of_choosing():
    source = (
        "def f(plan, run: Run | ShmRun) -> ShmRun:\n"
        "    x: Run = run\n"
        "    if isinstance(plan, ShmPlan):\n"
        "        return plan.start_collective(1)\n"
        "    kind = ShmRun if plan else Run\n"
        "    if type(run) is execute.Run:\n"
        "        return collective_run(plan)\n"
        "    return isinstance(run, (int, shm.ShmRun))\n")
    found = choices(source, "bmlmpi/calls.py")
    assert [f.split(": ", 1)[0] for f in found] == [
        "bmlmpi/calls.py:3", "bmlmpi/calls.py:4", "bmlmpi/calls.py:5", "bmlmpi/calls.py:5",
        "bmlmpi/calls.py:6", "bmlmpi/calls.py:7", "bmlmpi/calls.py:8"], found
    assert not choices(source, CHOOSER)
    assert not choices("class Run:\n    def later(self, held):\n"
                       "        return type(held) is Run\n", "bmlmpi/execute.py")
