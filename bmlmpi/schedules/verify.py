"""Symbolic verifier: proves a set of per-rank schedules computes its collective (allreduce,
reduce-scatter, allgather, reduce, broadcast: :mod:`.collectives`), without MPI.

Every element of every rank's work buffer is tracked as a vector of multiplicities — entry
``j`` counts how many times rank ``j``'s input has been folded into it, one extra entry counts
garbage (what a buffer holds before anything is copied into it) — and the input position it
derives from (as an offset: work position − input position, the same for all of a segment).
Elements that no range boundary of any schedule separates behave identically, so the buffer is
compressed to the segments between consecutive boundaries; the cost is O(size · segments ·
size) integers. The inputs are copied in before step 0 and the outputs out after the last step
(:meth:`~bmlmpi.schedules.types.Schedule.input_copies`, ``output_copies``).

Checks, with a message naming the step, rank and range of the first violation:

1. structure: peers are valid ranks other than oneself, ranges lie inside ``[0, count)`` and
   are non-empty, every rank's schedule agrees on ``size`` and ``count``;
2. matching: in every step, the sends from ``a`` to ``b`` are exactly the receives ``b``
   posts from ``a``, range for range and in the same order, on the same stream and level;
3. hazards: no range a rank writes in a step (a copy-receive or a reduce target) overlaps a
   range it sends in that step; copy-receives overlap nothing else written in the step;
4. copies: inputs read inside the rank's input and write disjoint ranges of the work buffer;
   outputs write disjoint ranges of the output, only inside the collective's result regions
   (a reduce's non-root writes nothing), and cover every region;
5. result: at the end every region of every live rank's output holds, element for element,
   the input position the contract names, reduced over exactly the contract's contributors
   once each (an allreduce: each live rank's input exactly once; multiplicity vector == 1 on
   live ranks, 0 on dead ones); a reduction of two different input positions fails at once.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .collectives import collective as collective_record
from .types import Copy, Schedule


class ScheduleError(AssertionError):
    """A schedule set that does not compute a correct allreduce."""


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _check_structure(scheds: Sequence[Schedule], live: list[int]) -> tuple[int, int]:
    size = scheds[0].size
    count = scheds[0].count
    first = scheds[0]
    for s in scheds:
        if s.size != size or s.count != count:
            raise ScheduleError(f"rank {s.rank}: size/count {s.size}/{s.count} differ "
                                f"from {size}/{count}")
        if (s.collective, s.root, s.counts) != (first.collective, first.root, first.counts):
            raise ScheduleError(f"rank {s.rank}: collective {s.collective} root {s.root} "
                                f"counts {s.counts} differ from rank {first.rank}'s")
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


_GARBAGE = np.iinfo(np.int64).min  # the offset of an element no input reached


def _check_copies(s: Schedule, what: str, copies: tuple[Copy, ...], src_size: int,
                  dst_size: int) -> None:
    written: list[tuple[int, int]] = []
    for c in copies:
        if not (0 <= c.lo < c.hi <= src_size) or not (0 <= c.at and c.at + c.n <= dst_size):
            raise ScheduleError(f"rank {s.rank}: {what} copy [{c.lo},{c.hi}) -> {c.at} outside "
                                f"{src_size} -> {dst_size} elements")
        written.append((c.at, c.at + c.n))
    written.sort()
    for a, b in zip(written, written[1:], strict=False):
        if _overlap(a, b):
            raise ScheduleError(f"rank {s.rank}: {what} copies write {a} and {b} twice")


def verify(scheds: Sequence[Schedule], live: Sequence[int] | None = None) -> None:
    """Raise :class:`ScheduleError` unless ``scheds`` (one per live rank) compute their
    collective (``Schedule.collective``; an allreduce unless it says otherwise).

    ``live`` lists the ranks that take part and contribute input; by default all ranks.
    """
    if not scheds:
        raise ScheduleError("no schedules")
    live_l = sorted(live) if live is not None else list(range(scheds[0].size))
    by_rank = {s.rank: s for s in scheds}
    if sorted(by_rank) != live_l:
        raise ScheduleError(f"schedules for ranks {sorted(by_rank)}, expected {live_l}")
    size, count = _check_structure(scheds, live_l)
    coll = collective_record(scheds[0].collective)
    root, counts = scheds[0].root, scheds[0].counts
    if coll.blocked and (counts is None or len(counts) != size or min(counts, default=0) < 0
                         or sum(counts) != count):
        raise ScheduleError(f"{coll.name}: block counts {counts} must be {size} counts >= 0 "
                            f"summing to {count}")
    if coll.rooted and not 0 <= root < size:
        raise ScheduleError(f"{coll.name}: root {root} outside [0, {size})")
    nsteps = max(len(s.steps) for s in scheds)
    _check_matching(by_rank, nsteps)
    for s in scheds:
        _check_hazards(s)
        _check_copies(s, "input", s.input_copies(),
                      coll.input_size(s.rank, count, root, counts), count)
        _check_copies(s, "output", s.output_copies(), count,
                      coll.output_size(s.rank, count, root, counts))

    cuts = {0, count}
    for s in scheds:
        for step in s.steps:
            for t in (*step.sends, *step.recvs):
                cuts.add(t.lo)
                cuts.add(t.hi)
        for c in s.input_copies():
            cuts.update((c.at, c.at + c.n))
        for c in s.output_copies():
            cuts.update((c.lo, c.hi))
    edges = np.array(sorted(cuts))
    nseg = len(edges) - 1

    def segs(lo: int, hi: int) -> slice:
        return slice(int(np.searchsorted(edges, lo)), int(np.searchsorted(edges, hi)))

    state, shift = {}, {}
    for r in live_l:
        state[r] = np.zeros((nseg, size + 1), dtype=np.int64)
        state[r][:, size] = 1
        shift[r] = np.full(nseg, _GARBAGE, dtype=np.int64)
        for c in by_rank[r].input_copies():
            sl = segs(c.at, c.at + c.n)
            state[r][sl] = 0
            state[r][sl, r] = 1
            shift[r][sl] = c.at - c.lo
    for i in range(nsteps):
        snapshot = {r: state[r].copy() for r in live_l}
        snap_shift = {r: shift[r].copy() for r in live_l}
        for r in live_l:
            s = by_rank[r]
            if i >= len(s.steps):
                continue
            for t in s.steps[i].recvs:
                sl = segs(t.lo, t.hi)
                if t.reduce:
                    mine, theirs = shift[r][sl], snap_shift[t.peer][sl]
                    clean = (mine != _GARBAGE) & (theirs != _GARBAGE)
                    if (clean & (mine != theirs)).any():
                        raise ScheduleError(
                            f"step {i} rank {r}: reduces [{t.lo},{t.hi}) from rank {t.peer} "
                            f"into data of other input positions")
                    shift[r][sl] = np.where(clean, mine, _GARBAGE)
                    state[r][sl] += snapshot[t.peer][sl]
                else:
                    state[r][sl] = snapshot[t.peer][sl]
                    shift[r][sl] = snap_shift[t.peer][sl]
    for r in live_l:
        _check_result(by_rank[r], coll.regions(r, live_l, count, root, counts), state[r],
                      shift[r], edges, size)


def _check_result(s: Schedule, regions: list, state: np.ndarray, shift: np.ndarray,
                  edges: np.ndarray, size: int) -> None:
    """The output of ``s`` (its copies out of the work buffer) against the contract."""
    starts = [reg[0] for reg in regions]
    covered = [0] * len(regions)
    for c in s.output_copies():
        first, last = int(np.searchsorted(edges, c.lo)), int(np.searchsorted(edges, c.hi))
        for seg in range(first, last):
            a, b = int(edges[seg]) - c.lo + c.at, int(edges[seg + 1]) - c.lo + c.at
            j = bisect.bisect_right(starts, a) - 1
            while a < b:
                if j < 0 or j >= len(regions) or a >= regions[j][1]:
                    raise ScheduleError(f"rank {s.rank}: writes output [{a},{b}) outside the "
                                        f"{s.collective} result")
                out_lo, out_hi, who, in_at = regions[j]
                upto = min(b, out_hi)
                want = np.zeros(size + 1, dtype=np.int64)
                want[list(who)] = 1
                if (state[seg] != want).any():
                    whom = (f"rank {who[0]}'s data" if len(who) == 1 else
                            f"each live rank exactly once (ranks {list(who)})")
                    raise ScheduleError(
                        f"rank {s.rank}: elements [{a},{upto}) of the output hold "
                        f"contributions {state[seg][:size].tolist()} (garbage "
                        f"{int(state[seg][size])}), expected {whom}")
                if c.lo - c.at - int(shift[seg]) != in_at - out_lo:
                    raise ScheduleError(
                        f"rank {s.rank}: output [{a},{upto}) holds input positions from "
                        f"{a + c.lo - c.at - int(shift[seg])}, expected from "
                        f"{in_at + a - out_lo}")
                covered[j] += upto - a
                a, j = upto, j + 1
    for (out_lo, out_hi, who, _), got in zip(regions, covered, strict=True):
        if got != out_hi - out_lo:
            raise ScheduleError(f"rank {s.rank}: output [{out_lo},{out_hi}) (ranks {list(who)}) "
                                f"written for {got} of {out_hi - out_lo} elements: expected "
                                f"each live rank exactly once everywhere")
