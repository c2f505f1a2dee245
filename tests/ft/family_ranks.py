"""Rank-side program of the collective family's failure tests (:mod:`bmlmpi.ft.family`).

Started by ``tests/test_ft_launch.py`` as ``bmlmpi-run --ft -n W python tests/ft/family_ranks.py
SPEC`` (never collected by pytest). ``SPEC`` is JSON::

    {"timeout": 60, "hang_timeout": 10,
     "groups": [{"size": 4, "collectives": ["reduce_scatter", "bcast"], "algorithm": "native",
                 "calls": 3, "op": "sum", "in_place": false, "ranks_per_node": 2,
                 "kills": [{"call": 1, "rank": 2, "when": "during", "how": "kill"}]}]}

The world is cut into independent groups, each with its own fault-tolerant communicator.
Call c of a group runs over the members left then (the counts, root and layout for its
current size): reduce-scatter with uneven ``recvcounts``, allgatherv with displacements in
reverse rank order, reduce and broadcast from root ``c % size``, all-to-all (``alltoall``:
equal blocks; ``alltoallv``: uneven pair counts with zeros, blocks received in reverse rank
order with gaps that must stay untouched; ``blocking``: the blocking calls instead of the
``I…`` ones). ``when``: ``before`` the
call, or ``during`` it (the victim starts the call and dies at once); ``rank`` is an original
rank or ``"root"`` (the call's root). Call c runs ``collectives[c % len]``.
``ranks_per_node`` (optional): the group's nodes, as ``BMLMPI_RANKS_PER_NODE`` pretends them
(``hierarchical`` then runs both of its tiers). Every survivor checks
its result against the contract and prints one ``FAMILY-JSON`` line at the end: per call,
``ok`` or what was wrong, what it raised, the size after the call.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft


def emit(**record) -> None:
    print("FAMILY-JSON " + json.dumps(record), flush=True)


def data(n: int, orig: int, call: int) -> np.ndarray:
    """Position-, original rank- and call-dependent integers, exact in float64 sums."""
    i = np.arange(n)
    return ((i * 7 + orig * 3 + call) % 11 + orig * 1000 + call * 100_000).astype(np.float64)


def counts_for(size: int, call: int) -> list[int]:
    return [(i * 3 + call) % 4 + (1 if i % 3 else 0) for i in range(size)]  # zeros too


def reduction(n: int, origs, call: int, op: str) -> np.ndarray:
    total = np.zeros(n)
    for o in origs:
        total += data(n, o, call)
    return total / len(origs) if op == "avg" else total


def subsets(must: list[int], maybe: list[int]):
    for m in range(len(maybe) + 1):
        for extra in itertools.combinations(maybe, m):
            yield sorted(must + list(extra))


def run_call(comm, collective: str, call: int, op_name: str, in_place: bool, victim: dict | None,
             algorithm: str, blocking: bool = False):
    """Start call ``call``; the victim dies right after starting it; the others wait.
    Returns (what the check needs, the error raised or None)."""
    size, rank, me = comm.size, comm.rank, comm.original_rank
    members = list(comm.survivors)
    op = bmlmpi.AVG if op_name == "avg" else MPI.SUM
    root = call % size
    state = {"members": members, "root": root, "rank": rank}
    if collective == "reduce_scatter":
        counts = counts_for(size, call)
        x = data(sum(counts), me, call)
        if in_place:
            out = x.copy()
            req = comm.Ireduce_scatter(MPI.IN_PLACE, out, counts, op, algorithm=algorithm)
        else:
            out = np.full(counts[rank], -1.0)
            req = comm.Ireduce_scatter(x, out, counts, op, algorithm=algorithm)
        state.update(counts=counts, out=out, x=x)
    elif collective == "allgather":
        counts = counts_for(size, call)
        displs, at = [0] * size, 1
        for r in reversed(range(size)):
            displs[r] = at
            at += counts[r] + 1
        out = np.full(at, -1.0)
        mine = data(counts[rank], me, call)
        if in_place:
            out[displs[rank]:displs[rank] + counts[rank]] = mine
            req = comm.Iallgatherv(MPI.IN_PLACE, [out, counts, displs, MPI.DOUBLE],
                                   algorithm=algorithm)
        else:
            req = comm.Iallgatherv(mine, [out, counts, displs, MPI.DOUBLE], algorithm=algorithm)
        state.update(counts=counts, displs=displs, out=out)
    elif collective == "reduce":
        n = 37
        x = data(n, me, call)
        out = np.full(n, -1.0)
        if in_place and rank == root:
            out[:] = x
            req = comm.Ireduce(MPI.IN_PLACE, out, op, root, algorithm=algorithm)
        else:
            req = comm.Ireduce(x, out if rank == root else None, op, root, algorithm=algorithm)
        state.update(n=n, out=out)
    elif collective in ("alltoall", "alltoallv"):
        return run_exchange(comm, collective, call, in_place, victim, algorithm, blocking,
                            state)
    else:
        n = 41
        buf = data(n, me, call)
        state.update(n=n, out=buf, before=buf.copy())
        req = comm.Ibcast(buf, root, algorithm=algorithm)
    if victim is not None:
        emit(victim=me, call=call)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        req.Wait()
        return state, None
    except (ft.RootFailed, ft.ContributionsLost) as exc:
        return state, exc


def pair_count(src: int, dst: int, call: int, symmetric: bool, equal: bool) -> int:
    """Elements original rank ``src`` sends ``dst`` in call ``call`` (zeros too)."""
    if equal:
        return 3
    if symmetric:
        return (src + dst + call) % 4
    return (src * 5 + dst * 3 + call) % 4


def block(n: int, src: int, dst: int, call: int) -> np.ndarray:
    """What original rank ``src`` sends ``dst``: position-, sender- and receiver-dependent."""
    i = np.arange(n)
    return ((i * 7 + src * 3 + dst * 5 + call) % 11 + src * 1000 + dst * 10
            + call * 100_000).astype(np.float64)


def run_exchange(comm, collective: str, call: int, in_place: bool, victim: dict | None,
                 algorithm: str, blocking: bool, state: dict):
    """An all-to-all over the members now: ``alltoall`` equal blocks, packed; ``alltoallv``
    uneven pair counts with zeros (symmetric in place), received in reverse rank order with
    a gap of one element before each block, sent packed. The victim of a ``during`` kill
    starts the call and dies at once (``blocking``: a thread kills it 50 ms into the call)."""
    members, me = state["members"], comm.original_rank
    equal = collective == "alltoall"
    sends = [pair_count(me, o, call, in_place, equal) for o in members]
    recvs = [pair_count(o, me, call, in_place, equal) for o in members]
    if equal:
        rdispls = [sum(recvs[:j]) for j in range(len(members))]
        at = sum(recvs)
    else:
        rdispls, at = [0] * len(members), 1
        for j in reversed(range(len(members))):
            rdispls[j] = at
            at += recvs[j] + 1
    out = np.full(at, -1.0)
    x = np.concatenate([block(c, me, o, call) for c, o in zip(sends, members, strict=True)])
    if in_place:
        for j, o in enumerate(members):
            out[rdispls[j]:rdispls[j] + recvs[j]] = block(recvs[j], me, o, call)
    send = MPI.IN_PLACE if in_place else x
    if equal:
        args = (send, out)
        name = "Alltoall"
    else:
        args = (send if in_place else [x, sends], [out, recvs, rdispls, MPI.DOUBLE])
        name = "Alltoallv"
    state.update(recvs=recvs, rdispls=rdispls, out=out)
    if victim is not None and blocking:
        emit(victim=me, call=call)
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    try:
        if blocking:
            getattr(comm, name)(*args, algorithm=algorithm)
            if victim is not None:  # the call completed first: the kill comes after it
                time.sleep(60)
        else:
            req = getattr(comm, "I" + name.lower())(*args, algorithm=algorithm)
            if victim is not None:
                emit(victim=me, call=call)
                os.kill(os.getpid(), signal.SIGKILL)
            req.Wait()
        return state, None
    except ft.ContributionsLost as exc:
        return state, exc


def check(collective: str, call: int, op: str, state: dict, error, victims: list[int],
          gone_before: list[int], me: int) -> str | None:
    """None if this survivor's result keeps the contract, else what is wrong. A victim in
    ``gone_before`` died before the call started, so no reduction may hold its data."""
    members, root, rank = state["members"], state["root"], state["rank"]
    dead = [o for o in members if o in victims]
    alive = [o for o in members if o not in victims]
    may_count = [o for o in dead if o not in gone_before]
    out = state["out"]
    if collective == "reduce_scatter":
        if error is not None:
            return f"raised {error!r}"
        counts = state["counts"]
        lo = sum(counts[:rank])
        got = out[:counts[rank]]
        for s in subsets(alive, may_count):
            if np.array_equal(got, reduction(sum(counts), s, call, op)[lo:lo + counts[rank]]):
                return None
        return f"block {rank} is no reduction over the survivors (+victims): {got[:4]}"
    if collective == "allgather":
        counts, displs = state["counts"], state["displs"]
        lost = set(error.lost) if error is not None else set()
        if lost - set(dead):
            return f"lost {sorted(lost)} names ranks that did not die in the call"
        for i, o in enumerate(members):
            slot = out[displs[i]:displs[i] + counts[i]]
            want = np.zeros(counts[i]) if o in lost else data(counts[i], o, call)
            if not np.array_equal(slot, want):
                return f"slot of original rank {o} wrong (lost {sorted(lost)}): {slot[:4]}"
        return None
    if collective in ("alltoall", "alltoallv"):
        recvs, rdispls = state["recvs"], state["rdispls"]
        lost = set(error.lost) if error is not None else set()
        if lost - set(dead):
            return f"lost {sorted(lost)} names ranks that did not die in the call"
        if gone_before and not set(gone_before) <= lost:
            return f"lost {sorted(lost)} leaves out {gone_before}, gone before the call"
        expect = np.full(out.size, -1.0)
        for j, o in enumerate(members):
            want = np.zeros(recvs[j]) if o in lost else block(recvs[j], o, me, call)
            expect[rdispls[j]:rdispls[j] + recvs[j]] = want
        if not np.array_equal(out, expect):
            wrong = np.flatnonzero(out != expect)[:4]
            return f"recvbuf wrong at {wrong.tolist()} (lost {sorted(lost)}): {out[wrong]}"
        return None
    root_orig = members[root]
    if isinstance(error, ft.RootFailed):
        if root_orig not in dead or error.root != root_orig:
            return f"RootFailed({error.root}) but the root {root_orig} is alive or differs"
        if collective == "bcast" and not np.array_equal(out, state["before"]):
            return "bcast raised RootFailed but changed buf"
        return None
    if error is not None:
        return f"raised {error!r}"
    if collective == "reduce":
        if me != root_orig:
            return None
        for s in subsets(alive, may_count):
            if np.array_equal(out, reduction(state["n"], s, call, op)):
                return None
        return f"the root's result is no reduction over the survivors: {out[:4]}"
    if not np.array_equal(out, data(state["n"], root_orig, call)):
        return f"buf is not the root's data: {out[:4]}"
    return None


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
    if "ranks_per_node" in g:  # read when the communicator is built
        os.environ["BMLMPI_RANKS_PER_NODE"] = str(g["ranks_per_node"])
    try:
        comm = bmlmpi.Communicator(sub, fault_tolerant=True, timeout=spec["timeout"],
                                   hang_timeout=spec["hang_timeout"])
    except ft.FaultToleranceUnavailable as exc:
        emit(unavailable=str(exc), rank=world.rank)
        return 0
    me = comm.original_rank
    results = []
    collectives = g.get("collectives") or [g["collective"]]
    for call in range(g["calls"]):
        collective = collectives[call % len(collectives)]
        # "root": the call's root (rank call % size now), as an original rank
        kills = [{**k, "rank": comm.survivors[call % comm.size] if k["rank"] == "root"
                  else k["rank"]} for k in g.get("kills", []) if k["call"] == call]
        for k in kills:
            if k["when"] == "before" and k["rank"] == me:
                emit(victim=me, call=call)
                os.kill(os.getpid(), signal.SIGKILL)
        mine = [k for k in kills if k["rank"] == me and k["when"] == "during"]
        state, error = run_call(comm, collective, call, g.get("op", "sum"),
                                g.get("in_place", False), mine[0] if mine else None,
                                g.get("algorithm", "native"), g.get("blocking", False))
        # the ranks this call may have lost: its victims, and any earlier victim that the
        # previous call committed without noticing (it died after delivering its part)
        lost = [k["rank"] for k in kills] + [o for o in state["members"]
                                             if o not in comm.survivors]
        gone_before = [k["rank"] for k in kills if k["when"] == "before"]
        why = check(collective, call, g.get("op", "sum"), state, error, lost, gone_before, me)
        results.append({"call": call, "collective": collective, "ok": why is None, "why": why,
                        "raised": type(error).__name__ if error is not None else None,
                        "lost": sorted(getattr(error, "lost", ())),
                        "size": comm.size})
    ran = sorted({s.sig.chosen for s in (comm.recorder.slots if comm.recorder else ())
                  if s.seq >= 0 and s.sig is not None and s.sig.chosen})
    emit(survivor=me, group=gi, results=results, failed=list(comm.failed), size=comm.size,
         ran=ran)
    ft.finish(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
