"""The pipelined meet: an allreduce whose reductions each take every rank's own addends at
once, in pieces that stay in cache — the schedule of a reproducible allreduce
(:mod:`bmlmpi.call_formats`), whose sum must see the addends themselves, never a partial sum.

Algorithm. The buffer is cut into N blocks of whole units (``unit`` elements: a reproducible
format's block of 256 real positions, so that no block of the format straddles two ranks and
the pieces fall on whole blocks), block j owned by rank j, and each block into P pieces of
whole units, every rank cutting every block alike.

* Step 0: rank r sends piece 0 of block j to rank j (for every j != r) and reduce-receives
  piece 0 of its own block from every other rank: the reduction of the step takes the N
  addends of each position at once (the rank's own input and N - 1 received ones).
* Step p (1 <= p < P): piece p likewise, and the allgather of piece p - 1: rank r sends its
  summed piece p - 1 to every other rank and copy-receives theirs.
* Step P: the allgather of piece P - 1.

A piece is summed from the N - 1 received ones in the lane's scratch, reused from step to
step, and sent on in the next step: the scratch holds N - 1 pieces, not (N - 1)/N of the
buffer. The steps differ from a direct reduce-scatter followed by an allgather only in
this interleaving.

Steps: P + 1 (none for N = 1). Each rank sends and receives 2 (N - 1)/N count elements, as
the ring; N - 1 messages a step to each side instead of one. Cost (α-β, one full-duplex link
per rank): (P + 1)(N - 1) α + 2 (N - 1)/N count β; the reductions read each position's N
addends once.

Source: the direct (all-to-all) reduce-scatter and allgather of Thakur, Rabenseifner and
Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005,
pipelined in pieces as Patarasuk and Yuan pipeline the ring (JPDC 69(2), 2009); the
reduction of every addend at once is what the reproducible sum needs (Demmel and Nguyen,
"Parallel reproducible summation", IEEE TC 2015: the result must not depend on where
partial sums formed).
"""

from __future__ import annotations

from .types import Recv, Schedule, Step, Transfer, balanced_bounds

#: Target bytes of the pieces one step reduces (the N - 1 received and the own one together).
#: Measured at N = 2 on the 2-core development VM, float32, the reproducible allreduce
#: (``perf/reproducible/compare.py``): steps of 2 MiB took 15.5-16.8 ms at 64 MiB, of 8 and
#: 32 MiB 10.1-12.6 ms, one step for the whole block 11.0-12.0 ms; the pieces bound the
#: scratch the received ones need ((N - 1) pieces, not (N - 1) / N of the buffer).
MEET_STEP_BYTES = 8 << 20
#: At most this many pieces a block.
MAX_MEET_PIECES = 64


