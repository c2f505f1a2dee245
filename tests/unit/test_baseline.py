"""The sweep's baseline is the MPI library's blocking allreduce, as user code calls it.

No ranks: the sweep's choice of call per row is checked with recording stand-ins for the
communicator and bmlmpi's Communicator; calibration's native timing on COMM_SELF through a
recording wrapper; the same-run summary on synthetic rows.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from bmlmpi import calibrate
from bmlmpi.cli import bench
from bmlmpi.execute import DeadlineExceeded

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # perf/ is not an installed package
    sys.path.insert(0, str(REPO))


class Recorder:
    """Records every method called on it; delegates to ``inner`` when there is one."""

    def __init__(self, inner=None, algorithm="auto"):
        self.inner, self.calls, self.algorithm = inner, [], algorithm

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if self.inner is not None:
                return getattr(self.inner, name)(*args, **kwargs)
            return Recorder()  # a request whose Wait() is recorded on a fresh recorder
        return call


def test_sweep_rows_name_the_baseline_and_the_passthrough():
    names = bench.sweep_names()
    assert names[-2:] == ["passthrough", "native"]
    assert {"auto", "bml", "ring", "tree", "multitree"} <= set(names)
    assert bench.parse_args(["--algorithms", "all"]).algorithm_list == names
    assert bench.bmlmpi_algorithm("native") is None
    assert bench.bmlmpi_algorithm("passthrough") == "native"
    assert bench.bmlmpi_algorithm("ring") == "ring"
    with pytest.raises(SystemExit):
        bench.parse_args(["--algorithms", "bml,fastest"])


def test_native_row_is_the_blocking_mpi4py_call_on_the_users_comm():
    comm, ctx = Recorder(), Recorder()
    send, recv = np.ones(4, np.float32), np.empty(4, np.float32)
    bench.timed_call("native", ctx, comm, send, recv)()
    assert [c[0] for c in comm.calls] == ["Allreduce"]
    name, args, _ = comm.calls[0]
    assert args[0] is send and args[1] is recv and args[2] == MPI.SUM
    assert ctx.calls == []  # nothing of bmlmpi on the path


def test_bmlmpi_rows_go_through_bmlmpi():
    send, recv = np.ones(4, np.float32), np.empty(4, np.float32)
    for row, expect in (("passthrough", ("Iallreduce", "native")), ("bml", ("Allreduce", "bml")),
                        ("auto", ("Allreduce", None))):
        comm, ctx = Recorder(), Recorder()
        bench.timed_call(row, ctx, comm, send, recv)()
        assert comm.calls == [], row
        name, args, kwargs = ctx.calls[0]
        assert name == expect[0] and args[:2] == (send, recv), row
        assert kwargs.get("algorithm") == expect[1], row


def test_machine_info_records_the_load_average():
    info = bench.machine_info(MPI.COMM_SELF)
    assert len(info["loadavg_start"].split()) == 3


def test_calibration_times_the_blocking_allreduce_after_a_deadline_barrier():
    comm = Recorder(MPI.COMM_SELF)
    seconds = calibrate._native_time(comm, 64, 3, timeout=10)
    assert seconds >= 0
    names = [c[0] for c in comm.calls]
    assert "Iallreduce" not in names
    assert names == ["Ibarrier", "Allreduce"] * 4  # one untimed, three timed


def test_calibration_times_candidates_as_the_sweep_does(monkeypatch):
    """Every candidate reduces the same send into the same recv (a schedule with its separate
    input), in blocks of consecutive calls, each followed by a barrier with a deadline."""
    comm = Recorder(MPI.COMM_SELF)
    runs = []
    real_start = calibrate.start_allreduce

    def spy(plan, buf, op, tag, label, finish=None, src=None):
        runs.append((buf, src))
        return real_start(plan, buf, op, tag, label, finish, src)

    monkeypatch.setattr(calibrate, "start_allreduce", spy)
    rounds = 2
    times = calibrate._interleaved_times(comm, 4096, ["bml", "ring"], rounds, timeout=10)
    assert len(times) == 3 and all(t >= 0 for t in times)
    calls = [c for c in comm.calls if c[0] in ("Allreduce", "Ibarrier")]
    natives = [c for c in calls if c[0] == "Allreduce"]
    assert len(natives) == 1 + rounds * calibrate.BLOCK_CALLS
    send, recv = natives[0][1][0], natives[0][1][1]
    assert all(c[1][0] is send and c[1][1] is recv for c in natives)
    assert len(runs) == 2 * (1 + rounds * calibrate.BLOCK_CALLS)
    assert all(buf is recv and src is send for buf, src in runs)
    # a barrier before the first call and after every call (native or schedule)
    assert [c[0] for c in calls].count("Ibarrier") == 1 + 3 * (1 + rounds *
                                                                calibrate.BLOCK_CALLS)
    for i, c in enumerate(calls):
        if c[0] == "Allreduce":
            assert calls[i + 1][0] == "Ibarrier"


def test_calibration_native_never_blocks_without_every_rank(monkeypatch):
    comm = Recorder(MPI.COMM_SELF)
    stuck = MPI.COMM_SELF.Irecv(np.empty(1), source=0, tag=99)  # never completes
    monkeypatch.setattr(comm, "Ibarrier", lambda: stuck, raising=False)
    with pytest.raises(DeadlineExceeded):
        calibrate._native_time(comm, 64, 3, timeout=0.2)
    assert comm.calls == []  # the blocking call was never made
    stuck.Cancel()
    stuck.Wait()


def test_same_run_summary_states_rows_and_targets():
    from perf.baseline.__main__ import markdown, table

    rows = []
    for size in (8, 65536):
        for a, t in (("native", 1.0), ("passthrough", 9.0), ("auto", 1.5), ("bml", 3.0),
                     ("ring", 2.5), ("tree", 4.0), ("multitree", 5.0)):
            rows.append({"algorithm": a, "size": size, "median_block_us": t * size ** 0.5,
                         "avg_us": t, "call": a, **({"chose": "native"} if a == "auto"
                                                    else {})})
    c = [{"size": s, "median_block_us": 0.2 * s ** 0.5, "avg_us": 1.0} for s in (8, 65536)]
    slow = [{**r, "median_block_us": 2 * r["median_block_us"]} for r in c]
    machine = {"cores": 2, "oversubscribed": False}
    data = {"runs": {"2": {"rows": rows, "machine": machine, "c_before": slow, "c_after": c,
                           "loadavg_start": "1 1 1", "loadavg_end": "2 2 2"}},
            "started": "s", "finished": "f", "loadavg_start": "1 1 1", "loadavg_end": "2 2 2",
            "c_loop": "built"}
    flat, grid = table(data)
    assert grid[2][8]["C"] == pytest.approx(0.2 * 8 ** 0.5)
    assert {r["row"] for r in flat} >= {"native", "passthrough", "C loop (before)",
                                        "C loop (after)"}
    text = markdown(data)
    assert "| 8 B |" in text and "(not oversubscribed)" in text
    assert "worst auto / best (native included) 1.50" in text
    assert "0.40× native's speed" in text  # 1.0 / min(bml 3.0, ring 2.5)


class _DeviceArray(np.ndarray):
    """A host array standing in for a cupy array: ``set`` copies a host array into it."""

    def set(self, host):
        self[...] = host


def test_native_row_on_device_buffers_stages_like_user_code(monkeypatch):
    # what user code does with an MPI that is not CUDA-aware: to host, comm.Allreduce, back
    monkeypatch.setattr(bench, "device_buffers", lambda device: (np.array, np.array))
    comm, ctx = Recorder(MPI.COMM_SELF), Recorder()
    send = np.arange(4, dtype=np.float32).view(_DeviceArray)
    recv = np.zeros(4, dtype=np.float32).view(_DeviceArray)
    bench.timed_call("native", ctx, comm, send, recv, device="cuda")()
    assert [c[0] for c in comm.calls] == ["Allreduce"]
    host_send = comm.calls[0][1][0]
    assert type(host_send) is np.ndarray and host_send is not send
    assert np.array_equal(recv, send) and ctx.calls == []


def test_perf_sweep_writes_a_new_folder_outside_the_committed_results(tmp_path, monkeypatch):
    """perf/README's sweep command, run as written, must not overwrite perf/results/."""
    from perf import sweep

    monkeypatch.chdir(tmp_path)
    first = sweep.parse_args(["--ranks", "2"]).out
    assert first.parts[0] == "bmlmpi-results" and first.name.startswith("perf-sweep-"), first
    assert (REPO / "perf" / "results") not in (REPO / first).parents
    ignored = subprocess.run(["git", "check-ignore", "-q", str(first)], cwd=REPO, timeout=30)
    assert ignored.returncode == 0, f"{first} is not ignored by git"
    assert sweep.parse_args(["--out", "perf/results"]).out == Path("perf/results")
    with pytest.raises(SystemExit):
        sweep.parse_args(["--summarise-only"])


def test_each_swept_size_is_one_row():
    """A reduce-scatter's buffer holds a whole number of floats per rank, so small sizes
    round to one buffer: that buffer is timed once, under the size it has."""
    assert bench.size_list("reduce_scatter", 4, 64, 4) == [16, 32, 64]
    assert bench.size_list("reduce_scatter", 4, 64, 3) == [12, 24, 60]
    assert bench.size_list("allgather", 1, 16, 4) == [4, 8, 16]
    assert bench.size_list("allreduce", 4, 16, 9) == [4, 8, 16]
    for collective in ("reduce_scatter", "allgather"):
        args = bench.parse_args(["--collective", collective, "-m", "1:16", "-i", "2", "-x", "1",
                                 "-c", "--algorithms", "ring,native", "--no-progress"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert bench.run(args) == 0  # one rank: this process's MPI
        text = out.getvalue()
        sizes = [line.split()[0] for line in text.splitlines() if line[:1].isdigit()]
        assert sizes == ["4", "8", "16"] * 3, text  # ring's table, native's, the ratios
        assert ("# Size: the whole send buffer" in text) == (collective == "reduce_scatter")
