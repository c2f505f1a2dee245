"""Runs the multi-rank GPU allreduce tests (tests/mpi/test_device_allreduce_mpi.py) under
mpiexec, where cupy sees a CUDA device; skipped otherwise. Ranks share the device."""

import sys
from pathlib import Path

import pytest

import bmlmpi

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_mpi_launch import run_ranks, sweep_tables  # noqa: E402

from bmlmpi.kernels import gpu  # noqa: E402

pytest.importorskip("cupy")
if not gpu.gpu_available():
    pytest.skip("no CUDA device visible to cupy", allow_module_level=True)


@pytest.mark.parametrize("n", [2, 4])
def test_device_allreduce_under_mpiexec(n):
    res = run_ranks(n, ["-m", "pytest", "--with-mpi", "-q", "-rs", "-p", "no:cacheprovider",
                        "--color=no", "tests/mpi/test_device_allreduce_mpi.py"], timeout=900)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"{n} ranks: exit {res.returncode}\n{tail}"
    assert " passed" in res.stdout, tail
    assert "no CUDA device" not in res.stdout, tail


def test_sweep_with_device_buffers():
    """``bmlmpi-bench -d cuda``: every algorithm on cupy buffers, validated, OSU tables."""
    res = run_ranks(2, ["-m", "bmlmpi.cli.bench", "-d", "cuda", "-m", "4:1048576", "-c", "-f",
                        "--algorithms", "all", "-i", "20", "-x", "2", "--no-progress"],
                    timeout=600)
    tables = sweep_tables(res)
    # every name in bmlmpi.algorithms() (auto and native among them) and the passthrough
    assert len(tables) == len(bmlmpi.algorithms()) + 1, res.stdout
    for table, rows in tables:
        assert "# Buffers on device: cuda" in table, table
        auto = "Auto chose" in table  # auto's table shows what it ran, after Validation
        assert len(rows) == 19 and all(r[-2 if auto else -1] == "Pass" for r in rows), table
