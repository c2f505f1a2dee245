"""The shape of the call pipeline (docs/architecture.md, item 4 and "The path of one call"):
one record type for every collective's calls, no branch on the string ``"allreduce"``
outside the records and the public facade, and a :class:`bmlmpi.Communicator` of few
methods. Read from the source (the AST) and the class, without MPI traffic."""

import ast
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bmlmpi"

#: Where a branch on the collective's name belongs: the records (the call record, the
#: algorithm records, the collectives' result contracts) and the public facade's public
#: methods.
RECORDS = {"bmlmpi/calls.py", "bmlmpi/schedules/algorithms.py",
           "bmlmpi/schedules/collectives.py"}
FACADE = {"bmlmpi/api.py", "bmlmpi/dropin.py"}

#: The most methods :class:`bmlmpi.Communicator` may have, inherited ones included (dunder
#: methods aside): a ceiling that may only go down, to 39.
METHOD_CEILING = 39


def sources() -> dict[str, ast.Module]:
    """Every module of the package (not the kernels' link), parsed, by its path."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if not path.resolve().is_relative_to(PACKAGE.resolve()):
            continue  # bmlmpi/kernels is a link to the top-level kernels/
        out[str(path.relative_to(ROOT))] = ast.parse(path.read_text(), str(path))
    return out


def call_records(tree: ast.Module) -> list[str]:
    """The classes of ``tree`` that are call records: what the pipeline agrees on across
    ranks (a ``signature`` method) and enters in the flight recorder (``traced``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {f.name for f in node.body
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if {"signature", "traced"} <= methods:
                found.append(node.name)
    return found


def _names_allreduce(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "allreduce"
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_allreduce(e) for e in node.elts)
    return False


def allreduce_branches(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, enclosing function) of every comparison with ``"allreduce"`` (``==``,
    ``!=``, ``in``/``not in`` a literal naming it) in ``tree``."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Compare) and any(
                _names_allreduce(e) for e in (node.left, *node.comparators)):
            found.append((node.lineno, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)
    visit(tree, "")
    return found


def misplaced_branches(modules: dict[str, ast.Module]) -> dict[str, list[tuple[int, str]]]:
    """The ``"allreduce"`` comparisons outside the records and the facade's public
    methods, by module."""
    out = {}
    for path, tree in modules.items():
        if path in RECORDS:
            continue
        found = allreduce_branches(tree)
        if path in FACADE:
            found = [(line, f) for line, f in found if f.startswith("_")]
        if found:
            out[path] = found
    return out


def communicator_methods() -> list[str]:
    from bmlmpi import Communicator
    return [name for name, value in inspect.getmembers(Communicator)
            if callable(value) and not (name.startswith("__") and name.endswith("__"))]


def test_one_call_record_type():
    records = {f"{path}:{name}" for path, tree in sources().items()
               for name in call_records(tree)}
    assert records == {"bmlmpi/calls.py:CollectiveCall"}, sorted(records)


def test_no_allreduce_branch_outside_the_records_and_the_facade():
    found = misplaced_branches(sources())
    assert not found, f"branches on \"allreduce\" outside the records and the facade: {found}"


def test_the_branch_finder_sees_every_spelling():
    tree = ast.parse(
        "def _f(c):\n"
        "    a = c == 'allreduce'\n"
        "    b = 'allreduce' != c\n"
        "    d = c in ('allreduce', 'reduce')\n"
        "    e = c not in {'bcast', 'allreduce'}\n"
        "    return c == 'reduce' or c is None\n"
        "def Allreduce(c):\n"
        "    return c == 'allreduce'\n")
    assert allreduce_branches(tree) == [(2, "_f"), (3, "_f"), (4, "_f"), (5, "_f"),
                                        (8, "Allreduce")]


def test_communicator_has_at_most_the_ceiling_of_methods():
    methods = communicator_methods()
    assert len(methods) <= METHOD_CEILING, (len(methods), methods)
    assert len(methods) == METHOD_CEILING, (
        f"Communicator has {len(methods)} methods now: lower METHOD_CEILING to it")
