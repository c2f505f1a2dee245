"""The flight recorder's ring, its dump, ``bmlmpi-trace``'s analysis and the timeline merge,
without MPI (synthetic dumps stand for the ranks)."""

import json

import pytest

from bmlmpi import recorder
from bmlmpi.cli import trace
from bmlmpi.recorder import FlightRecorder, Signature


class FakePlan:
    nsteps = 6


class FakeRun:
    """A run stuck at step 3, waiting to receive from rank 2."""

    plan = FakePlan()

    def waiting(self):
        return 3, [("recv", 2)]


def sig(count=10, op="sum", algorithm="ring"):
    return Signature("allreduce", count, "float64", op, None, "auto", algorithm)


def test_the_ring_keeps_the_last_calls_in_order():
    rec = FlightRecorder(4, rank=0, size=2)
    for i in range(10):
        rec.done(rec.begin(sig(count=i)))
    calls = rec.calls()
    # calls are numbered from 1, as the call sequence numbers them in exception messages
    assert [c["seq"] for c in calls] == [7, 8, 9, 10]
    assert [c["count"] for c in calls] == [6, 7, 8, 9]
    assert all(c["state"] == "done" and c["end"] >= c["start"] for c in calls)
    assert rec.next == 11 and len(rec.slots) == 4


def test_states_running_failed_and_the_peers():
    rec = FlightRecorder(8, rank=1, size=4)
    rec.done(rec.begin(sig()))
    running = rec.begin(sig(), run=FakeRun())
    assert rec.calls()[-1]["state"] == "step 3 of 6"
    assert rec.calls()[-1]["peers"] == [{"kind": "recv", "rank": 2}]
    assert rec.fail(running, TimeoutError("stuck"))
    assert not rec.fail(running, TimeoutError("again"))  # already ended
    last = rec.calls()[-1]
    assert last["state"] == "failed" and last["step"] == 3 and last["steps"] == 6
    assert last["error"] == "TimeoutError: stuck" and last["peers"][0]["rank"] == 2
    native = rec.begin(sig(algorithm="native"))
    assert rec.calls()[-1]["state"] == "posted" and rec.calls()[-1]["peers"] == "all"
    rec.done(native)
    assert native.run is None


def test_dump_is_json_named_per_host_pid_rank_and_communicator(tmp_path):
    rec = FlightRecorder(2, rank=3, size=4)
    rec.done(rec.begin(sig()))
    path = rec.dump("test", tmp_path, announce=False)
    assert path.name.startswith("bmlmpi-trace-") and f"-c{rec.index}.json" in path.name
    doc = json.loads(path.read_text())
    assert doc["format"] == recorder.FORMAT and doc["rank"] == 3 and doc["size"] == 4
    assert doc["reason"] == "test" and doc["calls"][0]["collective"] == "allreduce"


def test_a_failed_call_dumps_and_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("BMLMPI_TRACE_DIR", str(tmp_path))
    rec = FlightRecorder(2, rank=0, size=2)
    exc = TimeoutError("no progress")
    path = rec.failed_call(rec.begin(sig(), run=FakeRun()), exc)
    assert path is not None and path.parent == tmp_path
    assert str(path) in exc.__notes__[0] and f"bmlmpi-trace {tmp_path}" in exc.__notes__[0]


def test_default_folder_is_per_job_under_the_temp_dir(monkeypatch):
    monkeypatch.delenv("BMLMPI_TRACE_DIR", raising=False)
    env = {"SLURM_JOB_ID": "1234"}
    assert recorder.trace_dir(env).name == "bmlmpi-trace-slurm-1234"
    assert recorder.job_id({"PMIX_NAMESPACE": "prterun-vm-12@1"}) == "prterun-vm-12_1"


def test_capacity_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("BMLMPI_TRACE_CALLS", "0")
    assert recorder.recorder_capacity() == 0
    monkeypatch.setenv("BMLMPI_TRACE_CALLS", "-1")
    with pytest.raises(ValueError):
        recorder.recorder_capacity()


# -- bmlmpi-trace on synthetic dumps ----------------------------------------------------------