def meet_pieces(count: int, itemsize: int, size: int, step_bytes: int = MEET_STEP_BYTES,
                max_pieces: int = MAX_MEET_PIECES) -> int:
    """Pieces a block so that one step reduces about ``step_bytes`` (a block's ⌈count/N⌉
    elements of ``itemsize`` bytes from each of N ranks), clamped to [1, ``max_pieces``]."""
    if count < 0 or itemsize <= 0 or size <= 0 or step_bytes <= 0 or max_pieces < 1:
        raise ValueError(f"meet_pieces needs count >= 0, itemsize > 0, size > 0, "
                         f"step_bytes > 0, max_pieces >= 1; got {count}, {itemsize}, {size}, "
                         f"{step_bytes}, {max_pieces}")
    step = -(-count // size) * itemsize * size
    return max(1, min(max_pieces, step // step_bytes))


def unit_bounds(lo: int, hi: int, parts: int, unit: int, end: int) -> list[int]:
    """``[lo, hi)`` cut into ``parts`` ranges of whole units of ``unit`` elements counted from
    0 (balanced by units; the bounds clipped at ``end``, the buffer's end, where the last
    unit is partial)."""
    units = balanced_bounds(-(-lo // unit), -(-hi // unit), parts)
    return [min(u * unit, end) for u in units]


def meet_schedule(rank: int, size: int, count: int, pieces: int = 1,
                  unit: int = 1) -> Schedule:
    """Rank ``rank``'s pipelined meet of ``count`` elements over ``size`` ranks (the module
    docstring): blocks and ``pieces`` pieces a block of whole ``unit`` s."""
    if size < 1 or not 0 <= rank < size or count < 0 or pieces < 1 or unit < 1:
        raise ValueError(f"meet_schedule needs 0 <= rank < size, count >= 0, pieces >= 1 and "
                         f"unit >= 1; got rank={rank}, size={size}, count={count}, "
                         f"pieces={pieces}, unit={unit}")
    blocks = unit_bounds(0, count, size, unit, count)
    cut = [unit_bounds(blocks[j], blocks[j + 1], pieces, unit, count) for j in range(size)]
    peers = [q for q in range(size) if q != rank]

    def piece(j: int, p: int) -> tuple[int, int]:
        return cut[j][p], cut[j][p + 1]

    steps = []
    for p in range(pieces + 1):
        sends: list[Transfer] = []
        recvs: list[Recv] = []
        if p < pieces:
            lo, hi = piece(rank, p)
            for q in peers:
                qlo, qhi = piece(q, p)
                if qhi > qlo:
                    sends.append(Transfer(q, qlo, qhi))
                if hi > lo:
                    recvs.append(Recv(q, lo, hi, reduce=True))
        if p > 0:
            lo, hi = piece(rank, p - 1)
            for q in peers:
                if hi > lo:
                    sends.append(Transfer(q, lo, hi))
                qlo, qhi = piece(q, p - 1)
                if qhi > qlo:
                    recvs.append(Recv(q, qlo, qhi))
        if sends or recvs:
            steps.append(Step(tuple(sends), tuple(recvs)))
    return Schedule("meet", rank, size, count, tuple(steps) if size > 1 else (),
                    meta={"pieces": pieces, "unit": unit, "blocks": tuple(blocks)})


def meet_schedules(size: int, count: int, pieces: int = 1, unit: int = 1) -> list[Schedule]:
    """Every rank's :func:`meet_schedule`."""
    return [meet_schedule(r, size, count, pieces, unit) for r in range(size)]


def meets_every_addend(scheds: list[Schedule]) -> None:
    """AssertionError unless, on every rank of ``scheds`` (every rank's schedule of one
    allreduce), each reduction takes the addends themselves, all at once: a range reduced
    in a step is reduced in no other step, receives one message from every other rank in
    that step, and each such message is, on its sender, a range no earlier receive wrote
    (the sender's own input). What the reproducible sum's op needs beyond what
    :func:`.verify.verify` proves (every position ends with every rank's contribution)."""
    for s in scheds:
        others = [q for q in range(s.size) if q != s.rank]
        reduced_before: list[tuple[int, int]] = []
        for i, step in enumerate(s.steps):
            reduced = [t for t in step.recvs if t.reduce]
            ranges = sorted({(t.lo, t.hi) for t in reduced})
            for lo, hi in ranges:
                senders = sorted(t.peer for t in reduced if (t.lo, t.hi) == (lo, hi))
                assert senders == others, (
                    f"rank {s.rank} step {i}: [{lo}, {hi}) reduced from ranks {senders}, "
                    f"not every other rank at once")
                assert not any(a < hi and lo < b for a, b in reduced_before), (
                    f"rank {s.rank} step {i}: [{lo}, {hi}) reduced again")
            reduced_before.extend(ranges)
            for t in step.sends:
                taken = any(r.reduce and r.peer == s.rank and (r.lo, r.hi) == (t.lo, t.hi)
                            for r in scheds[t.peer].steps[i].recvs)
                written = any(r.lo < t.hi and t.lo < r.hi
                              for st in s.steps[:i] for r in st.recvs)
                assert not (taken and written), (
                    f"rank {s.rank} step {i}: sends [{t.lo}, {t.hi}) to be reduced after "
                    f"receiving into it: not its own addends")
