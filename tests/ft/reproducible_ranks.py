"""Rank-side program of the reproducible fault-tolerant allreduce tests
(``Communicator(fault_tolerant=True, reproducible=True)``).

Started by ``tests/test_reproducible_ft.py`` as ``bmlmpi-run --ft --tolerate-lost -n N python
tests/ft/reproducible_ranks.py SPEC`` (never collected by pytest: it needs ULFM and a rank
that really dies). ``SPEC`` is JSON::

    {"timeout": 60, "hang_timeout": 20, "algorithm": "ring",
     "kill": {"call": 1, "rank": 3, "when": "step", "step": 1}, "per_call": false}

Every rank runs ``CALLS`` reproducible float64 SUM allreduces of its own contribution (the
victim's values are the largest, so the cuts agreed with it differ from the survivors'). The
victim dies (SIGKILL) in call ``call``: ``before`` it starts; ``words``: once the block
exponents' MAX completed, as its words are encoded (none sent); ``step``: as its words' run
posts schedule step ``step``. Every survivor then records, per call, whether its result has
the bits of the reproducible reduction over every rank (``all``) or over the survivors
(``survivors``), computed on one rank with :mod:`bmlmpi.reproducible.format`, and whether a
fresh call among the survivors of the killed call's inputs gives the same bits as that
call's result. ``per_call``: the mode asked by each call (``reproducible=True``) instead of
the communicator's.

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


def emit(**record) -> None:
    print("FTR-JSON " + json.dumps(record), flush=True)


def contribution(rank: int, call: int, victim: int) -> np.ndarray:
    rng = np.random.default_rng(100 * call + rank)
    x = rng.standard_normal(COUNT) * 10.0 ** rng.integers(-6, 6, COUNT)
    return x * 1e9 if rank == victim else x


def reference(ranks: list[int], call: int, victim: int) -> bytes:
    parts = [contribution(r, call, victim) for r in ranks]
    agreed = np.max([rf.block_exponents(p) for p in parts], axis=0)
    return rf.decode(sum(rf.encode(p, agreed) for p in parts), agreed, np.float64).tobytes()


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
    try:
        with execute.observing(killer):
            for call in range(CALLS):
                x = contribution(me, call, victim)
                if call == kill["call"] and me == victim:
                    emit(victim=me)
                    if kill["when"] == "before":
                        os.kill(os.getpid(), signal.SIGKILL)
                    elif kill["when"] == "words":
                        rf.encode = _die_encoding
                    else:
                        killer.step = kill["step"]
                out = np.full(COUNT, -7.0)
                comm.Allreduce(x, out, reproducible=True if spec["per_call"] else None)
                results.append(out.tobytes())
        everyone = list(range(size))
        survivors = [r for r in everyone if r not in comm.failed]
        matches = []
        for call, got in enumerate(results):
            match = None
            if got == reference(everyone, call, victim):
                match = "all"
            elif got == reference(survivors, call, victim):
                match = "survivors"
            matches.append(match)
        fresh = np.empty(COUNT)
        comm.Iallreduce(contribution(me, kill["call"], victim), fresh,
                        reproducible=True if spec["per_call"] else None).Wait()
        emit(survivor=me, failed=list(comm.failed), matches=matches,
             fresh_equal=fresh.tobytes() == results[kill["call"]],
             digest=[hashlib.sha256(r).hexdigest() for r in results])
    except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
        emit(survivor=me, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        ft.finish(1, timeout=5)
    ft.finish(0)


if __name__ == "__main__":
    main()