def dump(rank, size, calls, comm=0, kind="Communicator"):
    return {"format": recorder.FORMAT, "rank": rank, "size": size, "comm": comm,
            "kind": kind, "time": 1.0, "host": "h", "pid": 100 + rank, "reason": "test",
            "recorded": calls[-1]["seq"] if calls else 0,
            "next": (calls[-1]["seq"] + 1) if calls else 1, "file": f"r{rank}",
            "calls": calls}


def call(seq, count=10, op="sum", state="done", peers=None, start=0.0):
    c = {"seq": seq, "collective": "allreduce", "count": count, "dtype": "float64", "op": op,
         "root": None, "asked": "auto", "chosen": "ring", "start": start, "state": state}
    if state != "done":
        c["peers"] = peers if peers is not None else "all"
    return c


def test_skipped_call_is_named():
    ops = ["sum", "max"] * 4
    good = [call(i, op=ops[i]) for i in range(8)]
    skipper = [call(i, op=(ops[:3] + ops[4:])[i]) for i in range(7)]
    report = trace.analyse([dump(0, 3, good), dump(1, 3, skipper), dump(2, 3, good)])[0]
    m = report["mismatches"][0]
    assert m["seq"] == 3 and m["odd"][1]["kind"] == "skipped" and m["odd"][1]["differs"] == ["op"]
    assert report["culprit"] == 1 and "rank 1 skipped a call" in report["verdict"]
    assert "(rank skipped a call)" in trace.story(report)


def test_extra_call_and_changed_count_are_named():
    base = [call(i, count=10 + i) for i in range(5)]
    extra = base[:2] + [call(2, count=99)] + [call(i + 1, count=10 + i) for i in range(2, 5)]
    report = trace.analyse([dump(0, 3, base), dump(1, 3, extra), dump(2, 3, base)])[0]
    m = report["mismatches"][0]
    assert m["seq"] == 2 and m["odd"][1]["kind"] == "extra" and report["culprit"] == 1
    changed = base[:3] + [call(3, count=7)]
    r = trace.analyse([dump(0, 3, base[:4]), dump(1, 3, base[:4]), dump(2, 3, changed)])[0]
    assert r["mismatches"][0]["odd"][2]["differs"] == ["count"] and r["culprit"] == 2


def test_the_chain_of_waits_ends_at_the_rank_that_never_arrived():
    # ranks 0 and 1 wait in seq 4 (0 on 1, 1 on 2); rank 2 finished seq 3 and went elsewhere
    d0 = dump(0, 3, [call(i) for i in range(4)] + [call(4, state="failed",
                                                         peers=[{"kind": "recv", "rank": 1}])])
    d1 = dump(1, 3, [call(i) for i in range(4)] + [call(4, state="failed",
                                                         peers=[{"kind": "recv", "rank": 2}])])
    d2 = dump(2, 3, [call(i) for i in range(4)])
    report = trace.analyse([d0, d1, d2])[0]
    assert report["culprit"] == 2 and report["behind"] == [2]
    assert [c["rank"] for c in report["chain"]] == [0, 1]
    assert "never entered call 4" in report["verdict"]
    assert report["last_common_done"]["seq"] == 3


@pytest.mark.parametrize("ordering", ["round", "late rank done", "peer done"])
def test_the_rank_that_entered_the_stuck_call_last_is_named(ordering):
    # rank 3 was stopped before seq 2 and entered it 6 s after the others. When it learnt of
    # the failure it still waited on rank 2 (the waits go round: 0 -> 3 -> 2 -> 3), or its
    # first step's transfers had all completed, or rank 2's had completed as rank 2 gave up
    # (the chain ends at a rank with nothing outstanding)
    recv_3, recv_2 = [{"kind": "recv", "rank": 3}], [{"kind": "recv", "rank": 2}]
    ring = {0: recv_3, 1: [{"kind": "recv", "rank": 0}],
            2: [] if ordering == "peer done" else [{"kind": "send", "rank": 3}],
            3: [] if ordering == "late rank done" else recv_2}
    dumps = [dump(r, 4, [call(0), call(1), call(2, state="failed", peers=ring[r],
                                                 start=6.0 if r == 3 else 0.0)])
             for r in range(4)]
    report = trace.analyse(dumps)[0]
    assert report["culprit"] == 3
    assert [c["rank"] for c in report["chain"]] == [0, 3] + ([] if ordering ==
                                                            "late rank done" else [2])
    assert "rank 3 entered it last, 6.0 s after the first" in report["verdict"]
    assert ("go round" in report["verdict"]) == (ordering == "round")
    # nobody came late (within a quarter of the recorded deadline): the transfers stalled
    for d in dumps:
        d["timeout"] = 60.0
    report = trace.analyse(dumps)[0]
    assert report["culprit"] is None and "the transfers themselves stalled" in report["verdict"]
    assert "=> the waits in call 2" in trace.story(report)


