"""Classes compose; they do not share private state across modules.

Two rules, read from the source of every module under ``bmlmpi/``:

* **A module reads through ``self`` only the private names it defines** (a method, a class
  attribute, an attribute it assigns on ``self``). A mixin that reads ``self._comm`` assigned
  in another module shares that module's private state: that is what this refuses.
* **A subclass or mixin in another module overrides no private method of its base**, and no
  two modules of one class's bases assign the same private attribute on ``self``. Overriding a
  private method reaches into the base's implementation (what differs between variants is an
  object they hold, as :mod:`bmlmpi.call_policy`'s policy); assigning the same attribute is
  sharing its state.

:data:`KNOWN` lists what today's code still does against the rules, module by module; it only
shrinks: a listed name that no longer breaks a rule fails the test too, so the list stays
true.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

from test_private_access import _is_self, _private, defined_here

import bmlmpi

ROOT = Path(__file__).resolve().parents[2]

#: What the code still does against the rules: module -> private names it reads through
#: ``self`` without defining them (rule 1) or overrides without its base declaring them
#: (rule 2, as ``"override <base module>.<Class>.<name>"``).
KNOWN: dict[str, set[str]] = {}


def bmlmpi_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(bmlmpi.__path__, "bmlmpi."):
        if info.name.startswith(("bmlmpi.torch", "bmlmpi.kernels")):
            continue  # torch is an optional extra; kernels/ has no classes that inherit
        module = importlib.import_module(info.name)
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if c.__module__ == info.name]
    return found


def reads_not_defined(source: str, allowed: frozenset[str] = frozenset()) -> set[str]:
    """Private names ``source`` reads through ``self``/``cls`` but does not define (nor finds
    in ``allowed``)."""
    tree = ast.parse(source)
    own = defined_here(tree)
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and _is_self(n.value)
            and _private(n.attr) and n.attr not in own and n.attr not in allowed}


def self_stores(cls: type) -> set[str]:
    """The private attributes the body of ``cls`` assigns on ``self``."""
    try:
        tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    except (OSError, TypeError):
        return set()
    return {n.attr for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _is_self(n.value)
            and _private(n.attr)}


def undeclared_overrides() -> dict[str, set[str]]:
    """Per module: private methods it overrides that a base (or a later mixin) in another
    module defines, private attributes it assigns on
    ``self`` that a class of another module in the same hierarchy assigns too, and methods or
    properties it defines under a name such a class assigns on ``self``."""
    found: dict[str, set[str]] = {}
    for cls in bmlmpi_classes():
        mro = [c for c in cls.__mro__ if c.__module__.startswith("bmlmpi")]
        for i, mine in enumerate(mro):
            for name in mine.__dict__:
                if not _private(name):
                    continue
                for base in mro[i + 1:]:
                    if name in base.__dict__ and base.__module__ != mine.__module__:
                        found.setdefault(mine.__module__, set()).add(
                            f"override {base.__module__}.{base.__qualname__}.{name}")
        stores = {c: self_stores(c) for c in mro}
        for i, mine in enumerate(mro):
            for base in mro[i + 1:]:
                if base.__module__ != mine.__module__:
                    found.setdefault(mine.__module__, set()).update(
                        f"assigns {base.__module__}.{base.__qualname__}'s {name}"
                        for name in stores[mine] & stores[base])
                    # a method or property of this class hiding what the base assigns on
                    # ``self``: the base then writes into (or reads) the subclass's version
                    found[mine.__module__].update(
                        f"shadows {base.__module__}.{base.__qualname__}'s {name}"
                        for name in stores[base] & {n for n in mine.__dict__ if _private(n)})
    return {m: names for m, names in found.items() if names}


def violations() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "bmlmpi").rglob("*.py")):
        if not path.resolve().is_relative_to((ROOT / "bmlmpi").resolve()):
            continue  # bmlmpi/kernels is a link to the top-level kernels/
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        reads = reads_not_defined(path.read_text())
        if reads:
            found[".".join(parts)] = reads
    for module, names in undeclared_overrides().items():
        found.setdefault(module, set()).update(names)
    return found


class _Base:
    def __init__(self):
        self._held = 1


def test_the_check_sees_a_subclass_shadowing_what_its_base_assigns(monkeypatch):
    namespace: dict = {}
    exec("class Shadow(Base):\n    @property\n    def _held(self):\n        return 2\n",
         {"Base": _Base}, namespace)
    shadow = namespace["Shadow"]
    shadow.__module__ = "bmlmpi.elsewhere"
    monkeypatch.setattr(_Base, "__module__", "bmlmpi.here")
    monkeypatch.setattr(sys.modules[__name__], "bmlmpi_classes", lambda: [shadow])
    monkeypatch.setattr(sys.modules[__name__], "self_stores",
                        lambda c: {"_held"} if c is _Base else set())
    assert undeclared_overrides() == {"bmlmpi.elsewhere": {"shadows bmlmpi.here._Base's _held"}}


def test_the_check_sees_a_mixin_reading_anothers_state():
    source = '''
class Mixin:
    def go(self):
        self._mine = 1
        return self._mine + self._theirs + self._declared
'''
    assert reads_not_defined(source, frozenset({"_declared"})) == {"_theirs"}


def test_no_class_shares_private_state_across_modules():
    found = violations()
    new = {m: sorted(n - KNOWN.get(m, set())) for m, n in found.items() if n - KNOWN.get(m, set())}
    fixed = {m: sorted(n - found.get(m, set())) for m, n in KNOWN.items()
             if n - found.get(m, set())}
    assert not new, f"private state shared across modules: {new}"
    assert not fixed, f"no longer shared: take these out of KNOWN: {fixed}"
