"""Call numbers and tag slots have one owner, ``bmlmpi/call_numbers.py``: no other module of
bmlmpi changes a counter or computes a tag slot; they ask the owner (docs/architecture.md).

Read with ``ast`` from the source of every module under ``bmlmpi/``:

* a write (``=``, ``+=``, ``del``, ``setattr`` with a literal name) to an attribute that holds
  a counter or the slot arithmetic's sizes — :data:`OWNED` — is the owner's alone;
* the slot arithmetic's names (:data:`ARITHMETIC`) are read only by the owner;
* a slot's base is computed only by the owner: a product with ``TAG_STEPS`` or ``TAG_SPAN``
  (a slot number times a slot's width) anywhere else is refused. Adding a step's offset to a
  base the owner gave (the executor, the compressed exchanges) is not computing a slot.

And the owner's rules themselves: numbers and slots are taken in order, a native call takes
no slot on any path, and the only correction of the slot count is the agreed one.
"""

from __future__ import annotations

import ast
from pathlib import Path

from bmlmpi.call_numbers import CALL_SLOTS, TAG_KINDS, CallNumbers, TagBlocks
from bmlmpi.execute import TAG_STEPS

ROOT = Path(__file__).resolve().parents[2]
OWNER = "bmlmpi/call_numbers.py"
#: attributes that hold call numbers, slot counts or the slot arithmetic's sizes
OWNED = frozenset({"callno", "launches", "taken", "tag_mod", "call_slots", "sig_slots"})
#: names only the owner's slot arithmetic reads
ARITHMETIC = frozenset({"TAG_KINDS", "CALL_SLOTS", "tag_mod", "sig_slots"})
#: a slot's width: a product with one of these computes a slot's base
WIDTHS = frozenset({"TAG_STEPS", "TAG_SPAN"})


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def changes(source: str, filename: str = "<source>") -> list[str]:
    """Every place ``source`` changes a call number or a tag slot count, or computes a slot."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}: "
        if isinstance(node, ast.Attribute) and node.attr in OWNED \
                and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append(where + f"writes {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in OWNED:
            found.append(where + ast.unparse(node))
        elif isinstance(node, (ast.Name, ast.Attribute)) and _name(node) in ARITHMETIC \
                and not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)):
            found.append(where + f"slot arithmetic {ast.unparse(node)}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
                and (_name(node.left) in WIDTHS or _name(node.right) in WIDTHS):
            found.append(where + f"computes a slot: {ast.unparse(node)}")
    return found


def test_the_check_sees_every_kind_of_change():
    source = '''
from .call_numbers import CALL_SLOTS
class Engine:
    def run(self, seq, numbers, n):
        seq.callno += 1                          # flagged
        seq.launches = seq.launches - 1          # flagged (the read is fine)
        setattr(seq, "callno", 0)                # flagged
        base = (n % numbers.call_slots) * TAG_STEPS   # flagged (the product)
        part = n % CALL_SLOTS                    # flagged (the arithmetic's name)
        number, base = numbers.take_scheduled(0, 0)    # asking the owner: fine
        return base + (2 * n) % TAG_SPAN, numbers.callno  # a step's offset, a read: fine
'''
    found = sorted(line.split(": ", 1)[1] for line in changes(source))
    assert found == sorted([
        "writes seq.callno", "writes seq.launches", "setattr(seq, 'callno', 0)",
        "computes a slot: n % numbers.call_slots * TAG_STEPS",
        "slot arithmetic CALL_SLOTS"]), found


def test_only_the_owner_changes_call_numbers_and_tag_slots():
    found = []
    for path in sorted((ROOT / "bmlmpi").rglob("*.py")):
        if not path.resolve().is_relative_to((ROOT / "bmlmpi").resolve()):
            continue  # bmlmpi/kernels is a link to the top-level kernels/
        name = path.relative_to(ROOT).as_posix()
        if name != OWNER:
            found += changes(path.read_text(), name)
    assert not found, ("call numbers or tag slots changed outside " + OWNER + " (ask its "
                       "CallNumbers or TagBlocks instead):\n" + "\n".join(found))


def test_numbers_and_slots_are_taken_in_order():
    numbers = CallNumbers(2**31 - 1)
    assert (numbers.callno, numbers.launches) == (0, 0)
    assert [numbers.take() for _ in range(3)] == [1, 2, 3]
    assert numbers.launches == 0                       # a native call takes no slot
    first = numbers.take_tags(kind=2, sig=5)
    number, second = numbers.take_scheduled(2, 5)
    assert (number, numbers.callno, numbers.launches) == (4, 4, 2)
    # consecutive slots of one signature in its collective's block: TAG_STEPS tags apart
    assert second - first == TAG_STEPS
    assert first // numbers.tag_mod == 2 and second // numbers.tag_mod == 2


def test_slots_keep_collectives_and_signatures_apart_and_cycle():
    numbers = CallNumbers(2**31 - 1)                  # Open MPI's bound
    assert numbers.call_slots == CALL_SLOTS and numbers.sig_slots == 1024
    bases = {}
    for kind in range(TAG_KINDS):
        for sig in range(3):
            for _ in range(CALL_SLOTS):
                base = numbers.take_tags(kind, sig)
                assert base not in bases, (kind, sig, bases.get(base))
                assert 0 <= base and base + TAG_STEPS - 1 <= 2**31 - 1
                bases[base] = (kind, sig)
    # the 65th launch of a signature reuses its first slot (tag slots cycle)
    numbers = CallNumbers(2**31 - 1)
    cycle = [numbers.take_tags(1, 7) for _ in range(CALL_SLOTS + 1)]
    assert cycle[CALL_SLOTS] == cycle[0] and len(set(cycle)) == CALL_SLOTS


def test_a_small_tag_bound_still_gives_every_call_a_slot():
    numbers = CallNumbers(32767)                      # the smallest bound MPI allows
    assert numbers.call_slots == 1 and numbers.sig_slots == 1
    assert {numbers.take_tags(k, s) for k in range(TAG_KINDS) for s in range(4)} == {
        k * numbers.tag_mod for k in range(TAG_KINDS)}
    assert all(k * numbers.tag_mod + TAG_STEPS - 1 <= 32767 for k in range(TAG_KINDS))


def test_the_agreed_correction_is_the_only_one():
    numbers = CallNumbers(2**31 - 1)
    numbers.take_tags()
    numbers.agree_tags(9)             # the largest count among the ranks
    assert numbers.launches == 9
    assert numbers.take_tags() == 9 * TAG_STEPS
    assert numbers.callno == 0        # numbers are never corrected


def test_tag_blocks_cycle_through_what_the_bound_holds():
    blocks = TagBlocks(2**31 - 1, TAG_STEPS, 32)
    assert blocks.blocks == 32
    taken = [blocks.take() for _ in range(33)]
    assert taken[:3] == [0, TAG_STEPS, 2 * TAG_STEPS] and taken[32] == 0
    assert TagBlocks(TAG_STEPS - 1, TAG_STEPS, 32).blocks == 1
    assert TagBlocks(3 * TAG_STEPS, TAG_STEPS, 32).blocks == 3
