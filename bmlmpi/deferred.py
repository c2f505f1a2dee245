"""Which parts of an allreduce's input a run must copy into the result, and when.

A scheduled allreduce with a separate ``sendbuf`` could start by copying all of it into
``recvbuf`` (read and write every byte) and then run the schedule in place. Much of that copy
would be wasted: a range the first step only *sends* can be sent from ``sendbuf`` itself, and a
range later overwritten by a copy-receive (the allgather half of ring and BML) never needed
its input in ``recvbuf`` at all. At N = 2 (ring or BML) half the buffer is sent from the input
and then received, so half the copy goes.

:func:`analyse` walks one lane's steps in order, once per plan, tracking which element ranges
of the result already hold current data ("touched"); every other range still equals the
input. Per step it says: which ranges to copy from the input before the step posts (a send
that reads a range partly touched), which sends may read the input directly (the range is
wholly untouched), and which ranges to copy before each reduction (the reduced range's
untouched parts: a reduction folds into the current value, which there is still the input).
A reduction whose whole range is untouched and which has one source is marked ``combine``: the
executor then writes ``input <op> scratch`` into the result in one pass
(:func:`bmlmpi.kernels.combine_into`) instead of copying the input and reducing in place (at
N = 2 every reduction of ring and BML is such a one). A copy-receive marks its range touched
without a copy (it overwrites all of it). After every
lane, the ranges no lane touched are copied at the end. Lanes of one plan touch disjoint
ranges (:func:`~bmlmpi.schedules.types.streams_are_independent`), so each lane is analysed
alone. Cost: O(transfers · intervals) once per plan; nothing per call but the copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

Ranges = tuple[tuple[int, int], ...]


class _PostLike(Protocol):
    lo: int
    hi: int
    scratch: int


class _StepLike(Protocol):
    sends: Sequence[_PostLike]
    recvs: Sequence[_PostLike]
    reduces: Sequence[tuple[int, int, tuple[int, ...]]]


def untouched(touched: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of ``[lo, hi)`` outside the sorted, disjoint intervals ``touched``."""
    parts, at = [], lo
    for a, b in touched:
        if b <= at:
            continue
        if a >= hi:
            break
        if a > at:
            parts.append((at, a))
        at = max(at, b)
        if at >= hi:
            break
    if at < hi:
        parts.append((at, hi))
    return parts


def touch(touched: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``touched`` with ``[lo, hi)`` added, kept sorted, disjoint and merged."""
    if hi <= lo:
        return touched
    out, placed = [], False
    for a, b in touched:
        if b < lo or a > hi:
            if a > hi and not placed:
                out.append((lo, hi))
                placed = True
            out.append((a, b))
        else:
            lo, hi = min(lo, a), max(hi, b)
    if not placed:
        out.append((lo, hi))
    return sorted(out)


@dataclass(frozen=True, slots=True)
class StepCopies:
    before_post: Ranges               # copy input -> result before the step posts
    send_from_input: tuple[bool, ...]  # per send of the step: read the input, not the result
    before_reduce: tuple[Ranges, ...]  # per reduction of the step: copy these parts first
    # per reduction: its range is all input and it has one source, so instead of the copy
    # the executor writes ``input <op> scratch`` straight into the result
    combine: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class Deferred:
    lanes: tuple[tuple[StepCopies, ...], ...]
    final: Ranges                      # copied after every lane completed


def analyse(lanes: Sequence[Sequence[_StepLike]], count: int) -> Deferred:
    """The copies of a run whose input is a separate buffer (see the module docstring)."""
    everywhere: list[tuple[int, int]] = []
    out_lanes = []
    for lane in lanes:
        touched: list[tuple[int, int]] = []
        steps = []
        for sp in lane:
            before, from_input = [], []
            for p in sp.sends:
                parts = untouched(touched, p.lo, p.hi)
                whole = parts == [(p.lo, p.hi)] or p.hi <= p.lo
                from_input.append(whole)
                if not whole:
                    before += parts
                    for lo, hi in parts:
                        touched = touch(touched, lo, hi)
            for p in sp.recvs:
                if p.scratch < 0:  # overwrites its whole range when it lands
                    touched = touch(touched, p.lo, p.hi)
            reduce_copies, combine = [], []
            for lo, hi, offs in sp.reduces:
                parts = untouched(touched, lo, hi)
                reduce_copies.append(tuple(parts))
                combine.append(len(offs) == 1 and parts == [(lo, hi)])
                touched = touch(touched, lo, hi)
            steps.append(StepCopies(tuple(before), tuple(from_input), tuple(reduce_copies),
                                    tuple(combine)))
        out_lanes.append(tuple(steps))
        for lo, hi in touched:
            everywhere = touch(everywhere, lo, hi)
    return Deferred(tuple(out_lanes), tuple(untouched(everywhere, 0, count)))
