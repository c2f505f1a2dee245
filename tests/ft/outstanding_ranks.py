"""Rank-side program of the failure tests with several family calls outstanding
(:mod:`bmlmpi.ft.family`, "Calls outstanding at a failure").

Started by ``tests/test_ft_outstanding.py`` as ``bmlmpi-run --ft -n W python
tests/ft/outstanding_ranks.py SPEC`` (never collected by pytest). ``SPEC`` is JSON::

    {"timeout": 40, "hang_timeout": 10,
     "groups": [{"size": 4, "algorithm": "bml", "mode": "i", "victim": 2, "after": 2}]}

The world is cut into independent groups, each with its own fault-tolerant communicator
built with ``algorithm``. Round 0 is the batch ``Iallgather``, ``Ireduce_scatter_block``,
``Ibcast`` (root ``size - 1``), ``Ireduce`` (root ``victim``), ``Iallgather``, every argument
given for ``call_members`` (the communicator's frame) when the batch starts. ``mode``: ``i``
posts the five, ``persistent`` makes the five with ``…_init`` and starts each; then both wait
on each in turn (``"wait": "reverse"``: the last first; ``"test"``: poll ``Test`` on every one
until all are complete); ``blocking`` makes the five blocking calls one after
the other, each with arguments for ``call_members`` when it is made. The victim dies
(SIGKILL) after posting ``after`` calls (``blocking``: after ``after`` calls returned).
Round 1 repeats the batch once every survivor has waited on round 0 (``persistent``: starts
the same requests again, inputs changed in place; otherwise new arguments).

Every survivor checks each call against the contract exactly (position- and
rank-dependent integers, every result compared with the reduction or the data of the ranks
that may have contributed) and prints one ``OUTSTANDING-JSON`` line: per call, what it raised
(type, lost ranks or root), a digest of what it holds that must be the same on every survivor,
and whether the check passed; and the seconds each round took.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft

GATHER = 5   # elements each rank contributes to an allgather
BLOCK = 3    # elements of each reduce-scatter block
BCAST = 7
REDUCE = 6
NAMES = ("allgather", "reduce_scatter_block", "bcast", "reduce", "allgather")


def emit(**record) -> None:
    print("OUTSTANDING-JSON " + json.dumps(record), flush=True)


def data(n: int, orig: int, call: int, rnd: int) -> np.ndarray:
    """Position-, original rank-, call- and round-dependent integers, exact in float64 sums."""
    i = np.arange(n)
    return ((i * 7 + orig * 3 + call) % 11 + orig * 1000 + call * 100_000
            + rnd * 1_000_000).astype(np.float64)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


class Batch:
    """One round's five calls, their buffers and the members they were made for."""

    def __init__(self, comm, rnd: int, victim: int):
        self.comm = comm
        self.rnd = rnd
        self.members = list(comm.call_members)  # what the arguments are for
        size, me = len(self.members), comm.original_rank
        self.size = size
        self.rank = self.members.index(me)
        self.bcast_root = size - 1
        # the victim's current rank while it is a member, else rank 0
        self.reduce_root = self.members.index(victim) if victim in self.members else 0
        self.gather_in = [data(GATHER, me, c, rnd) for c in (0, 4)]
        self.gather_out = [np.full(GATHER * size, -1.0) for _ in range(2)]
        self.rs_in = data(BLOCK * size, me, 1, rnd)
        self.rs_out = np.full(BLOCK, -1.0)
        self.bcast = data(BCAST, me, 2, rnd)
        self.bcast_before = self.bcast.copy()
        self.red_in = data(REDUCE, me, 3, rnd)
        self.red_out = np.full(REDUCE, -1.0)

    def reset_outputs(self) -> None:
        """Before a persistent request starts again: outputs to -1, the broadcast's buffer to
        this rank's data."""
        for out in self.gather_out:
            out[:] = -1.0
        self.rs_out[:] = -1.0
        self.red_out[:] = -1.0
        self.bcast[:] = self.bcast_before

    def args(self, i: int):
        """The ``(method name, positional arguments)`` of call ``i``."""
        me_root = self.rank == self.reduce_root
        return [("allgather", (self.gather_in[0], self.gather_out[0])),
                ("reduce_scatter_block", (self.rs_in, self.rs_out, MPI.SUM)),
                ("bcast", (self.bcast, self.bcast_root)),
                ("reduce", (self.red_in, self.red_out if me_root else None, MPI.SUM,
                            self.reduce_root)),
                ("allgather", (self.gather_in[1], self.gather_out[1]))][i]


