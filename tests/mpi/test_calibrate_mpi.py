"""Calibration under real ranks: collective, identical on every rank, cached on disk."""

import pytest
from mpi4py import MPI

from bmlmpi.calibrate import calibrate
from bmlmpi.model import cheapest


@pytest.mark.mpi
def test_calibrate_agrees_on_every_rank_and_caches(tmp_path_factory, monkeypatch):
    comm = MPI.COMM_WORLD
    where = comm.bcast(str(tmp_path_factory.mktemp("calib")) if comm.rank == 0 else None)
    monkeypatch.setenv("BMLMPI_CACHE_DIR", where)
    monkeypatch.delenv("BMLMPI_RECALIBRATE", raising=False)
    first = calibrate(comm, timeout=60)
    assert first.meta["source"] == "measured"
    assert first.meta["ranks"] == comm.size
    # every rank holds the same numbers (meta is not compared), so every rank chooses alike
    assert all(c == first for c in comm.allgather(first))
    again = calibrate(comm, timeout=60)
    assert again.meta["source"] == "cache" and again == first
    # BMLMPI_RECALIBRATE is a boolean like every other: "false"/"off" keep the cache
    for text in ("false", "off", "No", "0"):
        monkeypatch.setenv("BMLMPI_RECALIBRATE", text)
        assert calibrate(comm, timeout=60).meta["source"] == "cache", text
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "maybe")
    with pytest.raises(ValueError, match="BMLMPI_RECALIBRATE='maybe'"):
        calibrate(comm, timeout=60)   # every rank reads it before anything is shared
    monkeypatch.setenv("BMLMPI_RECALIBRATE", "on")
    assert calibrate(comm, timeout=60).meta["source"] == "measured"
    monkeypatch.delenv("BMLMPI_RECALIBRATE")
    names = ["bml", "ring", "ps", "native"]
    for count in (1, 1000, 1 << 20):
        picks = comm.allgather(cheapest(names, count, 4, comm.size, calib=again))
        assert len(set(picks)) == 1


@pytest.mark.mpi
def test_auto_runs_the_family_schedule_the_calibration_makes_cheap(monkeypatch):
    """A communicator given a calibration record whose measured corrections make one
    reduce-scatter schedule cheap explains that choice (its factor shown) and runs it; the
    result is exact."""
    import numpy as np

    import bmlmpi
    from bmlmpi import selection
    from bmlmpi.model import Calibration
    from bmlmpi.schedules import algorithms

    comm = MPI.COMM_WORLD
    if comm.size < 2:
        pytest.skip("one rank runs native whatever the calibration says")
    monkeypatch.setenv("BMLMPI_CALIBRATE", "0")
    block = 1 << 14
    total = block * comm.size
    names = [a for a in selection.candidates(total, comm.size, collective="reduce_scatter")
             if a in algorithms.corrected() and a != "shm"]
    for cheap in names:
        ctx = bmlmpi.Communicator(comm)
        sizes = (1 << 16, 1 << 20, 1 << 22)
        ctx.calibration = Calibration(
            alpha=1e-6, beta=1e-10, natives=(("reduce_scatter", 8, 1.0),
                                             ("reduce_scatter", 1 << 22, 1.0)),
            family_corrections=tuple(("reduce_scatter", a, b, 1e-3 if a == cheap else 1e3)
                                     for a in names for b in sizes))
        why = ctx.explain(total, np.float64, collective="reduce_scatter")
        assert why.chosen == cheap and "x 0.00" in str(why), str(why)
        x = np.arange(total, dtype=np.float64) * (comm.rank + 1)
        out = np.empty(block)
        ctx.Reduce_scatter_block(x, out)
        lo = block * comm.rank
        want = np.arange(lo, lo + block, dtype=np.float64) * comm.size * (comm.size + 1) / 2
        assert np.array_equal(out, want)
        ran = max((s for s in ctx.recorder.slots if s.seq > 0), key=lambda s: s.seq).sig
        assert (ran.collective, ran.asked, ran.chosen) == ("reduce_scatter", "auto", cheap)
        ctx.Free()


