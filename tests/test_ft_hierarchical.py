"""Failure tests for hierarchical allreduce: a rank dies and leaves its node with fewer ranks.

Launched like :mod:`tests.test_ft_launch` (``bmlmpi-run --ft``, ``tests/ft/ft_ranks.py``) with
``BMLMPI_RANKS_PER_NODE=2``: each group pretends nodes of 2 consecutive ranks. A rank is
killed in the middle of a hierarchical call (during its local reduce-scatter, its inter-node
allreduce or its local allgather); every survivor must finish that call and the later ones
with the exact reduction over the survivors, and run them on the survivors' own nodes — the
dead rank's partner alone on its node, every other pair intact (the fault-tolerant
communicator's ``nodes()`` restricts the original nodes to the survivors).
"""

from __future__ import annotations

import pytest
from test_ft_launch import check, group, kill, launch


def home_nodes(size: int, dead: set[int]) -> list[list[int]]:
    pairs = [[r for r in (lo, lo + 1) if r < size and r not in dead] for lo in range(0, size, 2)]
    return [p for p in pairs if p]


def test_hierarchical_survivors_keep_their_nodes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", "2")
    # N = 4 (2 nodes) and N = 6 (3 nodes): 4 steps each (1 local reduce-scatter step, 2 BML
    # or ring steps between nodes, 1 local allgather step). Deaths at steps 0, 1, 2 and 3 of
    # the schedule, in place and not, sum and average, and a second death in a later call.
    groups = [
        group(4, "hierarchical", calls=3, kills=(kill(1, 1, "post", 1, "kill"),)),
        group(6, "hierarchical", calls=4, op="avg",
              kills=(kill(1, 4, "during", 2, "kill"), kill(2, 1, "post", 0, "raise"))),
        group(6, "hierarchical", calls=3, in_place=True,
              kills=(kill(1, 3, "post", 3, "exit"),)),
    ]
    res, records = launch(groups)
    check(groups, res, records)
    for gi, g in enumerate(groups):
        dead: set[int] = set()
        survivors = [r for r in records if r.get("group") == gi and "results" in r]
        assert survivors, gi
        for call in survivors[0]["results"]:
            assert call["schedule"] == "hierarchical", call
            # the communicator after the call: the original pairs less every rank lost so far
            assert call["nodes"] == home_nodes(g["size"], set(call["failed"])), (gi, call)
            dead |= set(call["failed"])
        assert dead == {k["rank"] for k in g["kills"]}, (gi, dead)
