"""Rank-side program of the grow-back test: a rank dies, the survivors spawn its replacement.

Started by ``tests/test_ft_launch.py`` (and ``perf/ft/grow.py``) as ``bmlmpi-run --ft -n N
python tests/ft/grow_ranks.py SPEC``; the replacements run this same program, spawned by
``replace_failed``, and enter through ``bmlmpi.ft.join``. ``SPEC`` is JSON::

    {"timeout": 60, "hang_timeout": 20, "topology": "3x3", "count": 1001, "calls": 6,
     "kills": [{"call": 1, "rank": 0, "step": 0}, {"call": 3, "rank": 4, "step": 2}]}

A small "training" loop: each call reduces position-, rank- and call-dependent integers
(exact in float64) with bml and adds the result to ``params``. A victim SIGKILLs itself at the
start of schedule step ``step`` of call ``call`` (it still has messages to send, so no
survivor can complete that call with its input); after that call the survivors call
``replace_failed`` with the state ``{"next": call + 1, "params": params}``, and the
replacement picks the loop up there. A replacement can itself be a later victim.
With ``"bad_command": PATH`` the survivors first call ``replace_failed`` with a program that
cannot start, which must raise on each of them and leave the communicator usable.

Output, one JSON line each, prefixed ``GROW-JSON``: each victim before it dies (with
``time.time()``), and every process alive at the end: per call the members it was committed
over, the schedule, the size and whether the result was the exact sum over those members; a
hash of the final parameters; the recoveries and regrowths with their times.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, ft


def emit(**record) -> None:
    print("GROW-JSON " + json.dumps(record), flush=True)


def rank_input(n: int, rank: int, call: int) -> np.ndarray:
    i = np.arange(n)
    return ((i * 7 + rank * 3 + call) % 11 + rank * 1000 + call * 100_000).astype(np.float64)


class Killer(execute.RunObserver):
    """SIGKILLs this rank when a run of the armed call starts posting the armed step."""

    def __init__(self) -> None:
        self.armed: dict | None = None
        self.me = -1

    def post(self, run: execute.Run, lane: int) -> None:
        k = self.armed
        if k is not None and run.posting_step(lane) >= k["step"]:
            emit(victim=self.me, call=k["call"], at=time.time(), must_exclude=run.sends_left())
            os.kill(os.getpid(), signal.SIGKILL)


def spawn_failure(comm, command: str, n: int, call: int) -> None:
    """``replace_failed`` with a program that cannot start must fail on every member and
    leave the communicator as it was: an allreduce over the survivors still works."""
    try:
        comm.replace_failed(None, command=command, args=[])
        emit(rank=comm.original_rank, spawn_failure="replace_failed returned")
        return
    except ft.FaultToleranceError as exc:
        message = str(exc)
    x = rank_input(n, comm.original_rank, 1000 + call)
    out = np.empty(n)
    comm.Allreduce(x, out)
    want = sum(rank_input(n, r, 1000 + call) for r in comm.survivors)
    emit(rank=comm.original_rank, spawn_failure=message, size=comm.size,
         still_exact=bool(np.array_equal(out, want)))


def main() -> int:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    joined = ft.join(timeout=spec["timeout"])
    if joined is None:
        comm = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm="bml",
                                   topology=spec.get("topology"), fault_tolerant=True,
                                   timeout=spec["timeout"], hang_timeout=spec["hang_timeout"])
        start, params = 0, np.zeros(spec.get("count", 1001))
    else:
        comm, state = joined
        start, params = state["next"], state["params"]
    me = comm.original_rank
    killer = Killer()
    killer.me = me
    # kept referenced: a dropped ExitStack is collected at once and closes the context
    observed = contextlib.ExitStack()
    observed.enter_context(execute.observing(killer))  # until ft.finish
    n = params.size
    results = []
    for call in range(start, spec["calls"]):
        kills = [k for k in spec["kills"] if k["call"] == call]
        killer.armed = next((k for k in kills if k["rank"] == me), None)
        x = rank_input(n, me, call)
        out = np.full(n, -1.0)
        try:
            req = comm.Iallreduce(x, out)
            req.Wait()
        except (ft.FaultToleranceError, bmlmpi.DeadlineExceeded) as exc:
            emit(rank=me, error=f"call {call}: {type(exc).__name__}: {exc}")
            ft.finish(0, timeout=5)
        killer.armed = None
        members = list(comm.survivors)
        want = sum(rank_input(n, r, call) for r in members)
        run = req.run
        schedule = run.plan.sched.algorithm if isinstance(run, execute.Run) else "native"
        results.append({"call": call, "members": members, "size": comm.size,
                        "exact": bool(np.array_equal(out, want)), "schedule": schedule,
                        "committed": time.time()})
        params = params + out
        if kills and spec.get("bad_command") and joined is None and not comm.regrowths:
            spawn_failure(comm, spec["bad_command"], n, call)
        if kills:
            try:
                comm.replace_failed({"next": call + 1, "params": params})
            except (ft.FaultToleranceError, bmlmpi.DeadlineExceeded) as exc:
                emit(rank=me, error=f"replace_failed after call {call}: "
                                    f"{type(exc).__name__}: {exc}")
                ft.finish(0, timeout=5)
    emit(rank=me, replacement=joined is not None, results=results, size=comm.size,
         failed=list(comm.failed), shape=list(comm.shape),
         params=hashlib.sha256(params.tobytes()).hexdigest(),
         recoveries=[{"lost": list(r.lost), "noticed": r.noticed, "shrunk": r.shrunk}
                     for r in comm.recoveries],
         regrowths=[{"replaced": list(g.replaced), "started": g.started, "spawned": g.spawned,
                     "rebuilt": g.rebuilt, "done": g.done, "joined": g.joined}
                    for g in comm.regrowths],
         env_calibrate=os.environ.get("BMLMPI_CALIBRATE"))
    ft.finish(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