@pytest.mark.mpi
def test_shared_memory_is_measured_on_each_node(comm):
    """On several nodes that each hold two ranks or more (pretended: two consecutive ranks a
    node) the calibration measures shared memory on every node at once, as hierarchical's
    node tier runs it; where a node holds one rank there is nothing to measure."""
    from bmlmpi.calibrate import several_nodes, shm_step_time
    from bmlmpi.topology.nodes import consecutive_nodes
    nodes = consecutive_nodes(comm.size, 2)
    tier = several_nodes(comm, 60, nodes)
    if nodes.count < 2 or min(nodes.sizes) < 2:
        assert tier is None
        return
    try:
        assert tier is not None
        assert tier.members == list(nodes.members[nodes.node_of(comm.rank)])
        assert 0 < shm_step_time(tier, 3, 60) < 60
    finally:
        tier.free()


@pytest.mark.mpi
def test_a_named_algorithm_never_calibrates_and_auto_once_after_its_first_call(
        tmp_path_factory, monkeypatch):
    """The measurements counted: a drop-in call naming its algorithm and a communicator
    built with one take none; an auto communicator takes none at construction, and none
    after its first auto call either while the cache holds none (its calls then time every
    applicable record); where BMLMPI_RECALIBRATE=1 asks, one after its first auto call that
    prices schedules (on every rank at that call: one rank has no schedule to price); the
    calls after it run what the prices choose, exactly."""
    import numpy as np

    import bmlmpi
    from bmlmpi import calibrate as calibration
    from bmlmpi.model import Calibration

    comm = MPI.COMM_WORLD
    where = comm.bcast(str(tmp_path_factory.mktemp("counted")) if comm.rank == 0 else None)
    monkeypatch.setenv("BMLMPI_CACHE_DIR", where)
    monkeypatch.delenv("BMLMPI_RECALIBRATE", raising=False)
    monkeypatch.setenv("BMLMPI_TUNING", f"{where}/tuning.jsonl")
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    taken = []

    def measure(comm, timeout=None, nodes=None, budget=None):
        taken.append(budget)
        return Calibration(alpha=1e-6, beta=1e-10, native=((8, 2e-6), (1 << 20, 1e-4)))
    monkeypatch.setattr(calibration, "measure", measure)
    n = 1 << 10
    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    want = np.arange(n, dtype=np.float64) * (comm.size * (comm.size + 1) // 2)
    user = comm.Dup()
    try:
        out = np.empty(n)
        bmlmpi.Allreduce(x, out, comm=user, algorithm="bml")
        assert np.array_equal(out, want) and taken == []
        named = bmlmpi.Communicator(comm, algorithm="ring", timeout=30)
        named.Allreduce(x, out)
        assert np.array_equal(out, want) and taken == [] and named.calibration is None
        named.Free()
        empty = bmlmpi.Communicator(comm, timeout=30)
        for _ in range(3):
            out[:] = 0
            empty.Allreduce(x, out)
            assert np.array_equal(out, want)
        assert taken == [] and empty.calibration is None   # an empty cache: nothing measured
        # the job's first auto call (after which the prices are read) ran the MPI library's
        # own call: no plan compiled, no kernels loaded
        assert empty.recorder.calls()[0]["chosen"] == "native"
        if comm.size > 1:
            why = empty.explain(n, np.float64)
            assert why.applicable and ({t.name for t in why.tuning.candidates}
                                       == {*why.applicable, "native"})
        empty.Free()
        monkeypatch.setenv("BMLMPI_RECALIBRATE", "1")
        auto = bmlmpi.Communicator(comm, timeout=30)
        assert taken == [] and auto.calibration is None
        for _ in range(3):
            out[:] = 0
            auto.Allreduce(x, out)
            assert np.array_equal(out, want)
        assert taken == ([30] if comm.size > 1 else [])
        assert (auto.calibration is not None) == (comm.size > 1)
        auto.Free()
    finally:
        user.Free()
