"""``auto``'s rules are data: ``bmlmpi/selection.py`` names no registered algorithm (not in
code, strings, comments or docstrings), so what ``auto`` may price and its fixed rules are read
from the algorithm records alone, and a record opts in to ``auto``."""

from __future__ import annotations

import re
from pathlib import Path

from bmlmpi.schedules import algorithms

SELECTION = Path(__file__).resolve().parents[2] / "bmlmpi" / "selection.py"


def test_selection_names_no_algorithm():
    names = "|".join(re.escape(n) for n in sorted(algorithms.REGISTRY, key=len, reverse=True))
    word = re.compile(rf"\b({names})\b", re.IGNORECASE)
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(SELECTION.read_text().splitlines(), 1)
            if word.search(line)]
    assert not hits, "selection.py names algorithms; put the rule in the records:\n" + \
        "\n".join(hits)


def test_the_records_carry_autos_rules():
    records = list(algorithms.REGISTRY.values())
    # the algorithms offered to auto before opting in existed, the all-to-all's, and only they
    assert [a.name for a in records if a.auto] == ["bml", "ring", "tree", "multitree",
                                                    "hierarchical", "shm", "rabenseifner",
                                                    "pairwise", "bruck", "bcube", "native"]
    assert all(a.offered for a in records if a.auto)
    assert [a.name for a in records if a.default] == ["native"]
    assert algorithms.default().margin == algorithms.NATIVE_MARGIN > 1
    assert all(a.margin == 1.0 for a in records if not a.default)
    assert [algorithms.for_empty(c) for c in ("allreduce", "reduce_scatter", "bcast")] == \
        ["bml", "native", "native"]
    assert {algorithms.fixed_choice(c) for c in algorithms.NAMES if c != "alltoall"} == {"bml"}
    # bml has no all-to-all: the first record that opts in and has a schedule for it
    assert algorithms.fixed_choice("alltoall") == "pairwise"
    assert algorithms.node_tier(True) == "shm" and algorithms.node_tier(False) == "ring"
    # every field auto reads is documented on the record
    for field in ("auto", "default", "margin", "empty", "fixed", "shared_memory", "applies",
                  "max_ranks"):
        assert re.search(rf"``{field}(``|\()", algorithms.Algorithm.__doc__), field
