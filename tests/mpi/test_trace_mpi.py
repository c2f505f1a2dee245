"""The flight recorder on every call path, ``explain`` against what the call then runs, and
``bmlmpi-trace`` on a healthy job (every rank, under ``--with-mpi``)."""

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, recorder, timeline
from bmlmpi.cli import trace

_made: list[Path] = []


def shared_dir(comm: MPI.Comm) -> Path:
    """One fresh folder every rank writes into (made by rank 0, removed after the test)."""
    path = tempfile.mkdtemp(prefix="bmlmpi-trace-test-") if comm.rank == 0 else None
    folder = Path(comm.bcast(path, root=0))
    _made.append(folder)
    return folder


@pytest.fixture(autouse=True)
def _remove_shared_dirs():
    yield
    MPI.COMM_WORLD.Barrier()
    while _made:
        folder = _made.pop()
        if MPI.COMM_WORLD.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


class Ran(execute.RunObserver):
    """The algorithms of the schedules run while installed."""

    def __init__(self):
        self.algorithms = set()

    def post(self, run, lane):
        self.algorithms.add(run.plan.sched.algorithm)


@pytest.mark.mpi
def test_explain_agrees_with_what_the_call_runs():
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world)
    for n in (1, 1000, 200_000):
        why = c.explain(n, np.float32)
        assert why.chosen in bmlmpi.algorithms() and why.chosen != "auto"
        assert why.rule and why.why
        if why.rule == "cost model":
            names = [k.name for k in why.candidates]
            assert why.chosen in names and "native" in names
            assert [k.predicted for k in why.candidates] == sorted(k.predicted
                                                                   for k in why.candidates)
        a = ((np.arange(n) * 7 + world.rank * 3) % 11).astype(np.float32)
        b = np.empty_like(a)
        with execute.observing(Ran()) as seen:
            c.Allreduce(a, b)
        if why.chosen in ("native", "shm"):
            # neither posts messages through a Run (native: MPI's call; shm: shared-memory
            # steps): no schedule of messages may have run
            assert not seen.algorithms, (n, why, seen.algorithms)
        else:
            assert seen.algorithms == {why.chosen}, (n, why, seen.algorithms)
        ref = np.empty_like(a)
        world.Allreduce(a, ref)
        assert np.array_equal(b, ref)
        assert c.recorder.calls()[-1]["chosen"] == why.chosen
    named = bmlmpi.Communicator(world, algorithm="ring")
    assert named.explain(10, np.float64).chosen == "ring"
    assert named.explain(10, np.float64).rule == "asked"
    for comm in (c, named):
        comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "reduce", "bcast"])
def test_explain_agrees_with_what_the_family_calls_run(collective):
    world = MPI.COMM_WORLD
    n = world.size
    c = bmlmpi.Communicator(world)
    for block in (1, 3000, 100_000):
        total = block * n   # explain's count: the elements of all ranks' blocks together
        why = c.explain(total, np.float32, collective=collective)
        assert why.chosen in bmlmpi.algorithms(collective) and why.chosen != "auto", why
        assert why.rule and why.why
        a = ((np.arange(total) * 7 + world.rank * 3) % 11).astype(np.float32)
        with execute.observing(Ran()) as seen:
            if collective == "reduce_scatter":
                out, ref = np.empty(block, np.float32), np.empty(block, np.float32)
                c.Reduce_scatter_block(a, out)
                world.Reduce_scatter_block(a, ref)
            elif collective == "allgather":
                mine = a[:block].copy()
                out, ref = np.empty(total, np.float32), np.empty(total, np.float32)
                c.Allgather(mine, out)
                world.Allgather(mine, ref)
            elif collective == "reduce":
                out, ref = np.zeros(total, np.float32), np.zeros(total, np.float32)
                c.Reduce(a, out, root=0)
                world.Reduce(a, ref, root=0)
            else:
                out, ref = a.copy(), a.copy()
                c.Bcast(out, root=0)
                world.Bcast(ref, root=0)
        assert np.array_equal(out, ref), (collective, block, why.chosen)
        if why.chosen in ("native", "shm"):
            assert not seen.algorithms, (collective, block, why, seen.algorithms)
        else:
            assert seen.algorithms == {why.chosen}, (collective, block, why, seen.algorithms)
        last = c.recorder.calls()[-1]
        assert last["collective"] == collective and last["chosen"] == why.chosen
    named = bmlmpi.Communicator(world, algorithm="bml")
    assert named.explain(8 * n, np.float64, collective=collective).chosen == "bml"
    for comm in (c, named):
        comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "reduce",
                                        "bcast"])
