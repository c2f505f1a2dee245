"""The toy collective (tests/toy_collective.py) on 2 and 3 ranks launched with failure
mitigation (``bmlmpi-run --ft``), so that tests/mpi/test_toy_collective_mpi.py runs it on the
fault-tolerant communicator as well as the plain one: every test passes, none is skipped."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300


@pytest.mark.parametrize("n", [2, 3])
def test_the_toy_collective_on_both_communicators(n):
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", str(n), sys.executable,
           "-m", "pytest", "--with-mpi", "-q", "-rs", "-p", "no:cacheprovider", "--color=no",
           "tests/mpi/test_toy_collective_mpi.py"]
    env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                             env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{n} ranks did not finish within {TIMEOUT} s:\n{exc.stdout!r}"[-4000:])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"{n} ranks: exit {res.returncode}\n{tail}"
    assert res.stdout.count("4 passed") == n and "skipped" not in res.stdout, tail
