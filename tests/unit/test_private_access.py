"""No module of bmlmpi reaches into another object's private attributes.

Read with ``ast`` from the source of every module under ``bmlmpi/``: an attribute ``x._name``
(not a dunder) is private to the module that defines ``_name``, so it may be read or written
only where ``x`` is ``self`` or ``cls``, or where this module itself defines ``_name`` (a
function, class or module-level name, an attribute it assigns on ``self``/``cls``, a
``__slots__`` entry). ``from module import _name`` and ``getattr``/``setattr``/``hasattr``/
``delattr`` with a literal private name are refused everywhere: they are how code reaches
around that rule. The standard
library's few public names that start with an underscore (a named tuple's ``_asdict``,
``_replace``, ``_fields``, ``_make``; ``os._exit``) are not private.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Public API of the standard library spelled with a leading underscore.
PUBLIC_UNDERSCORED = frozenset({"_asdict", "_replace", "_fields", "_make", "_exit"})
REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def defined_here(tree: ast.Module) -> set[str]:
    """The private names this module defines."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and _is_self(node.value):
            names.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
                if isinstance(target, ast.Name) and target.id == "__slots__" and node.value:
                    names.update(c.value for c in ast.walk(node.value)
                                 if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {n for n in names if _private(n)}


def reaches(source: str, filename: str = "<source>") -> list[str]:
    """Every place ``source`` reads or writes another object's private attribute."""
    tree = ast.parse(source, filename)
    own = defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and node.attr not in PUBLIC_UNDERSCORED and not _is_self(node.value) \
                and node.attr not in own:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in REFLECTION and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [f"{filename}:{node.lineno}: from {'.' * node.level}{node.module or ''} "
                      f"import {a.name}" for a in node.names if _private(a.name)]
    return found


def test_the_check_sees_reaching_in():
    source = '''
import os
from .engine import _drive, run as _run              # the first reaches in: flagged
class Box:
    __slots__ = ("_held",)
    def __init__(self, other):
        self._held = other._secret          # another object's: flagged
        self._n = getattr(self, "_count", 0)  # reflection with a private name: flagged
        setattr(other, "_mark", 1)           # flagged
    def same(self, box):
        return box._held, box._n             # this module's own names: fine
def done():
    os._exit(0)                              # public, despite the underscore
    return Box.__name__                      # dunders are public
'''
    found = [line.split(": ", 1)[1] for line in reaches(source)]
    assert sorted(found) == sorted(["from .engine import _drive", "other._secret",
                                    "getattr(self, '_count', 0)", "setattr(other, '_mark', 1)"])


def test_no_module_reaches_into_another_objects_private_attributes():
    found = []
    for path in sorted((ROOT / "bmlmpi").rglob("*.py")):
        if not path.resolve().is_relative_to((ROOT / "bmlmpi").resolve()):
            continue  # bmlmpi/kernels is a link to the top-level kernels/
        found += reaches(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "private attributes reached from another module:\n" + "\n".join(found)
