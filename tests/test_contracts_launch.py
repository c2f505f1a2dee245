"""docs/contracts.md on real ranks: bad arguments on one rank after a signature's first calls,
a rank switching signature, a late rank, a stopped rank, the watchdog, the fault-tolerant
communicator (rank program: tests/contracts_ranks.py). Every launch has a hard timeout, and
each scenario bounds how long its errors may take (well below its deadline where the answer
is known at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = "tests/contracts_ranks.py"
LAUNCH_TIMEOUT = 400


def launch(scenario: str, n: int, env: dict, ft: bool = False):
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", *(["--ft"] if ft else []), "-n", str(n),
           sys.executable, PROGRAM, scenario]
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0", **env}
    full.pop("BMLMPI_ALGORITHM", None)
    full.pop("BMLMPI_BCUBE", None)
    full.pop("BMLMPI_CHECK", None)
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             timeout=LAUNCH_TIMEOUT, env=full)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{scenario} on {n} ranks hung (not ended in {LAUNCH_TIMEOUT} s):\n"
                    f"{out[-4000:]}")
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("CONTRACT ")]
    return res, records, time.monotonic() - start


def check_records(res, records, n: int) -> None:
    out = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, out
    assert sorted(r["rank"] for r in records) == list(range(n)), out
    bad = [(r["rank"], f) for r in records for f in r["failures"]]
    assert not bad, f"{len(bad)} failure(s): {bad[:6]}"


@pytest.mark.parametrize("n,blocking", [(3, "polled"), (4, "watchdog"), (5, "polled"),
                                        (6, "watchdog")])
def test_bad_arguments_on_one_rank_fail_every_rank_quickly(n, blocking):
    """Items 1, 6, 7, 5a: bad input on one rank (constructor or a call after the signature's
    first calls; the allreduce and the family, blocking, non-blocking and persistent) raises
    its own error there and RemoteArgumentError naming it on the others, well within half
    the deadline; the next call is right. Options that differ per rank (algorithm,
    validation, compression) raise ArgumentMismatch on every rank at once."""
    res, records, _ = launch("arguments", n, {"BMLMPI_TIMEOUT": "30",
                                              "BMLMPI_BLOCKING": blocking})
    check_records(res, records, n)


def test_a_rank_switching_signature_never_gets_a_wrong_result():
    """Item 2: schedules tell signatures apart by tag (the allreduce, the family, persistent
    starts); every rank raises at its deadline."""
    res, records, _ = launch("switch", 4, {"BMLMPI_TIMEOUT": "4", "BMLMPI_BLOCKING": "polled"})
    check_records(res, records, 4)


@pytest.mark.parametrize("blocking", ["polled", "watchdog"])
def test_a_late_rank_never_writes_a_buffer_after_deadline_exceeded(blocking):
    """Item 3: the 42 -> 406 case; the late rank does not join, the communicator is revoked;
    for the family's native calls and a native persistent allreduce the late rank joins the
    abandoned MPI calls, which still write no buffer of the others'."""
    res, records, _ = launch("late", 3, {"BMLMPI_TIMEOUT": "3", "BMLMPI_BLOCKING": blocking})
    check_records(res, records, 3)
    late = next(r for r in records if r["rank"] == 1)["notes"]
    assert late and all(v in ("CommunicatorRevoked", "completed") for v in late.values()), late


def test_a_stopped_peer_cannot_keep_the_job_from_ending():
    """Item 5b: the others raise DeadlineExceeded, and MPI_Finalize is bounded."""
    res, records, took = launch("stopped", 3, {"BMLMPI_TIMEOUT": "3",
                                               "BMLMPI_BLOCKING": "polled"})
    out = (res.stdout + res.stderr)[-4000:]
    # The launcher's teardown may send the stopped rank SIGCONT before its SIGTERM, and the
    # rank then prints its record a second time: count ranks, not records.
    assert {r["rank"] for r in records} == {0, 1, 2}, out
    assert not [f for r in records for f in r["failures"]], out
    # Ranks 0 and 2 both wait for rank 1; whichever deadline comes first revokes the
    # communicator, and the other may learn of it before its own deadline.
    assert "DeadlineExceeded" in [r.get("notes", {}).get("raised") for r in records], out
    assert "MPI_Finalize gets" in res.stderr, out
    assert took < LAUNCH_TIMEOUT, out


def test_watchdog_ends_the_job_when_a_rank_rejects_a_fast_path_call():
    """Item 1 on the blocking native fast path: the others cannot be interrupted inside
    MPI_Allreduce; the watchdog ends the job at once (not after the deadline), naming the
    rank and its error."""
    res, records, took = launch("watchdog_bad", 3, {"BMLMPI_TIMEOUT": "60",
                                                    "BMLMPI_BLOCKING": "watchdog"})
    out = (res.stdout + res.stderr)[-4000:]
    assert {r["rank"] for r in records} == {0, 1, 2}, out
    assert "RAISED rank 1 BufferSpecError: recvbuf is read-only" in res.stdout, out
    assert "rank 1 rejected its arguments at call 4 (BufferSpecError: recvbuf is read-only)" \
        in res.stderr, out
    assert res.returncode != 0, out
    assert took < 50, f"the watchdog waited for the deadline: {took:.0f} s\n{out}"


def test_the_watchdog_lets_a_call_complete_that_the_rank_ahead_did_its_part_of():
    """A rank that did its part of a Reduce and rejected its next call while the others were
    still inside MPI in the Reduce: the watchdog ends nothing (the notice is about a later
    call), the Reduce completes right, the others raise RemoteArgumentError at the next
    call and the communicator goes on."""
    res, records, _ = launch("watchdog_ahead", 3, {"BMLMPI_TIMEOUT": "60",
                                                   "BMLMPI_BLOCKING": "watchdog"})
    check_records(res, records, 3)
    waited = {r["rank"]: r["notes"]["call3_s"] for r in records}
    # the scenario happened: rank 0 was through call 3 while the root still waited in it
    # for rank 2 (which slept 3 s before it)
    assert waited[0] < 1.5 <= waited[1], waited


def test_fault_tolerant_communicator_agrees_every_call():
    """Items 1 and 5c under --ft: a bad buffer on one rank after the first calls raises on
    every rank and the communicator goes on; timeout < hang_timeout is refused."""
    res, records, _ = launch("ft", 4, {"BMLMPI_TIMEOUT": "60"}, ft=True)
    check_records(res, records, 4)


@pytest.mark.parametrize("algorithm", ["bml", "native"])
def test_fault_tolerant_recovery_with_survivors_at_different_calls(algorithm):
    """Item 4 under --ft: the victim dies before its third of four outstanding calls and
    rank 0 starts its last two 0.3 s late; the survivors differ only in how many calls they
    had started, and every call completes on every survivor."""
    res, records, _ = launch("ft_lag", 4, {"BMLMPI_TIMEOUT": "60",
                                           "CONTRACT_ALGORITHM": algorithm}, ft=True)
    out = (res.stdout + res.stderr)[-6000:]
    assert sorted(r["rank"] for r in records) == [0, 1, 2], out
    bad = [(r["rank"], f) for r in records for f in r["failures"]]
    assert not bad, f"{len(bad)} failure(s): {bad[:6]}"
    assert all(r["notes"]["failed"] == [3] for r in records), records
