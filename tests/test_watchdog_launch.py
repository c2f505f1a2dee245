"""A rank that never arrives at a blocking native allreduce on the fast path (after the
signature's checked first call) must not hang the job: with ``BMLMPI_BLOCKING=watchdog`` (the
default) the waiting rank's watchdog names the call and aborts the job; with ``polled`` the
waiting rank gets DeadlineExceeded. Each case is one launch with a hard timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bmlmpi.cli import trace

ROOT = Path(__file__).resolve().parents[1]
# the deadline: long enough that a loaded machine (two cores shared by many ranks) does not
# trip it on the calls every rank makes; the launch's own bound is far above it
DEADLINE = 10
LAUNCH_TIMEOUT = 300

PROGRAM = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from mpi4py import MPI
    import bmlmpi
    comm = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(comm, algorithm="native")
    a = np.arange(4, dtype=np.float64) + 10 * comm.rank
    b = np.empty(4)
    for _ in range(3):  # the first call is checked and polled, the others take the fast path
        ctx.Allreduce(a, b, MPI.SUM)
        assert np.array_equal(b, np.arange(4) * comm.size + 10 * sum(range(comm.size)))
    print(f"rank {comm.rank} fast calls {ctx._watchdog.calls}", flush=True)
    if comm.rank == 1:
        time.sleep(float(sys.argv[1]))  # never joins the next call (bounded: nothing outlives)
        os._exit(0)
    try:
        ctx.Allreduce(a, b, MPI.SUM)
    except bmlmpi.DeadlineExceeded as exc:
        print(f"DEADLINE {exc}", flush=True)
        os._exit(0)
    print("NOT REACHED", flush=True)
""")


def launch(blocking: str, sleep: float,
           trace_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", "2", sys.executable, "-c", PROGRAM,
           str(sleep)]
    env = {**os.environ, "BMLMPI_TIMEOUT": str(DEADLINE), "BMLMPI_BLOCKING": blocking,
           "BMLMPI_CALIBRATE": "0", "PYTHONUNBUFFERED": "1", "BMLMPI_TRACE_DIR": str(trace_dir)}
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             timeout=LAUNCH_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"the job hung: not ended within {LAUNCH_TIMEOUT} s\n{out[-3000:]}")
    return res, time.monotonic() - start


def rank0_trace(folder: Path) -> tuple[dict, dict]:
    """Rank 0's flight-recorder dump, and bmlmpi-trace's analysis of the folder: rank 1 never
    came to the call, so it wrote none and is the one named."""
    dumps = [json.loads(p.read_text()) for p in folder.glob("bmlmpi-trace-*.json")]
    assert [d["rank"] for d in dumps] == [0], dumps
    report = trace.analyse(trace.load(folder))[0]
    assert report["missing"] == [1] and report["culprit"] == 1, report
    assert "rank 1 wrote no dump" in report["verdict"]
    return dumps[0], report


def test_watchdog_aborts_a_job_whose_peer_never_arrives(tmp_path):
    # rank 1 sleeps far longer than the launch timeout: only the watchdog can end the job
    res, _ = launch("watchdog", 3 * LAUNCH_TIMEOUT, tmp_path)
    out = res.stdout + res.stderr
    assert "rank 0 fast calls 2" in res.stdout, out[-3000:]
    assert res.returncode != 0, out[-3000:]
    assert "bmlmpi watchdog: bmlmpi native allreduce (blocking MPI_Allreduce of 4 x float64 " \
           "sum, rank 0 of 2), call 4" in res.stderr, out[-3000:]
    assert "NOT REACHED" not in res.stdout
    # the watchdog had the flight recorder dumped before it aborted: the hung call is the
    # fourth (call 4, as the watchdog's report says), failed in MPI_Allreduce, waiting on any
    # rank
    dump, _ = rank0_trace(tmp_path)
    assert dump["reason"] == "watchdog abort"
    last = dump["calls"][-1]
    assert (last["seq"], last["state"], last["chosen"], last["peers"]) == (4, "failed",
                                                                            "native", "all")
    assert "bmlmpi watchdog" in last["error"]


def test_polled_mode_raises_deadline_exceeded_instead(tmp_path):
    res, _ = launch("polled", 4 * DEADLINE, tmp_path)
    out = res.stdout + res.stderr
    assert "rank 0 fast calls 0" in res.stdout, out[-3000:]  # polled: no fast path at all
    assert f"DEADLINE native MPI_Iallreduce (rank 0) made no progress in {DEADLINE} s" \
        in res.stdout, out[-3000:]
    assert "bmlmpi watchdog" not in res.stderr
    assert "NOT REACHED" not in res.stdout
    assert f"bmlmpi flight recorder: rank 0 of 2 wrote {tmp_path}" in res.stderr
    dump, _ = rank0_trace(tmp_path)
    assert dump["reason"] == "call 4 raised DeadlineExceeded"
