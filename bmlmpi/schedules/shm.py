"""Shared-memory allreduce for the ranks of one node: copy in, reduce from the peers' segments,
copy out. MPI-free.

Sources: the shared-memory allreduce of "Designing a high-performance shared-memory
allreduce" (IJHPCA 2025, doi 10.1177/10943420251363423: each rank copies its input into a
node-shared buffer, reduces its own slice straight from every peer's buffer, the others copy
the reduced slices out), which Open MPI's XHC component and MPICH's release-gather
collectives also follow.

Algorithm. The N ranks of a node each own a segment of shared memory holding an image of
the buffer (:class:`~bmlmpi.schedules.types.ShmOp`). The buffer is cut into C chunks of
at least ``N · chunk_bytes`` bytes (cache-sized), at most :data:`MAX_CHUNKS`, each chunk into
N balanced slices, slice q
owned by rank q. For every chunk c three stages, as separate steps:

* P(c) publish: copy the chunk's slices owned by the others from the input into the own
  segment (a rank's own slice never goes there: it reduces it from its input);
* R(c) reduce: the own slice of chunk c = own input ``<op>`` the same range of every peer's
  segment, in one pass, written to the result and to the own segment; waits until every
  peer completed P(c);
* F(c) fetch: copy each peer's slice of chunk c from that peer's segment into the result;
  waits until that peer completed R(c).

The stages are pipelined over chunks, P(t), R(t−1), F(t−2) for t = 0, 1, …, so while one rank
reduces chunk c the others may still publish chunk c+1 or fetch chunk c−1, and each step works
on a cache-sized piece. Nothing but the waits (flags in shared memory) passes between ranks:
no message carries data. Steps: 3C (the stage steps that exist); for one rank one reduce step
(the input copied to the result, nothing when in place).

Cost per rank, B = buffer bytes: copy-in (N−1)/N·B read and written, the reduction N·B/N = B
read and 2B/N written (result and segment), copy-out (N−1)/N·B read and written; against a
message-passing allreduce there is no sender's copy into MPI's buffer, no receiver's copy
out and no second pass to reduce. The model (:mod:`bmlmpi.model.cost`) prices a step at
σ (synchronisation) + the bytes it copies · β_copy + the bytes it reduces · γ_shm, with the
constants :mod:`bmlmpi.calibrate` measures.

:func:`node_steps` builds the stages for any group of ranks and any assignment of ranges to
owners; the node tier of :mod:`bmlmpi.schedules.hierarchical` uses its reduce-scatter and
allgather halves around the messages between nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .types import (
    FETCH,
    PUBLISH,
    REDUCE,
    Schedule,
    ShmOp,
    Step,
    balanced_bounds,
    check_arguments,
    merged_ranges,
)

#: Bytes of one rank's slice of a chunk, at least (``BMLMPI_SHM_CHUNK`` overrides it).
DEFAULT_CHUNK_BYTES = 256 * 1024
#: At most this many chunks: every step costs a memory barrier, a flag and a wait (a few µs
#: in Python), and on a quiet 16-core node (Open MPI 4.1, N = 2) 2–4 chunks beat both one
#: chunk (no overlap between ranks) and many (64 MiB in 128 chunks of 256 KiB: 28.6 ms; in
#: 4 to 32 chunks: 19.6–22.3 ms).
MAX_CHUNKS = 4
#: The stage sequences of :func:`node_steps`.
STAGES = {"allreduce": ("P", "R", "F"), "reduce_scatter": ("P", "R"),
          "allgather": ("G", "F")}

Piece = tuple[int, int, int]  # (lo, hi, owner rank)


def chunk_count(count: int, itemsize: int, ranks: int, chunk_bytes: int,
                most: int = MAX_CHUNKS) -> int:
    """How many chunks a buffer of ``count`` elements is cut into: slices of at least
    ``chunk_bytes``, between one and ``most`` chunks."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return max(1, min(most, math.ceil(count * itemsize / (max(ranks, 1) * chunk_bytes))))