METHODS = {"allgather": ("Allgather", "Iallgather", "Allgather_init"),
           "reduce_scatter_block": ("Reduce_scatter_block", "Ireduce_scatter_block",
                                    "Reduce_scatter_block_init"),
           "bcast": ("Bcast", "Ibcast", "Bcast_init"),
           "reduce": ("Reduce", "Ireduce", "Reduce_init")}


def subsets(must: list[int], maybe: list[int]):
    for m in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, m):
            yield sorted(must + list(extra))


def outcome(b: Batch, i: int, error, dead: list[int]) -> dict:
    """What call ``i`` of batch ``b`` left on this survivor, checked against the contract.
    ``dead``: original ranks that died in or before this round (they may or may not have
    contributed, depending on when they died)."""
    comm, rnd = b.comm, b.rnd
    me = comm.original_rank
    members = b.members
    alive = [o for o in members if o not in dead]
    maybe = [o for o in members if o in dead]
    rec: dict = {"call": i, "raised": None, "detail": None, "digest": None, "why": None}
    if error is not None:
        rec["raised"] = type(error).__name__
        rec["detail"] = (list(error.lost) if isinstance(error, ft.ContributionsLost)
                         else error.root if isinstance(error, ft.RootFailed) else str(error))
    name = NAMES[i]
    if name == "allgather":
        out = b.gather_out[0 if i == 0 else 1]
        call = 0 if i == 0 else 4
        lost = set(error.lost) if isinstance(error, ft.ContributionsLost) else set()
        if error is not None and not lost:
            rec["why"] = f"raised {error!r}"
        elif lost - set(maybe):
            rec["why"] = f"lost {sorted(lost)} names ranks that did not die"
        for j, o in enumerate(members):
            slot = out[j * GATHER:(j + 1) * GATHER]
            want = np.zeros(GATHER) if o in lost else data(GATHER, o, call, rnd)
            if not np.array_equal(slot, want):
                rec["why"] = f"slot {j} (original rank {o}, lost {sorted(lost)}): {slot}"
        rec["digest"] = digest(out)
    elif name == "reduce_scatter_block":
        if error is not None:
            rec["why"] = f"raised {error!r}"
        j = members.index(me)
        for s in subsets(alive, maybe):
            total = sum(data(BLOCK * b.size, o, 1, rnd) for o in s)
            if np.array_equal(b.rs_out, total[j * BLOCK:(j + 1) * BLOCK]):
                rec["digest"] = s  # the contributors, the same on every survivor
                break
        else:
            rec["why"] = f"block {j} is no reduction over the survivors (+dead): {b.rs_out}"
    elif name == "bcast":
        root = members[b.bcast_root]
        if isinstance(error, ft.RootFailed):
            if error.root != root or root not in maybe:
                rec["why"] = f"RootFailed({error.root}) but the root {root} lives or differs"
            elif not np.array_equal(b.bcast, b.bcast_before):
                rec["why"] = "RootFailed but buf changed"
        elif error is not None:
            rec["why"] = f"raised {error!r}"
        elif not np.array_equal(b.bcast, data(BCAST, root, 2, rnd)):
            rec["why"] = f"buf is not the root's data: {b.bcast}"
        else:
            rec["digest"] = digest(b.bcast)
    else:
        root = members[b.reduce_root]
        if isinstance(error, ft.RootFailed):
            if error.root != root or root not in maybe:
                rec["why"] = f"RootFailed({error.root}) but the root {root} lives or differs"
        elif error is not None:
            rec["why"] = f"raised {error!r}"
        elif me == root:
            for s in subsets(alive, maybe):
                if np.array_equal(b.red_out, sum(data(REDUCE, o, 3, rnd) for o in s)):
                    break
            else:
                rec["why"] = f"the root's result is no reduction over the survivors: " \
                             f"{b.red_out}"
    return rec


