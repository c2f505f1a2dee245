"""A toy collective, added as docs/architecture.md ("Adding a collective") says: one record,
one prepare function and its schedule builder, registered from here alone.

``reverse``: rank r receives rank ``size - 1 - r``'s block (a rank in the middle of an odd
count receives its own). Every rank knows every block's count (``counts``, as an
``Allgatherv``'s receive counts); rank r sends ``counts[r]`` elements and receives
``counts[size - 1 - r]``. Its one algorithm, ``toyrev``, is one step: each rank sends its
block straight to its partner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bmlmpi.calls import CollectiveCall
from bmlmpi.schedules import algorithms, collectives
from bmlmpi.schedules.algorithms import Algorithm, Context
from bmlmpi.schedules.collectives import Collective, Region
from bmlmpi.schedules.types import Copy, Recv, Schedule, Step, Transfer, block_offsets

NAME = "reverse"
ALGORITHM = "toyrev"


def partner(rank: int, size: int) -> int:
    return size - 1 - rank


@dataclass(frozen=True)
class Reverse(Collective):
    """The contract: the work buffer holds every rank's block in rank order (``counts``,
    as an allgather's); rank r's input is its own block, its output its partner's."""

    def input_size(self, rank: int, count: int, root: int,
                   counts: Sequence[int] | None) -> int:
        return counts[rank]

    def output_size(self, rank: int, count: int, root: int,
                    counts: Sequence[int] | None) -> int:
        return counts[partner(rank, len(counts))]

    def plain_inputs(self, rank: int, count: int, root: int,
                     counts: Sequence[int] | None) -> tuple[Copy, ...]:
        at = block_offsets(counts)[rank]
        return (Copy(0, counts[rank], at),) if counts[rank] else ()

    def plain_outputs(self, rank: int, count: int, root: int,
                      counts: Sequence[int] | None) -> tuple[Copy, ...]:
        p = partner(rank, len(counts))
        at = block_offsets(counts)[p]
        return (Copy(at, at + counts[p], 0),) if counts[p] else ()

    def regions(self, rank: int, live: Sequence[int], count: int, root: int,
                counts: Sequence[int] | None) -> list[Region]:
        p = partner(rank, len(counts))
        if p not in live:
            raise ValueError(f"reverse: rank {rank}'s partner {p} takes no part")
        return [(0, counts[p], (p,), 0)] if counts[p] else []


RECORD = Reverse(NAME, reduces=False, rooted=False, blocked=True, tag_kind=6)


def build(ctx: Context) -> Schedule:
    """``toyrev``: one step, each rank's block straight to its partner."""
    counts = ctx.blocks()
    off = block_offsets(counts)
    r, p = ctx.rank, partner(ctx.rank, ctx.size)
    sends = (Transfer(p, off[r], off[r + 1]),) if p != r and counts[r] else ()
    recvs = (Recv(p, off[p], off[p + 1]),) if p != r and counts[p] else ()
    return Schedule(ALGORITHM, r, ctx.size, ctx.count, (Step(sends, recvs),),
                    collective=NAME, counts=counts,
                    inputs=RECORD.plain_inputs(r, ctx.count, 0, counts),
                    outputs=RECORD.plain_outputs(r, ctx.count, 0, counts))


TOY = Algorithm(ALGORITHM, {NAME: build})


def prepare_reverse(rank: int, size: int, sendbuf: Any, recvbuf: Any,
                    algorithm: str) -> CollectiveCall:
    """A reverse's arguments (numpy arrays of one dtype, ``sendbuf`` of this rank's block;
    ``recvbuf`` at least as long as its partner's, every rank's block the same size) checked
    on ``rank`` of ``size``, as its call record."""
    if not isinstance(sendbuf, np.ndarray) or not isinstance(recvbuf, np.ndarray):
        raise TypeError("reverse takes numpy arrays")
    if sendbuf.dtype != recvbuf.dtype:
        raise TypeError(f"sendbuf dtype {sendbuf.dtype} differs from recvbuf's {recvbuf.dtype}")
    if not recvbuf.flags.writeable or not recvbuf.flags.c_contiguous:
        raise ValueError("recvbuf must be a writeable contiguous array")
    n = sendbuf.size
    if recvbuf.size < n:
        raise ValueError(f"recvbuf holds {recvbuf.size} elements, fewer than the {n} received")
    src = np.ascontiguousarray(sendbuf).reshape(-1)
    out = recvbuf.reshape(-1)[:n]
    return CollectiveCall(NAME, "Reverse", algorithm, algorithm, "sum", (n,) * size, 0, rank,
                          size, src, out, None)


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The toy collective and its algorithm registered for the block's duration."""
    collectives.register(RECORD)
    algorithms.register(TOY)
    try:
        yield
    finally:
        algorithms.unregister(ALGORITHM)
        collectives.unregister(NAME)


def builder(comm: Any, sendbuf: Any, recvbuf: Any) -> Any:
    """The prepare step bound to a call's arguments on ``comm``, given the algorithm: what
    the pipeline's entry for a collective (``comm.family``'s ``blocking``, ``start`` and
    ``init``) is handed."""
    return lambda alg: prepare_reverse(comm.rank, comm.size, sendbuf, recvbuf, alg)