def test_bench_table_shows_what_auto_ran(collective):
    from argparse import Namespace

    from bmlmpi.cli import bench
    c = bmlmpi.Communicator(MPI.COMM_WORLD)
    for nbytes in (64, 1 << 18):
        rows = bench.measure(c, ["auto"], nbytes, 2, 1, True, collective=collective)
        # the table's choice is what the auto row's calls ran (the recorder's last call)
        last = c.recorder.calls()[-1]
        assert last["collective"] == collective and last["asked"] == "auto"
        assert rows[0]["chose"] == last["chosen"] and rows[0]["validation"] == "Pass"
        args = Namespace(full=False, busbw=False, validation=True, collective=collective)
        table = bench.format_table(rows, args, {"ranks": c.size, "oversubscribed": False,
                                                "mpi_library": "test"})
        head, row = table.splitlines()[-2:]
        assert head.endswith("Auto chose") and row.split()[-1] == last["chosen"], table
    c.Free()


@pytest.mark.mpi
def test_auto_logs_each_new_signatures_choice_once(caplog):
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world)
    a = np.arange(3000, dtype=np.float32) + world.rank
    b = np.empty_like(a)
    block = np.empty(8, np.float32)
    c.Allreduce(a[:1000], b[:1000])  # the first auto call that prices takes the calibration
    with caplog.at_level("DEBUG", logger="bmlmpi"):
        for _ in range(3):
            c.Allreduce(a, b)
            c.Reduce_scatter_block(a[:8 * world.size], block)
    told = [r.getMessage() for r in caplog.records if "for a new signature" in r.getMessage()]
    assert len(told) == 2, told  # one per signature, not per call
    # the priced choice, before the calls time the candidates (explain adds their times)
    assert str(c.plans.explain("allreduce", 3000, 4)) in told[0]
    assert str(c.plans.explain("reduce_scatter", 8 * world.size, 4, 0,
                               (8,) * world.size)) in told[1]
    c.Free()


@pytest.mark.mpi
def test_recorder_sees_every_call_path():
    world = MPI.COMM_WORLD
    scheduled = "ring" if world.size > 1 else "bml"
    c = bmlmpi.Communicator(world, algorithm=scheduled)
    native = bmlmpi.Communicator(world, algorithm="native")
    a = np.arange(64, dtype=np.float32) + world.rank
    b = np.empty_like(a)
    c.Allreduce(a, b)                      # checked first call
    c.Allreduce(a, b)                      # the scheduled fast path
    c.Iallreduce(a, b, MPI.MAX).Wait()     # non-blocking
    c.Allreduce(a, b, compression="fp16")  # compressed
    for _ in range(3):
        native.Allreduce(a, b)             # checked, then the native fast path
    calls = c.recorder.calls()
    assert [x["seq"] for x in calls] == [1, 2, 3, 4]   # numbered from 1
    assert [x["state"] for x in calls] == ["done"] * 4
    assert [x["op"] for x in calls] == ["sum", "sum", "max", "sum"]
    assert [x["chosen"] for x in calls] == [scheduled] * 3 + ["compressed fp16"]
    assert all(x["count"] == 64 and x["dtype"] == "float32" and x["end"] >= x["start"]
               for x in calls)
    ncalls = native.recorder.calls()
    assert [(x["seq"], x["chosen"], x["state"]) for x in ncalls] == [
        (i, "native", "done") for i in range(1, 4)]
    folder = shared_dir(world)
    path = Path(c.dump_trace(str(folder)))
    native.dump_trace(str(folder))
    doc = json.loads(path.read_text())
    assert doc["rank"] == world.rank and doc["size"] == world.size
    assert doc["reason"] == "dump_trace()" and doc["recorded"] == 4
    world.Barrier()
    reports = trace.analyse(trace.load(folder))
    assert len(reports) == 2  # the two communicators, told apart by creation order
    for report in reports:
        assert report["ranks"] == list(range(world.size)) and not report["missing"]
        assert report["ok"] and report["verdict"] is None
    assert sorted(r["last_common_done"]["seq"] for r in reports) == [3, 4]
    for comm in (c, native):
        comm.Free()


