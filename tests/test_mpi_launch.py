"""Runs tests/mpi under mpiexec at every rank count the design asks for.

Each launch is one ``bmlmpi-run -n N python -m pytest --with-mpi tests/mpi`` with a hard
timeout; inside, every bmlmpi wait has its own deadline (BMLMPI_TIMEOUT), so a hang surfaces
as a DeadlineExceeded naming the step and peer, and a stuck launch is killed here.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RANKS = [int(n) for n in os.environ.get("BMLMPI_TEST_RANKS", "1,2,3,4,5,6,8,9,12").split(",")]
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_TEST_LAUNCH_TIMEOUT", "900"))


def run_ranks(n: int, args: list[str], timeout: int = LAUNCH_TIMEOUT,
              env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bmlmpi.launch", "-n", str(n), sys.executable, *args]
    full_env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full_env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:]
        pytest.fail(f"mpiexec -n {n} did not finish within {timeout} s:\n{out!r}")


@pytest.mark.parametrize("n", RANKS)
def test_mpi_suite(n):
    res = run_ranks(n, ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
                        "--color=no", "tests/mpi"])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"{n} ranks: exit {res.returncode}\n{tail}"
    assert " passed" in res.stdout, tail
