"""Rank-side program of the failure tests: runs allreduces while chosen ranks die.

Started by ``tests/test_ft_launch.py`` as ``bmlmpi-run --ft -n W python tests/ft/ft_ranks.py
SPEC`` (never collected by pytest itself: it needs ULFM and ranks that really die). ``SPEC`` is
JSON::

    {"timeout": 60, "hang_timeout": 10,
     "groups": [{"size": 4, "algorithm": "bml", "topology": null, "recovery": "auto",
                 "count": 1001, "calls": 4, "op": "sum", "in_place": false,
                 "kills": [{"call": 1, "rank": 3, "when": "post", "step": 2, "how": "kill"}]}]}

The world is cut into independent groups (consecutive world ranks), each with its own
fault-tolerant communicator, so one launch tests several failure scenarios side by side: a
failure in one group is invisible to the others' communicators.

``when``: ``before`` the call starts; ``post`` — at the start of schedule step ``step`` of the
call, before its messages are posted; ``during`` — once step ``step`` has been posted (the
native algorithm: right after the call started; ``shm``: once its run has reached schedule
step ``step``, publishing and reducing as far as it could). ``how``: ``kill`` (SIGKILL),
``raise`` (an uncaught exception, turned into SIGKILL by
``bmlmpi.ft.install_exit_handlers``), ``exit`` (``os._exit(0)``), ``stop`` (SIGSTOP: hangs
until the heartbeat fences it), ``exit1``
(``os._exit(1)``: MPI never reports it), ``link`` (``ip link set IFACE down`` on the
interface this rank's link watch reads, from the group's ``links``: {"rank": "iface"}; the
watch must fence the rank).

Optional per group: ``outstanding`` (k non-blocking allreduces per call, waited in reverse
order), ``masks`` (``[{"call": c, "link": [a, b]}]``: before call c every member calls
``mask_link(a, b)``, masking the larger end).

Output, one JSON line each, prefixed ``FT-JSON``: every victim before it dies
(``must_exclude``: it still had messages to send, so no survivor can have completed the call
with its input), a masked rank, and every survivor at the end (per call and outstanding
allreduce: which of the call's victims the result included — the result must equal the exact
reduction over the survivors plus exactly those, else ``null`` — the communicator size and the
schedule run; for hierarchical, the communicator's nodes after the call, in original
ranks), or a survivor's error.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, ft
from bmlmpi.shm import ShmRun

#: the runs of a schedule (messages, or shared-memory steps), as opposed to a native call
SCHEDULED = (execute.Run, ShmRun)


def emit(**record) -> None:
    print("FT-JSON " + json.dumps(record), flush=True)


def rank_input(n: int, rank: int, call: int) -> np.ndarray:
    """Position-, rank- and call-dependent integers, exact in float64 sums."""
    i = np.arange(n)
    return ((i * 7 + rank * 3 + call) % 11 + rank * 1000 + call * 100_000).astype(np.float64)


LINK: dict[str, str] = {}  # "name": the interface this rank's link watch reads


def die(how: str) -> None:
    if how == "link":
        # the link goes down; the watch must end this process within its period
        subprocess.run(["ip", "link", "set", LINK["name"], "down"], check=True, timeout=30)
        time.sleep(10)
        emit(unfenced=LINK["name"])  # the test fails on this record
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise RuntimeError("ft_ranks: this rank fails on purpose")
    elif how == "exit":
        os._exit(0)
    elif how == "exit1":
        os._exit(1)
    elif how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        raise AssertionError("a stopped rank must be fenced, never continued")
    else:
        raise ValueError(f"unknown way to die: {how}")


class StepHook:
    """Kills this rank when a schedule Run of the armed call reaches the armed step."""

    def __init__(self) -> None:
        self.armed: dict | None = None
        self.report: dict = {}
        hook = self

        class Killer(execute.RunObserver):
            def post(self, run: execute.Run, lane: int) -> None:
                k = hook.armed
                if k is not None and k["when"] == "post" and run.posting_step(lane) >= k["step"]:
                    emit(victim=hook.report["rank"], group=hook.report["group"], call=k["call"],
                         must_exclude=run.sends_left(), schedule=run.plan.sched.algorithm,
                         at=time.time())
                    die(k["how"])

        self.observer = Killer()


def expected(n: int, ranks: list[int], call: int, op: str) -> np.ndarray:
    total = np.zeros(n)
    for r in ranks:
        total += rank_input(n, r, call)
    return total / len(ranks) if op == "avg" else total


def main() -> int:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    world = MPI.COMM_WORLD
    groups = spec["groups"]
    if sum(g["size"] for g in groups) != world.size:
        raise SystemExit(f"spec needs {sum(g['size'] for g in groups)} ranks, got {world.size}")
    start, gi = 0, 0
    for gi, g in enumerate(groups):  # noqa: B007 - the loop finds this rank's group
        if world.rank < start + g["size"]:
            break
        start += g["size"]
    g = groups[gi]
    sub = world.Split(gi, world.rank)
    link = g.get("links", {}).get(str(world.rank - start))
    if link:
        LINK["name"] = link
    lost_log: list[list[int]] = []
    try:
        comm = bmlmpi.Communicator(
            sub, algorithm=g.get("algorithm", "bml"), topology=g.get("topology"),
            fault_tolerant=True, recovery=g.get("recovery", "auto"), timeout=spec["timeout"],
            hang_timeout=spec["hang_timeout"],
            on_failure=lambda c, lost: lost_log.append(list(lost)),
            watch_links=[LINK["name"]] if LINK else None)
    except ft.FaultToleranceUnavailable as exc:
        emit(unavailable=str(exc), rank=world.rank)
        return 0
    me = comm.original_rank
    hook = StepHook()
    # for the rest of the process, which ends in ft.finish; kept referenced: a dropped
    # ExitStack is collected at once, which closes the context and uninstalls the observer
    observed = contextlib.ExitStack()
    observed.enter_context(execute.observing(hook.observer))
    hook.report = {"rank": me, "group": gi}
    op_name = g.get("op", "sum")
    op = bmlmpi.AVG if op_name == "avg" else MPI.SUM
    n = g.get("count", 1001)
    gone: set[int] = set()
    results = []
    outstanding = g.get("outstanding", 1)
    for call in range(g["calls"]):
        for m in g.get("masks", []):
            if m["call"] == call:
                if not comm.mask_link(*m["link"]):
                    refused = []  # what the masked rank's calls raise
                    for attempt in (lambda: comm.Allreduce(np.zeros(3), np.zeros(3)),
                                    lambda: comm.Bcast(np.zeros(3), 0)):
                        try:
                            attempt()
                            refused.append(None)
                        except ft.RankMasked as exc:
                            refused.append(type(exc).__name__)
                    emit(masked=me, group=gi, call=call, failed=list(comm.failed),
                         refused=refused)
                    ft.finish(0)
                gone.add(max(m["link"]))
        kills = [k for k in g.get("kills", []) if k["call"] == call]
        for k in kills:
            if k["when"] == "before" and k["rank"] == me:
                emit(victim=me, group=gi, call=call, must_exclude=True, schedule=None)
                die(k["how"])
        mine = [k for k in kills if k["rank"] == me and k["when"] in ("post", "during")]
        hook.armed = mine[0] if mine else None
        tags = [call * 10 + j for j in range(outstanding)]  # one input per outstanding call
        xs, outs, reqs = [], [], []
        for tag in tags:
            x = rank_input(n, me, tag)
            if g.get("in_place", False):
                out = x.copy()
                reqs.append(comm.Iallreduce(MPI.IN_PLACE, out, op=op))
            else:
                out = np.full(n, -1.0)
                reqs.append(comm.Iallreduce(x, out, op=op))
            xs.append(x)
            outs.append(out)
        if mine and mine[0]["when"] == "during":
            k, req = mine[0], reqs[0]
            while True:
                run = req.run
                if run is None or not isinstance(run, SCHEDULED) or run.step >= k["step"]:
                    break
                req.Test()
            # the run may have gone past the step (several steps can complete in one test):
            # what it has not posted yet is what the survivors will miss
            is_run = isinstance(run, SCHEDULED)
            emit(victim=me, group=gi, call=call,
                 schedule=run.plan.sched.algorithm if is_run else None,
                 must_exclude=is_run and run.sends_left())
            die(k["how"])
        try:
            for req in reversed(reqs):  # any order: every Wait advances every call
                req.Wait()
        except ft.FaultToleranceError as exc:
            emit(survivor=me, group=gi, error=str(exc))
            ft.finish(0, timeout=5)
        k = hook.armed
        if k is not None and k["when"] == "post":
            # this rank had nothing left to post at or after the armed step: it dies having
            # sent everything, right after the call
            emit(victim=me, group=gi, call=call, must_exclude=False, schedule=None)
            die(k["how"])
        hook.armed = None
        run = reqs[0].run
        schedule = run.plan.sched.algorithm if isinstance(run, SCHEDULED) else "native"
        gone |= {k["rank"] for k in kills if k["when"] == "before"}
        in_call = sorted(k["rank"] for k in kills if k["when"] != "before")
        alive = [r for r in range(g["size"]) if r not in gone and r not in in_call]
        included = []
        for tag, x, out in zip(tags, xs, outs, strict=True):
            match = None
            for m in range(len(in_call) + 1):
                for extra in itertools.combinations(in_call, m):
                    want = expected(n, sorted(alive + list(extra)), tag, op_name)
                    if np.array_equal(out, want):
                        match = list(extra)
                        break
                if match is not None:
                    break
            if not g.get("in_place", False) and not np.array_equal(x, rank_input(n, me, tag)):
                match = None  # the send buffer must never change
            included.append(match)
        record = {"call": call, "included": included, "size": comm.size,
                  "failed": list(comm.failed), "schedule": schedule}
        if g.get("algorithm") == "hierarchical":  # the nodes it ran on, in original ranks
            record["nodes"] = [[comm.survivors[r] for r in node]
                               for node in comm.nodes().members]
        results.append(record)
        gone |= set(in_call)
    emit(survivor=me, group=gi, results=results, lost=lost_log, failed=list(comm.failed),
         size=comm.size, recovery=comm.recovery,
         recoveries=[{"lost": list(r.lost), "noticed": r.noticed, "agreed": r.agreed,
                      "shrunk": r.shrunk} for r in comm.recoveries])
    ft.finish(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
