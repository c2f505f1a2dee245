"""Fault tolerance is a policy object the call pipeline calls, not a subclass overriding
private hooks (docs/architecture.md; :mod:`bmlmpi.call_policy`).

Three rules, read from the source and the classes of ``bmlmpi/``:

* no class declares a ``SEAM`` (a list of private hooks a subclass may override);
* no ``NamedTuple`` holds callables (a tuple of hooks hides the flow from "go to
  definition": a part is handed the object it calls instead); :data:`PENDING` lists the
  tuples still there, and only shrinks;
* no class of :mod:`bmlmpi.ft` overrides a private method of :class:`bmlmpi.Communicator`
  (what differs under failures is the policy the communicator holds).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import bmlmpi
import bmlmpi.variants  # noqa: F401  (the fault-tolerant communicator registered)
from bmlmpi.api import Communicator

ROOT = Path(__file__).resolve().parents[2]

#: Hook tuples still in the package (``module.Class``): they are replaced by the object the
#: part calls; the list only shrinks (a name no longer found fails the test too).
PENDING: set[str] = set()


def package_sources() -> dict[str, ast.Module]:
    """Module name -> parsed source of every module under bmlmpi/ (kernels/ is a link)."""
    found = {}
    package = (ROOT / "bmlmpi").resolve()
    for path in sorted((ROOT / "bmlmpi").rglob("*.py")):
        if not path.resolve().is_relative_to(package):
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return found


def seams(tree: ast.Module) -> list[str]:
    """The classes of ``tree`` that assign a class attribute named ``SEAM``."""
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            for stmt in node.body
            if isinstance(stmt, (ast.Assign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id == "SEAM"
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))]


def hook_tuples(tree: ast.Module) -> list[str]:
    """The ``NamedTuple`` classes of ``tree`` with a field annotated as a callable."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "NamedTuple"
                or isinstance(b, ast.Attribute) and b.attr == "NamedTuple" for b in node.bases)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and "Callable" in ast.unparse(stmt.annotation):
                found.append(node.name)
                break
    return found


def ft_overrides() -> dict[str, set[str]]:
    """Per class of bmlmpi.ft: the private methods of :class:`Communicator` (its bases
    included) it defines again."""
    base_private = {name for cls in Communicator.__mro__ if cls.__module__.startswith("bmlmpi")
                    for name in cls.__dict__
                    if name.startswith("_") and not name.endswith("__")}
    found: dict[str, set[str]] = {}
    for info in pkgutil.walk_packages(bmlmpi.ft.__path__, "bmlmpi.ft."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != info.name or not issubclass(cls, Communicator):
                continue
            mine = {n for n in cls.__dict__ if n in base_private}
            if mine:
                found[f"{info.name}.{cls.__name__}"] = mine
    return found


def test_no_class_declares_a_seam():
    found = {m: names for m, tree in package_sources().items() if (names := seams(tree))}
    assert not found, f"classes declaring SEAM (hooks a subclass overrides): {found}"


def test_no_named_tuple_of_callables_beyond_the_pending_ones():
    found = {f"{m}.{name}" for m, tree in package_sources().items()
             for name in hook_tuples(tree)}
    assert not found - PENDING, f"new tuples of callables: {sorted(found - PENDING)}"
    assert not PENDING - found, f"gone: take these out of PENDING: {sorted(PENDING - found)}"


def test_the_fault_tolerant_communicator_overrides_no_private_method_of_the_base():
    assert "bmlmpi.ft.communicator" in sys.modules
    found = ft_overrides()
    assert not found, f"private methods of Communicator overridden in bmlmpi.ft: {found}"


def test_the_checks_see_a_seam_a_hook_tuple_and_an_override(monkeypatch):
    source = ("class Engine:\n    SEAM = frozenset({'_go'})\n"
              "class Hooks(NamedTuple):\n    go: Callable[[], None]\n    n: int\n"
              "class Plain(NamedTuple):\n    n: int\n")
    tree = ast.parse(source)
    assert seams(tree) == ["Engine"]
    assert hook_tuples(tree) == ["Hooks"]

    class Variant(Communicator):
        def _recorder(self, *args):  # a private name of the base, defined again
            return None
    Variant.__module__ = "bmlmpi.ft.communicator"
    module = sys.modules["bmlmpi.ft.communicator"]
    monkeypatch.setattr(module, "Variant", Variant, raising=False)
    assert ft_overrides() == {"bmlmpi.ft.communicator.Variant": {"_recorder"}}