@pytest.mark.mpi
def test_recorder_sees_the_family_and_persistent_starts():
    world = MPI.COMM_WORLD
    n = world.size
    c = bmlmpi.Communicator(world)
    a = np.arange(4 * n, dtype=np.float64) + world.rank
    block = np.empty(4)
    gathered = np.empty(4 * n * n)
    root_out = np.empty_like(a)
    c.Reduce_scatter_block(a, block)
    c.Allgather(a, gathered)
    c.Reduce(a, root_out, root=0)
    c.Bcast(a, root=0)
    req = c.Allreduce_init(a, root_out)
    for _ in range(2):
        req.Start()
        req.Wait()
    req.Free()
    calls = c.recorder.calls()
    assert [x["collective"] for x in calls] == ["reduce_scatter", "allgather", "reduce",
                                                "bcast", "allreduce", "allreduce"]
    assert [x["seq"] for x in calls] == list(range(1, 7))
    assert all(x["state"] == "done" and x["chosen"] not in (None, "auto") for x in calls)
    assert calls[2]["root"] == 0 and calls[3]["root"] == 0 and calls[1]["op"] is None
    assert calls[0]["count"] == 4 * n and calls[0]["op"] == "sum"
    c.Free()


@pytest.mark.mpi
def test_timeline_of_a_bml_allreduce_merged_across_ranks():
    """What BMLMPI_TIMELINE turns on (the process's Timeline fed by the recorder and observing
    every Run), here for one communicator; then the merge bmlmpi-trace --timeline runs."""
    world = MPI.COMM_WORLD
    folder = shared_dir(world)
    tl = timeline.Timeline(folder)
    c = bmlmpi.Communicator(world, algorithm="bml")
    c.recorder.timeline = tl
    a = ((np.arange(1 << 14) * 7 + world.rank * 3) % 11).astype(np.float32)
    b = np.empty_like(a)
    with execute.observing(tl):
        for _ in range(2):
            c.Allreduce(a, b)
    assert tl.write().parent == folder
    world.Barrier()
    if world.rank == 0:
        assert trace.main(["--timeline", str(folder)]) == 0
        events = json.loads((folder / "timeline.json").read_text())["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        calls = [e for e in spans if e["name"] == f"allreduce bml {a.nbytes} B"]
        assert sorted(e["pid"] for e in calls) == sorted(list(range(world.size)) * 2), calls
        assert all(e["args"]["state"] == "done" for e in calls)
        steps = [e for e in spans if e["name"] in ("post", "wait", "reduce", "copy")]
        if world.size > 1:
            assert {"post", "wait", "reduce"} <= {e["name"] for e in steps}
            assert {e["pid"] for e in steps} == set(range(world.size))
        for e in steps:  # inside its rank's call (µs; the clock's rounding aside)
            assert any(k["pid"] == e["pid"] and k["ts"] - 1 <= e["ts"]
                       and e["ts"] + e["dur"] <= k["ts"] + k["dur"] + 1 for k in calls), e
    c.Free()


@pytest.mark.mpi
def test_sigusr1_dumps_the_recorder(monkeypatch):
    world = MPI.COMM_WORLD
    folder = shared_dir(world)
    monkeypatch.setenv("BMLMPI_TRACE_DIR", str(folder))
    c = bmlmpi.Communicator(world)
    a = np.ones(8)
    c.Allreduce(a, np.empty_like(a))
    # installed by the first recorder of the process (SIGUSR1 had its default action)
    assert signal.getsignal(signal.SIGUSR1) is recorder._on_sigusr1
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.01)  # the handler runs at the main thread's next instruction
    mine = [json.loads(p.read_text()) for p in folder.glob("bmlmpi-trace-*.json")]
    mine = [d for d in mine if d["pid"] == os.getpid() and d["comm"] == c.recorder.index]
    assert mine and mine[0]["reason"] == "SIGUSR1"
    assert mine[0]["calls"][-1]["state"] == "done"
    c.Free()


@pytest.mark.mpi
def test_recorder_off(monkeypatch):
    monkeypatch.setenv("BMLMPI_TRACE_CALLS", "0")
    c = bmlmpi.Communicator(MPI.COMM_WORLD)
    a = np.ones(8)
    b = np.empty_like(a)
    for _ in range(3):
        c.Allreduce(a, b)
    assert c.recorder is None and c.dump_trace() is None
    assert np.all(b == MPI.COMM_WORLD.size)
    c.Free()
