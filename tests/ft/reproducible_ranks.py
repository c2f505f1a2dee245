"""Rank-side program of the reproducible fault-tolerant tests: allreduce, reduce-scatter and
reduce (``Communicator(fault_tolerant=True, reproducible=True)``).

Started by ``tests/test_reproducible_ft.py`` as ``bmlmpi-run --ft --tolerate-lost -n N python
tests/ft/reproducible_ranks.py SPEC`` (never collected by pytest: it needs ULFM and a rank
that really dies). ``SPEC`` is JSON::

    {"timeout": 60, "hang_timeout": 20, "algorithm": "ring",
     "kill": {"call": 1, "rank": 3, "when": "step", "step": 1}, "per_call": false,
     "collective": "allreduce"}

Every rank runs ``CALLS`` reproducible float64 SUM calls of ``collective`` (``allreduce``;
``reduce_scatter``: ``Reduce_scatter_block`` of ``BLOCK`` values a member of the call's
frame; ``reduce``: ``Reduce`` to rank 0) of its own contribution (the victim's values are
the largest, so the cuts agreed with it differ from the survivors'). The
victim dies (SIGKILL) in call ``call``: ``before`` it starts; ``words``: once the block
exponents' MAX completed, as its words are encoded (none sent); ``step``: as its words' run
posts schedule step ``step``. Every survivor then records, per call, whether its result has
the bits of the reproducible reduction over every rank (``all``) or over the survivors
(``survivors``), computed on one rank with :mod:`bmlmpi.reproducible.format` (a
reduce-scatter: the block of its rank in the call's frame; a reduce: the root's result, the
other ranks record ``not root``), and whether a fresh call among the survivors of the killed
call's inputs gives the same bits as that call's result (a reduce-scatter: ``Reduce_scatter``
whose last survivor takes the victim's block too, the victim being the last rank).
``per_call``: the mode asked by each call (``reproducible=True``) instead of the
communicator's.

Output, one JSON line each, prefixed ``FTR-JSON``: the victim before it dies, every survivor
at the end (or its error).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, ft
from bmlmpi.reproducible import format as rf

CALLS = 3
COUNT = 700
BLOCK = 200


def emit(**record) -> None:
    print("FTR-JSON " + json.dumps(record), flush=True)


def contribution(rank: int, call: int, victim: int, count: int = COUNT) -> np.ndarray:
    rng = np.random.default_rng(100 * call + rank)
    x = rng.standard_normal(count) * 10.0 ** rng.integers(-6, 6, count)
    return x * 1e9 if rank == victim else x


def reference(ranks: list[int], call: int, victim: int, count: int = COUNT) -> np.ndarray:
    parts = [contribution(r, call, victim, count) for r in ranks]
    agreed = np.max([rf.block_exponents(p) for p in parts], axis=0)
    return rf.decode(sum(rf.encode(p, agreed) for p in parts), agreed, np.float64)


class Calls:
    """One collective's calls and their references on this rank (original rank ``me``)."""

    def __init__(self, comm, collective: str, per_call: bool, me: int, victim: int):
        self.comm, self.collective, self.me, self.victim = comm, collective, me, victim
        self.mode = True if per_call else None
        self.frames: list[int] = []   # the size of each call's frame

    def count(self, frame: int) -> int:
        return frame * BLOCK if self.collective == "reduce_scatter" else COUNT

    def run(self, call: int) -> bytes:
        """Call ``call`` made for the current members; its result's bytes."""
        frame = self.comm.size
        self.frames.append(frame)
        x = contribution(self.me, call, self.victim, self.count(frame))
        if self.collective == "allreduce":
            out = np.full(COUNT, -7.0)
            self.comm.Allreduce(x, out, reproducible=self.mode)
        elif self.collective == "reduce_scatter":
            out = np.full(BLOCK, -7.0)
            self.comm.Reduce_scatter_block(x, out, reproducible=self.mode)
        else:
            out = np.full(COUNT, -7.0)
            self.comm.Reduce(x, out, root=0, reproducible=self.mode)
        return out.tobytes()

    def wanted(self, ranks: list[int], call: int) -> bytes | None:
        """The reference bits of call ``call`` over ``ranks`` (None: this rank has none)."""
        frame = self.frames[call]
        whole = reference(ranks, call, self.victim, self.count(frame))
        if self.collective == "reduce_scatter":
            # this rank's block in the frame: its original rank before the failure (the
            # victim is the last rank), its rank among the survivors after
            at = self.me
            return whole[at * BLOCK:(at + 1) * BLOCK].tobytes()
        if self.collective == "reduce" and self.me != 0:
            return None
        return whole.tobytes()

    def fresh(self, call: int) -> bytes | None:
        """A fresh call among the survivors of call ``call``'s inputs (made for its frame)."""
        frame = self.frames[call]
        x = contribution(self.me, call, self.victim, self.count(frame))
        comm, mode = self.comm, self.mode
        if self.collective == "allreduce":
            out = np.empty(COUNT)
            comm.Iallreduce(x, out, reproducible=mode).Wait()
            return out.tobytes()
        if self.collective == "reduce_scatter":
            counts = [BLOCK] * comm.size
            counts[-1] += (frame - comm.size) * BLOCK   # the last survivor: the lost blocks
            out = np.empty(counts[comm.rank])
            comm.Ireduce_scatter(x, out, counts, reproducible=mode).Wait()
            return out[:BLOCK].tobytes()
        out = np.empty(COUNT)
        comm.Ireduce(x, out, root=0, reproducible=mode).Wait()
        return out.tobytes() if self.me == 0 else None


class Killer(execute.RunObserver):
    step: int | None = None

    def post(self, run: execute.Run, lane: int) -> None:
        if self.step is not None and run.posting_step(lane) >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def _die_encoding(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    ft.install_exit_handlers()
    spec = json.loads(sys.argv[1])
    world = MPI.COMM_WORLD
    me, size = world.rank, world.size
    kill = spec["kill"]
    victim = kill["rank"]
    try:
        comm = bmlmpi.Communicator(world, algorithm=spec["algorithm"], fault_tolerant=True,
                                   reproducible=not spec["per_call"], timeout=spec["timeout"],
                                   hang_timeout=spec["hang_timeout"])
    except ft.FaultToleranceUnavailable as exc:
        emit(unavailable=str(exc), rank=me)
        return
    killer = Killer()
    results = []
    calls = Calls(comm, spec.get("collective", "allreduce"), spec["per_call"], me, victim)
    try:
        with execute.observing(killer):
            for call in range(CALLS):
                if call == kill["call"] and me == victim:
                    emit(victim=me)
                    if kill["when"] == "before":
                        os.kill(os.getpid(), signal.SIGKILL)
                    elif kill["when"] == "words":
                        rf.encode = _die_encoding
                    else:
                        killer.step = kill["step"]
                results.append(calls.run(call))
        everyone = list(range(size))
        survivors = [r for r in everyone if r not in comm.failed]
        matches = []
        for call, got in enumerate(results):
            match = None
            if calls.wanted(everyone, call) is None:
                match = "not root"
            elif calls.frames[call] == size and got == calls.wanted(everyone, call):
                match = "all"
            elif got == calls.wanted(survivors, call):
                match = "survivors"
            matches.append(match)
        fresh = calls.fresh(kill["call"])
        emit(survivor=me, failed=list(comm.failed), matches=matches,
             fresh_equal=fresh is None or fresh == results[kill["call"]],
             digest=[hashlib.sha256(r).hexdigest() for r in results])
    except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
        emit(survivor=me, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        ft.finish(1, timeout=5)
    ft.finish(0)


if __name__ == "__main__":
    main()
