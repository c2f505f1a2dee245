"""Symbolic verifier: proves a set of per-rank schedules computes an allreduce, without MPI.

Every element of every rank's buffer is tracked as a vector of multiplicities: entry ``j``
counts how many times rank ``j``'s input has been folded into it. Elements that no range
boundary of any schedule separates behave identically, so the buffer is compressed to the
segments between consecutive boundaries; the cost is O(size · segments · size) integers.

Checks, with a message naming the step, rank and range of the first violation:

1. structure: peers are valid ranks other than oneself, ranges lie inside ``[0, count)`` and
   are non-empty, every rank's schedule agrees on ``size`` and ``count``;
2. matching: in every step, the sends from ``a`` to ``b`` are exactly the receives ``b``
   posts from ``a``, range for range and in the same order, on the same stream and level;
3. hazards: no range a rank writes in a step (a copy-receive or a reduce target) overlaps a
   range it sends in that step; copy-receives overlap nothing else written in the step;
4. result: at the end every live rank's every element holds each live rank's input exactly
   once (multiplicity vector == 1 on live ranks, 0 on dead ones).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .types import Schedule


class ScheduleError(AssertionError):
    """A schedule set that does not compute a correct allreduce."""


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _check_structure(scheds: Sequence[Schedule], live: list[int]) -> tuple[int, int]:
    size = scheds[0].size
    count = scheds[0].count
    for s in scheds:
        if s.size != size or s.count != count:
            raise ScheduleError(f"rank {s.rank}: size/count {s.size}/{s.count} differ "
                                f"from {size}/{count}")
        for i, step in enumerate(s.steps):
            for t in (*step.sends, *step.recvs):
                if not (0 <= t.peer < size) or t.peer == s.rank:
                    raise ScheduleError(f"step {i} rank {s.rank}: bad peer {t.peer}")
                if t.peer not in live:
                    raise ScheduleError(f"step {i} rank {s.rank}: talks to dead rank {t.peer}")
                if not (0 <= t.lo < t.hi <= count):
                    raise ScheduleError(f"step {i} rank {s.rank}: bad range [{t.lo},{t.hi})")
    return size, count


def _check_matching(by_rank: dict[int, Schedule], nsteps: int) -> None:
    for i in range(nsteps):
        sent: dict[tuple[int, int], list] = defaultdict(list)
        recvd: dict[tuple[int, int], list] = defaultdict(list)
        for r, s in by_rank.items():
            if i >= len(s.steps):
                continue
            for t in s.steps[i].sends:
                sent[(r, t.peer)].append((t.lo, t.hi, t.stream, t.level))
            for t in s.steps[i].recvs:
                recvd[(t.peer, r)].append((t.lo, t.hi, t.stream, t.level))
        for key in set(sent) | set(recvd):
            if sent.get(key, []) != recvd.get(key, []):
                raise ScheduleError(
                    f"step {i}: {key[0]}->{key[1]} sends {sent.get(key, [])} "
                    f"but receives {recvd.get(key, [])}")


def _check_hazards(s: Schedule) -> None:
    for i, step in enumerate(s.steps):
        reads = [(t.lo, t.hi) for t in step.sends]
        copies = [(t.lo, t.hi) for t in step.recvs if not t.reduce]
        reduces = [(t.lo, t.hi) for t in step.recvs if t.reduce]
        for w in copies + reduces:
            for r in reads:
                if _overlap(w, r):
                    raise ScheduleError(f"step {i} rank {s.rank}: range {w} written while "
                                        f"{r} is being sent")
        for j, c in enumerate(copies):
            for other in copies[j + 1:] + reduces:
                if _overlap(c, other):
                    raise ScheduleError(f"step {i} rank {s.rank}: copy into {c} overlaps "
                                        f"another write {other}")


def verify(scheds: Sequence[Schedule], live: Sequence[int] | None = None) -> None:
    """Raise :class:`ScheduleError` unless ``scheds`` (one per live rank) is an allreduce.

    ``live`` lists the ranks that take part and contribute input; by default all ranks.
    """
    if not scheds:
        raise ScheduleError("no schedules")
    live_l = sorted(live) if live is not None else list(range(scheds[0].size))
    by_rank = {s.rank: s for s in scheds}
    if sorted(by_rank) != live_l:
        raise ScheduleError(f"schedules for ranks {sorted(by_rank)}, expected {live_l}")
    size, count = _check_structure(scheds, live_l)
    nsteps = max(len(s.steps) for s in scheds)
    _check_matching(by_rank, nsteps)
    for s in scheds:
        _check_hazards(s)
    if count == 0:
        return

    cuts = {0, count}
    for s in scheds:
        for step in s.steps:
            for t in (*step.sends, *step.recvs):
                cuts.add(t.lo)
                cuts.add(t.hi)
    edges = np.array(sorted(cuts))
    nseg = len(edges) - 1

    def segs(lo: int, hi: int) -> slice:
        return slice(int(np.searchsorted(edges, lo)), int(np.searchsorted(edges, hi)))

    state = {r: np.zeros((nseg, size), dtype=np.int64) for r in live_l}
    for r in live_l:
        state[r][:, r] = 1
    for i in range(nsteps):
        snapshot = {r: state[r].copy() for r in live_l}
        for r in live_l:
            s = by_rank[r]
            if i >= len(s.steps):
                continue
            for t in s.steps[i].recvs:
                sl = segs(t.lo, t.hi)
                if t.reduce:
                    state[r][sl] += snapshot[t.peer][sl]
                else:
                    state[r][sl] = snapshot[t.peer][sl]
    want = np.zeros(size, dtype=np.int64)
    want[live_l] = 1
    for r in live_l:
        bad = np.nonzero((state[r] != want).any(axis=1))[0]
        if len(bad):
            seg = bad[0]
            raise ScheduleError(
                f"rank {r}: elements [{edges[seg]},{edges[seg + 1]}) hold contributions "
                f"{state[r][seg].tolist()}, expected each live rank exactly once")