def node_steps(rank: int, members: Sequence[int], chunks: Sequence[Sequence[Piece]],
               stages: str, first: int = 0) -> list[Step]:
    """``rank``'s shared-memory steps over ``members`` (global ranks, ``rank`` among them)
    for ``chunks`` (each a list of (lo, hi, owner) pieces) and ``stages``: ``allreduce``
    (publish the input, reduce, fetch), ``reduce_scatter`` (publish the input, reduce into the
    result only) or ``allgather`` (publish the own pieces of the result, fetch the others').

    Every rank of ``members`` gets the same number of steps (the step indices are shared:
    the waits name them; ``first`` is the schedule step the first of them will be). A group
    of one rank publishes nothing (no one would read it)."""
    kinds = STAGES[stages]
    alone = len(members) == 1
    index: dict[tuple[str, int], int] = {}
    order: list[tuple[str, int]] = []
    nchunks = len(chunks)
    for t in range(nchunks + len(kinds) - 1):
        for d, kind in enumerate(kinds):
            c = t - d
            if 0 <= c < nchunks:
                index[(kind, c)] = first + len(order)
                order.append((kind, c))
    steps: list[Step] = []
    for kind, c in order:
        mine = [(lo, hi) for lo, hi, q in chunks[c] if q == rank and hi > lo]
        theirs = [(lo, hi, q) for lo, hi, q in chunks[c] if q != rank and hi > lo]
        ops: list[ShmOp] = []
        if kind == "P" and not alone:
            # one publish where the pieces of several owners touch
            ops = [ShmOp(PUBLISH, lo, hi)
                   for lo, hi in merged_ranges([(a, b) for a, b, _ in theirs])]
        elif kind == "G" and not alone:
            ops = [ShmOp(PUBLISH, lo, hi, source="result") for lo, hi in mine]
        elif kind == "R":
            peers = tuple(p for p in members if p != rank)
            after = tuple((p, index[("P", c)]) for p in peers)
            ops = [ShmOp(REDUCE, lo, hi, peers, after, publish=stages == "allreduce"
                         and not alone) for lo, hi in mine]
        elif kind == "F":
            ready = "R" if stages == "allreduce" else "G"
            ops = [ShmOp(FETCH, lo, hi, (q,), ((q, index[(ready, c)]),))
                   for lo, hi, q in theirs]
        steps.append(Step(shm=tuple(ops)))
    return steps


def slices(lo: int, hi: int, members: Sequence[int]) -> list[Piece]:
    """``[lo, hi)`` cut into one balanced slice per member, in member order."""
    b = balanced_bounds(lo, hi, len(members))
    return [(b[i], b[i + 1], q) for i, q in enumerate(members)]


def shm_schedule(rank: int, size: int, count: int, itemsize: int = 4,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_chunks: int = MAX_CHUNKS) -> Schedule:
    """Rank ``rank``'s shared-memory allreduce of ``count`` elements of ``itemsize`` bytes over
    ``size`` ranks of one node, in chunks of at least ``size · chunk_bytes`` bytes, at most
    ``max_chunks`` of them."""
    check_arguments(rank, size, count)
    members = list(range(size))
    steps: list[Step] = []
    if count and size == 1:  # nothing to share: the input is the result
        steps = [Step(shm=(ShmOp(REDUCE, 0, count),))]
    elif count:
        nchunks = chunk_count(count, itemsize, size, chunk_bytes, max_chunks)
        bounds = balanced_bounds(0, count, nchunks)
        chunks = [slices(bounds[c], bounds[c + 1], members) for c in range(nchunks)]
        steps = node_steps(rank, members, chunks, "allreduce")
    return Schedule("shm", rank, size, count, tuple(steps),
                    meta={"chunk_bytes": chunk_bytes})


def shm_schedules(size: int, count: int, itemsize: int = 4,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  max_chunks: int = MAX_CHUNKS) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model)."""
    return [shm_schedule(r, size, count, itemsize, chunk_bytes, max_chunks)
            for r in range(size)]


__all__ = ["DEFAULT_CHUNK_BYTES", "MAX_CHUNKS", "chunk_count", "node_steps", "shm_schedule",
           "shm_schedules", "slices"]
