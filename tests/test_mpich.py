"""The MPI suite again under the MPICH wheel: bmlmpi needs only MPI-3, not the embedded Open MPI.

The MPICH venv is the emulated testbed's (``python -m perf.testbed setup``: mpich, mpi4py,
numpy, numba, pytest, pytest-mpi and this repository, editable, without the Open MPI wheel).
Where it is missing it is made here, unless ``BML_TESTBED_SETUP=0``; where it cannot be made
(no package registry) the test skips with the reason. Every launch has a timeout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from perf.testbed import mpi

ROOT = Path(__file__).resolve().parents[1]


def mpich_venv() -> str | None:
    """None when the MPICH venv is ready, else why not."""
    why = mpi.ensure(os.environ.get("BML_TESTBED_SETUP", "1") != "0")
    if why:
        return why
    has_pytest = subprocess.run([str(mpi.venv_python()), "-c", "import pytest_mpi"],
                                capture_output=True, timeout=60).returncode == 0
    if not has_pytest:  # a venv made before pytest joined its packages
        try:
            subprocess.run([str(mpi.venv_python()), "-m", "pip", "install", "-q",
                            "pytest", "pytest-mpi"], check=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"could not install pytest into the MPICH venv: {exc}"
    return None


# One rank count under MPICH (the suite's other rank counts run under Open MPI): a second
# MPI library's behaviour, sized for the test command's time.
@pytest.mark.parametrize("n", [4])
def test_mpi_suite_on_mpich(n):
    why = mpich_venv()
    if why:
        pytest.skip(why)
    cmd = [str(mpi.mpiexec()), "-n", str(n), str(mpi.venv_python()), "-c",
           "from mpi4py import MPI; import sys, pytest; "
           "assert MPI.Get_library_version().startswith('MPICH'), MPI.Get_library_version(); "
           "sys.exit(pytest.main(['--with-mpi', '-q', '-p', 'no:cacheprovider', "
           "'--color=no', 'tests/mpi']))"]
    env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"MPICH mpiexec -n {n} did not finish within 600 s: {exc.stdout!r}"[-4000:])
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"MPICH, {n} ranks: exit {res.returncode}\n{tail}"
    assert res.stdout.count(" passed") == n, tail
