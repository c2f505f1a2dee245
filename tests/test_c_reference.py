"""perf/baseline's C MPI_Allreduce loop builds with the MPI wheel's mpicc and runs at 2 ranks.

Skipped, with the reason, where no mpicc (or no C compiler behind it) is found. The loop
checks its own result (exit 1 on a wrong sum); timings are not asserted.
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # perf/ is not an installed package
    sys.path.insert(0, str(REPO))

from perf.baseline import cref  # noqa: E402


def test_c_loop_builds_and_runs_at_two_ranks(tmp_path):
    try:
        binary = cref.build(tmp_path)
    except cref.NoCompiler as exc:
        pytest.skip(f"C reference not built: {exc}")
    out, rows = cref.run(binary, 2, 8, 65536, iters=20, skip=2, iters_large=6, skip_large=1,
                         blocks=3, timeout=300)
    assert "# OSU MPI Allreduce Latency Test" in out and "# Ranks: 2" in out
    assert [r["size"] for r in rows] == [8 << i for i in range(14)]
    assert all(r["iterations"] == (20 if r["size"] <= 8192 else 6) for r in rows)
    assert all(r["avg_us"] > 0 and r["median_block_us"] > 0 for r in rows)


def test_c_loop_rejects_bad_arguments(tmp_path):
    try:
        binary = cref.build(tmp_path)
    except cref.NoCompiler as exc:
        pytest.skip(f"C reference not built: {exc}")
    with pytest.raises(RuntimeError, match="exit 2"):
        cref.run(binary, 2, 64, 8, timeout=120)