def test_a_missing_rank_is_named(tmp_path):
    stuck = [call(0), call(1, state="failed")]
    report = trace.analyse([dump(0, 3, stuck), dump(1, 3, stuck)])[0]
    assert report["missing"] == [2] and report["culprit"] == 2
    for r, d in enumerate([dump(0, 3, stuck), dump(1, 3, stuck)]):
        (tmp_path / f"bmlmpi-trace-h-p{r}-w{r}-c0.json").write_text(json.dumps(d))
    assert trace.main([str(tmp_path)]) == 1
    assert trace.main([str(tmp_path / "nothing-here")]) == 2


def test_dumps_of_all_nodes_gathered_in_one_folder(tmp_path, capsys):
    # a Slurm job on two nodes: each node's ranks wrote into that node's per-job folder
    # (bmlmpi-trace-slurm-<job> in its own /tmp), copied afterwards into one folder per node
    # under a common one; rank 2 (node b) never entered seq 2
    job = recorder.trace_dir({"SLURM_JOB_ID": "77"}).name
    for r in range(4):
        host = "node-a" if r < 2 else "node-b"
        calls = [call(0), call(1)] + ([] if r == 2 else [call(2, state="failed", peers=[
            {"kind": "recv", "rank": 2 if r != 3 else 1}])])
        d = dump(r, 4, calls)
        d["host"] = host
        folder = tmp_path / host / job
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"bmlmpi-trace-{host}-p{100 + r}-w{r}-c0.json").write_text(json.dumps(d))
    assert trace.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "4 dumps" in out and "dumps from ranks 0, 1, 2, 3" in out
    assert "rank 2 (node-b pid 102)" in out and "rank 0 (node-a pid 100)" in out
    assert "never entered call 2" in out
    assert trace.main([str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["communicators"][0]
    assert report["culprit"] == 2 and not report["missing"]


def test_timeline_merge(tmp_path):
    for rank in range(2):
        doc = {"traceEvents": [{"name": "allreduce", "ph": "X", "ts": 1e6 + rank, "dur": 5,
                                "pid": rank, "tid": 0, "args": {}}],
               "otherData": {"dropped": 0}}
        (tmp_path / f"timeline-h-p{rank}-w{rank}.json").write_text(json.dumps(doc))
    out = trace.merge_timelines(tmp_path)
    events = json.loads(out.read_text())["traceEvents"]
    assert sorted(e["pid"] for e in events) == [0, 1] and min(e["ts"] for e in events) == 0


# -- which failures dump, and how many files a process writes ---------------------------------

def test_only_hangs_and_failures_between_ranks_earn_a_dump():
    from mpi4py import MPI

    from bmlmpi.calls import (
        ArgumentMismatch,
        CommunicatorRevoked,
        RemoteArgumentError,
        earns_dump,
    )
    from bmlmpi.execute import DeadlineExceeded
    for exc in (DeadlineExceeded("stuck"), CommunicatorRevoked("revoked"), TimeoutError("t"),
                ArgumentMismatch("count differs"), MPI.Exception(MPI.ERR_OTHER)):
        assert earns_dump(exc), exc
    # refused arguments: reported on every rank at once, nothing waits
    for exc in (ValueError("bad op"), TypeError("bad buffer"), NotImplementedError("no"),
                RemoteArgumentError("rank 1 rejected its arguments"), BufferError("read-only"),
                RuntimeError("two threads"), KeyboardInterrupt()):
        assert not earns_dump(exc), exc


def test_a_process_writes_at_most_trace_files_dumps(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("BMLMPI_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("BMLMPI_TRACE_FILES", "2")
    monkeypatch.setattr(recorder, "_files", set())
    monkeypatch.setattr(recorder, "_capped", [False])
    recs = [FlightRecorder(4, rank=0, size=2) for _ in range(4)]
    paths = [rec.failed_call(rec.begin(sig()), TimeoutError("stuck")) for rec in recs]
    assert paths[0] is not None and paths[1] is not None and paths[2:] == [None, None]
    assert sorted(tmp_path.iterdir()) == sorted(paths[:2])
    err = capfd.readouterr().err
    assert err.count("BMLMPI_TRACE_FILES=2") == 1, err
    # a communicator that has its file rewrites it; an explicit dump_trace() is not counted
    assert recs[0].failed_call(recs[0].begin(sig()), TimeoutError("again")) == paths[0]
    assert recs[3].dump("dump_trace()", tmp_path / "mine", announce=False, counted=False)
    assert len(list(tmp_path.glob("*.json"))) == 2


# -- a rank that ended cleanly -----------------------------------------------------------------

def test_a_rank_that_ended_cleanly_and_skipped_a_call_is_named():
    # rank 1 skipped the others' call 4 (MAX) and ended after its call 7; the others wait in
    # call 8 (a native call: MPI matched rank 1's calls with the others' whatever their ops)
    ops = ["sum", "max"] * 4
    waiting = [call(i + 1, op=ops[i]) for i in range(7)] + [call(8, op=ops[7], state="failed")]
    skipper = dump(1, 4, [call(i + 1, op=(ops[:3] + ops[4:])[i]) for i in range(7)])
    skipper["reason"] = recorder.CLEAN_END
    report = trace.analyse([dump(0, 4, waiting), skipper, dump(2, 4, waiting),
                            dump(3, 4, waiting)])[0]
    assert report["culprit"] == 1 and not report["missing"]
    assert report["verdict"] == (
        "rank 1 skipped a call: at call 4 the others called allreduce of 10 x float64 max, "
        "ring (asked auto); rank 1's calls from there on are the others' next ones; it ended "
        "cleanly after its call 7, while the others wait in call 8")
    assert "rank 1 (h pid 101): last completed call 7; its program ended cleanly" in \
        trace.story(report)
    # the first watchdog to fire ended the job before ranks 0 and 3 wrote theirs: one rank
    # against one, the rank that ended cleanly is the odd one
    report = trace.analyse([skipper, dump(2, 4, waiting)])[0]
    assert report["culprit"] == 1 and report["missing"] == [0, 3]
    assert report["verdict"].startswith("rank 1 skipped a call: at call 4 the others called "
                                        "allreduce of 10 x float64 max")


def test_a_rank_that_ended_cleanly_one_call_short_is_named():
    # every call alike: where the skip was cannot be seen, only that rank 2 made one call
    # fewer and ended while the others wait for it
    waiting = [call(i + 1) for i in range(5)] + [call(6, state="failed",
                                                      peers=[{"kind": "recv", "rank": 2}])]
    short = dump(2, 3, [call(i + 1) for i in range(5)])
    short["reason"] = recorder.CLEAN_END
    report = trace.analyse([dump(0, 3, waiting), dump(1, 3, waiting), short])[0]
    assert report["culprit"] == 2 and not report["missing"] and not report["mismatches"]
    assert "rank 2: it ended cleanly after call 5 and never entered call 6" in report["verdict"]


def test_timeline_merge_needs_no_mpi(tmp_path):
    import subprocess
    import sys
    doc = {"traceEvents": [{"name": "allreduce", "ph": "X", "ts": 5.0, "dur": 1, "pid": 0,
                            "tid": 0, "args": {}}], "otherData": {"dropped": 0}}
    (tmp_path / "timeline-h-p1-w0.json").write_text(json.dumps(doc))
    probe = ("import sys; from bmlmpi.cli import trace; "
             f"assert trace.main(['--timeline', {str(tmp_path)!r}]) == 0; "
             "print('MPI loaded:', 'mpi4py.MPI' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "MPI loaded: False" in res.stdout, res.stdout
    assert (tmp_path / "timeline.json").is_file()
