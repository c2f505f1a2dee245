"""An allreduce of 2**31 + 7 int8 elements, a count past MPI's int (issue 24 item 9), on two
ranks (rank program: tests/large_count_ranks.py): ``native`` is exact, or refused on every
rank with a ValueError that names the count (not the dtype); ``ring`` is exact. About 2 GiB
of memory a rank; about 30 s on the shared development machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 400


def test_a_count_past_mpis_int_is_exact_or_refused_by_its_count():
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", "2", sys.executable,
           "tests/large_count_ranks.py", "native", "ring"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0",
           "BMLMPI_TIMEOUT": "120"}
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             timeout=LAUNCH_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the launch did not end in {LAUNCH_TIMEOUT} s: {exc.stdout!r}"[-4000:])
    out = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, out
    reports = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("LARGE ")]
    assert sorted((r["algorithm"], r["rank"]) for r in reports) == [
        ("native", 0), ("native", 1), ("ring", 0), ("ring", 1)], out
    for r in reports:
        if r["algorithm"] == "ring" or "error" not in r:
            assert r.get("exact") is True, (r, out)
        else:
            assert "2147483655 elements" in r["error"] and "count" in r["error"], r
            assert r["error"].startswith("ValueError") and "dtype" not in r["error"], r