def finish_call(req):
    try:
        req.Wait()
        return None
    except (ft.RootFailed, ft.ContributionsLost) as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - recorded: the test names what differs
        return exc


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def round_(comm, b: Batch, mode: str, victim: int, after: int | None,
           persistent: list | None, wait: str) -> list:
    """Run batch ``b``; the victim dies after posting ``after`` calls (None: nobody dies).
    Returns ``(batch, error)`` per call: a blocking call's arguments are made for the
    members when it is made (a fresh batch each), the others' for the members when the
    batch starts."""
    me = comm.original_rank
    errors: list = [None] * 5
    if mode == "blocking":
        made = []
        for i in range(5):
            if after == i and me == victim:
                die()
            bi = Batch(comm, b.rnd, victim)
            name, args = bi.args(i)
            try:
                getattr(comm, METHODS[name][0])(*args)
            except Exception as exc:  # noqa: BLE001 - recorded
                errors[i] = exc
            made.append(bi)
        if after == 5 and me == victim:
            die()
        return list(zip(made, errors, strict=True))
    reqs = []
    for i in range(5):
        if after == i and me == victim:
            die()
        if mode == "persistent":
            reqs.append(persistent[i])
            persistent[i].Start()
        else:
            name, args = b.args(i)
            reqs.append(getattr(comm, METHODS[name][1])(*args))
    if after == 5 and me == victim:
        die()
    if wait == "test":
        left = set(range(5))
        while left:
            for i in sorted(left):
                try:
                    done = reqs[i].Test()
                except Exception as exc:  # noqa: BLE001 - recorded
                    errors[i], done = exc, True
                if done:
                    left.discard(i)
    else:
        for i in (reversed(range(5)) if wait == "reverse" else range(5)):
            errors[i] = finish_call(reqs[i])
    return [(b, e) for e in errors]


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
    try:
        comm = bmlmpi.Communicator(sub, algorithm=g["algorithm"], fault_tolerant=True,
                                   timeout=spec["timeout"], hang_timeout=spec["hang_timeout"])
    except ft.FaultToleranceUnavailable as exc:
        emit(unavailable=str(exc), rank=world.rank)
        return 0
    mode, victim = g["mode"], g["victim"]
    rounds = []
    b = Batch(comm, 0, victim)
    persistent = None
    if mode == "persistent":
        persistent = [getattr(comm, METHODS[name][2])(*args)
                      for name, args in (b.args(i) for i in range(5))]
    for rnd in range(2):
        if rnd == 1:
            if mode == "persistent":
                b.rnd = 1  # same requests: the inputs change in place for round 1
                me = comm.original_rank
                b.gather_in[0][:] = data(GATHER, me, 0, 1)
                b.gather_in[1][:] = data(GATHER, me, 4, 1)
                b.rs_in[:] = data(BLOCK * b.size, me, 1, 1)
                b.bcast_before[:] = data(BCAST, me, 2, 1)
                b.red_in[:] = data(REDUCE, me, 3, 1)
                b.reset_outputs()
            else:
                b = Batch(comm, 1, victim)
        t0 = time.monotonic()
        ends = round_(comm, b, mode, victim, g["after"] if rnd == 0 else None, persistent,
                      g.get("wait", "order"))
        seconds = time.monotonic() - t0
        dead = [victim]
        rounds.append({"seconds": round(seconds, 2), "size": comm.size,
                       "calls": [outcome(bi, i, e, dead) for i, (bi, e) in enumerate(ends)]})
    emit(survivor=comm.original_rank, group=gi, rounds=rounds, failed=list(comm.failed))
    ft.finish(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
