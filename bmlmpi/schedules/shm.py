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

The rest of the family (:func:`shm_collective_schedule`), on the same three kinds of step,
each a pure schedule the verifier proves against its collective's contract:

* reduce-scatter (blocks of ``counts``, zeros allowed): the allreduce's P and R with the
  owner of block q reducing it into its result — no F. Per rank: copy-in of the others'
  blocks, the reduction reads N·B_r and writes B_r (B_r its own block's bytes).
* allgather(v): G(c) publishes the own block's piece c of the input and copies it into the
  result; F(c) fetches every other block's piece c from its owner's segment. Per rank: the
  own block copied twice, every other block copied once — no message, no intermediate hop.
* reduce (root ρ): the allreduce's P and R, every rank reducing its slice of each chunk, the
  non-roots into their segment only; F: the root alone fetches the reduced slices. The
  reduction is spread over all N ranks instead of N−1 inputs summed at the root.
* broadcast (root ρ): G(c): the root publishes chunk c of its buffer (chunks of at least
  ``chunk_bytes``, at most :data:`MAX_CHUNKS`); F(c): every other rank copies it out of the
  root's segment. One copy in, one copy out per reader, pipelined.

A rank must wait, in every call, for each peer that reads its segment (the two images
alternate by call); where its own reads give no such wait (a broadcast's root, the owner of
the only non-empty block) its first segment write waits until that peer has entered the
call (a wait on step −1, which costs nothing once the peer has left the previous call).

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
from dataclasses import replace

from .collectives import collective as collective_record
from .types import (
    FETCH,
    PUBLISH,
    REDUCE,
    Copy,
    Schedule,
    ShmOp,
    Step,
    balanced_bounds,
    block_offsets,
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
          "allgather": ("G", "F"), "reduce": ("P", "R", "F"), "gather": ("G", "F"),
          "collect": ("G", "F"), "scatter": ("G", "F")}

Piece = tuple[int, int, int]  # (lo, hi, owner rank)


def chunk_count(count: int, itemsize: int, ranks: int, chunk_bytes: int,
                most: int = MAX_CHUNKS) -> int:
    """How many chunks a buffer of ``count`` elements is cut into: slices of at least
    ``chunk_bytes``, between one and ``most`` chunks."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return max(1, min(most, math.ceil(count * itemsize / (max(ranks, 1) * chunk_bytes))))


def node_steps(rank: int, members: Sequence[int], chunks: Sequence[Sequence[Piece]],
               stages: str, first: int = 0, root: int | None = None,
               own_copy: bool = True) -> list[Step]:
    """``rank``'s shared-memory steps over ``members`` (global ranks, ``rank`` among them)
    for ``chunks`` (each a list of (lo, hi, owner) pieces) and ``stages``:

    * ``allreduce``: publish the input, reduce the own pieces (into the result and the
      segment), fetch the others';
    * ``reduce_scatter``: publish the input, reduce the own pieces into the result only;
    * ``reduce``: as ``allreduce``, but only ``root`` fetches, and the others reduce into
      their segment alone (they keep no result);
    * ``allgather``: publish the own pieces of the result, fetch the others';
    * ``gather``: publish the own pieces of the input (with ``own_copy`` also copied into the
      result: an allgather's own block; a broadcast's root has its input in its one buffer
      already), fetch the others';
    * ``collect``: every rank but ``root`` publishes its own pieces of the result, ``root``
      alone fetches them (hierarchical's reduce: the shards' owners hand their sums to the
      root);
    * ``scatter``: ``root`` publishes every piece another rank owns from its input, each
      owner fetches its own pieces (hierarchical's broadcast: the root hands each shard to
      its owner on its node).

    Every rank of ``members`` gets the same number of steps (the step indices are shared:
    the waits name them; ``first`` is the schedule step the first of them will be). A group
    of one rank publishes nothing (no one would read it). A rank waits, in every call, for
    every peer that reads its segment (what makes the two alternating buffer images safe):
    where its own reads do not already make it wait for such a peer, its first segment write
    waits until that peer has entered the call (step −1)."""
    kinds = STAGES[stages]
    if stages in ("reduce", "collect", "scatter") and root not in members:
        raise ValueError(f"{stages} within a node needs its root among {list(members)}")
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
    keeps = stages != "reduce" or rank == root          # writes its reduction to the result
    shares = not alone and _others_fetch_the_reduced(kinds, _fetchers(stages, members, rank,
                                                                       root))
    fetches = (rank == root if stages in ("reduce", "collect") else
               rank != root if stages == "scatter" else True)
    steps: list[Step] = []
    for kind, c in order:
        mine = [(lo, hi) for lo, hi, q in chunks[c] if q == rank and hi > lo]
        theirs = [(lo, hi, q) for lo, hi, q in chunks[c] if q != rank and hi > lo]
        ops: list[ShmOp] = []
        if kind == "P" and not alone:
            # one publish where the pieces of several owners touch
            ops = [ShmOp(PUBLISH, lo, hi)
                   for lo, hi in merged_ranges([(a, b) for a, b, _ in theirs])]
        elif kind == "G" and stages == "scatter":
            ops = [] if alone or rank != root else [
                ShmOp(PUBLISH, lo, hi) for lo, hi in merged_ranges([(a, b) for a, b, _ in theirs])]
        elif kind == "G":
            source = "result" if stages in ("allgather", "collect") else "input"
            ops = [] if alone or (stages == "collect" and rank == root) else [
                ShmOp(PUBLISH, lo, hi, source=source) for lo, hi in mine]
            if stages == "gather" and own_copy:
                ops += [ShmOp(REDUCE, lo, hi) for lo, hi in mine]
        elif kind == "R":
            peers = tuple(p for p in members if p != rank)
            after = tuple((p, index[("P", c)]) for p in peers)
            ops = [ShmOp(REDUCE, lo, hi, peers, after, publish=shares, to_result=keeps)
                   for lo, hi in mine]
        elif kind == "F" and fetches and stages == "scatter":
            ops = [ShmOp(FETCH, lo, hi, (root,), ((root, index[("G", c)]),))
                   for lo, hi in mine]
        elif kind == "F" and fetches:
            ready = "R" if "R" in kinds else "G"  # the reduced pieces, else the published
            ops = [ShmOp(FETCH, lo, hi, (q,), ((q, index[(ready, c)]),))
                   for lo, hi, q in theirs]
        steps.append(Step(shm=tuple(ops)))
    if not alone:
        _wait_for_readers(steps, _readers(rank, members, chunks, stages, root))
    return steps


def _fetchers(stages: str, members: Sequence[int], rank: int, root: int | None) -> set[int]:
    """The members other than ``rank`` whose F stage of ``stages`` fetches pieces."""
    return ({root} if stages in ("reduce", "collect") else set(members)) - {rank}


def _others_fetch_the_reduced(kinds: Sequence[str], fetchers: set[int]) -> bool:
    """Whether a rank's reduced pieces are fetched by other members (an R stage followed by
    an F stage that ``fetchers`` run), so that its R publishes them in its segment."""
    return "R" in kinds and "F" in kinds and bool(fetchers)


def _readers(rank: int, members: Sequence[int], chunks: Sequence[Sequence[Piece]],
             stages: str, root: int | None) -> set[int]:
    """The members that read ``rank``'s segment in :func:`node_steps`'s steps."""
    kinds = STAGES[stages]
    if stages == "scatter":  # the root's segment, read by the owners of the other pieces
        return {q for chunk in chunks for lo, hi, q in chunk
                if hi > lo and q != rank} if rank == root else set()
    fetchers = _fetchers(stages, members, rank, root)
    shares_own = "G" in kinds or _others_fetch_the_reduced(kinds, fetchers)
    out: set[int] = set()
    for chunk in chunks:
        for lo, hi, q in chunk:
            if hi <= lo:
                continue
            if q != rank and "P" in kinds:
                out.add(q)  # q reduces its piece from every peer's published input
            elif q == rank and shares_own:
                out |= fetchers
    return out


def _wait_for_readers(steps: list[Step], readers: set[int]) -> None:
    """Make the first op that writes the own segment wait (step −1: entered the call) for
    every reader the steps do not wait for otherwise."""
    waited = {p for st in steps for o in st.shm for p, _ in o.after}
    missing = tuple((p, -1) for p in sorted(readers - waited))
    if not missing:
        return
    for i, st in enumerate(steps):
        for j, o in enumerate(st.shm):
            if o.kind == PUBLISH or o.publish:
                ops = list(st.shm)
                ops[j] = replace(o, after=missing + o.after)
                steps[i] = Step(shm=tuple(ops))
                return
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


def block_chunks(counts: Sequence[int], members: Sequence[int], nchunks: int
                 ) -> list[list[Piece]]:
    """Blocks of ``counts`` elements laid end to end, block j owned by ``members[j]``, each
    cut into ``nchunks`` balanced pieces: chunk c holds piece c of every block."""
    off = block_offsets(counts)
    cuts = [balanced_bounds(off[j], off[j + 1], nchunks) for j in range(len(counts))]
    return [[(cut[c], cut[c + 1], members[j]) for j, cut in enumerate(cuts)]
            for c in range(nchunks)]


def shm_collective_schedule(collective: str, rank: int, size: int, count: int,
                            itemsize: int = 4, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                            root: int = 0, counts: Sequence[int] | None = None,
                            max_chunks: int = MAX_CHUNKS) -> Schedule:
    """Rank ``rank``'s shared-memory ``collective`` over ``size`` ranks of one node
    (:mod:`.collectives`' contracts; ``count`` elements of the work buffer, ``counts`` the
    blocks of a reduce-scatter or allgather, ``root`` of a reduce or broadcast):

    * ``reduce_scatter``: publish the other ranks' blocks of the input, reduce the own block
      from the input and every peer's segment into the result (P, R per chunk);
    * ``allgather``: publish the own block of the input and copy it into the result, fetch
      every other block from its owner's segment (G, F);
    * ``reduce``: the allreduce's P and R with the reduced slices kept in the segments, and
      the root alone fetching them (P, R, F);
    * ``bcast``: the root publishes its buffer, every other rank fetches it (G, F);
    * ``allreduce``: :func:`shm_schedule`.

    Chunks: pieces of at least ``chunk_bytes`` per rank (a broadcast's whole chunk is one
    piece), at most ``max_chunks`` of them, pipelined as the allreduce's."""
    coll = collective_record(collective)
    if coll.reduces and not (coll.rooted or coll.blocked):
        # every rank reduces the whole buffer: the allreduce's in-place steps
        return shm_schedule(rank, size, count, itemsize, chunk_bytes, max_chunks)
    check_arguments(rank, size, count)
    members = list(range(size))
    blocks = None
    if coll.blocked:
        even = balanced_bounds(0, count, size)
        blocks = (tuple(counts) if counts is not None else
                  tuple(even[j + 1] - even[j] for j in range(size)))
        if len(blocks) != size or sum(blocks) != count:
            raise ValueError(f"block counts {blocks} must be {size} counts summing to {count}")
    steps: list[Step] = []
    if count and not (collective == "bcast" and size == 1):
        if collective == "bcast":
            nchunks = chunk_count(count, itemsize, 1, chunk_bytes, max_chunks)
            bounds = balanced_bounds(0, count, nchunks)
            chunks = [[(bounds[c], bounds[c + 1], root)] for c in range(nchunks)]
            steps = node_steps(rank, members, chunks, "gather", own_copy=False)
        elif collective == "reduce":
            nchunks = chunk_count(count, itemsize, size, chunk_bytes, max_chunks)
            bounds = balanced_bounds(0, count, nchunks)
            chunks = [slices(bounds[c], bounds[c + 1], members) for c in range(nchunks)]
            steps = node_steps(rank, members, chunks, "reduce", root=root)
        else:
            nchunks = chunk_count(count, itemsize, size, chunk_bytes, max_chunks)
            chunks = block_chunks(blocks, members, nchunks)
            steps = node_steps(rank, members, chunks, "reduce_scatter" if collective ==
                               "reduce_scatter" else "gather")
    return Schedule("shm", rank, size, count, tuple(steps), meta={"chunk_bytes": chunk_bytes},
                    collective=collective, root=root if coll.rooted else 0, counts=blocks,
                    inputs=coll.plain_inputs(rank, count, root, blocks),
                    outputs=coll.plain_outputs(rank, count, root, blocks))


def alltoall_slots(size: int, pairs: Sequence[int]) -> list[int]:
    """The ``size + 1`` boundaries of an all-to-all's slots in :func:`shm_alltoall_schedule`'s
    work buffer: slot k holds every block that travels k ranks on (rank s's block for rank
    (s + k) mod size), as wide as the largest of them."""
    width = [max(pairs[s * size + (s + k) % size] for s in range(size)) for k in range(size)]
    return block_offsets(width)


def shm_alltoall_schedule(rank: int, size: int, pairs: Sequence[int], itemsize: int = 4,
                          chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                          max_chunks: int = MAX_CHUNKS) -> Schedule:
    """Rank ``rank``'s shared-memory all-to-all of the ``size × size`` pair matrix ``pairs``
    (row s: what rank s sends each rank) over ``size`` ranks of one node.

    Every block keeps one work position on both sides: the block of rank s for rank d lies in
    slot (d − s) mod size (:func:`alltoall_slots`), in s's segment and in d's result alike,
    and no two blocks of one row or of one column share a slot (a Latin square). The input
    copies put the row's blocks in their slots; per chunk c (piece c of every block) G(c)
    publishes this rank's pieces for the others and copies its own block's piece (slot 0)
    into the result, F(c) fetches the piece of every block for this rank from its sender's
    segment once the sender completed G(c); the output copies lay the column out. Each block
    is copied twice (into the sender's segment, out of it by its receiver), no message
    carries data; steps 2C, pipelined as the allreduce's (G(t), F(t − 1)). Memory: the work
    buffer and each segment hold one slot per distance, at most ``size`` times the largest
    block (the row's size for equal blocks)."""
    check_arguments(rank, size, 0)
    pairs = tuple(pairs)
    if len(pairs) != size * size or min(pairs, default=0) < 0:
        raise ValueError(f"pair counts {pairs} must be {size}x{size} = {size * size} "
                         f"counts >= 0")
    slot = alltoall_slots(size, pairs)
    count = slot[-1]
    row = pairs[rank * size:(rank + 1) * size]
    col = tuple(pairs[s * size + rank] for s in range(size))
    row_at, col_at = block_offsets(row), block_offsets(col)
    inputs = tuple(Copy(row_at[d], row_at[d + 1], slot[(d - rank) % size])
                   for d in range(size) if row[d])
    outputs = tuple(Copy(slot[(rank - s) % size], slot[(rank - s) % size] + col[s], col_at[s])
                    for s in range(size) if col[s])
    steps: list[Step] = []
    if count:
        nchunks = chunk_count(count, itemsize, size, chunk_bytes, max_chunks)

        # chunk c of a slot is the same range for the block this rank sends from it and
        # the block it receives into it: a chunk's input is read (G) before its result is
        # written (F), whatever the two blocks' sizes
        cuts = [balanced_bounds(slot[k], slot[k + 1], nchunks) for k in range(size)]

        def piece(n: int, k: int, c: int) -> tuple[int, int]:
            return cuts[k][c], min(cuts[k][c + 1], slot[k] + n)
        index: dict[tuple[str, int], int] = {}
        order: list[tuple[str, int]] = []
        for t in range(nchunks + 1):
            for kind, c in (("G", t), ("F", t - 1)):
                if 0 <= c < nchunks:
                    index[(kind, c)] = len(order)
                    order.append((kind, c))
        for kind, c in order:
            ops: list[ShmOp] = []
            if kind == "G":
                for d in range(size):
                    lo, hi = piece(row[d], (d - rank) % size, c)
                    if hi > lo:
                        ops.append(ShmOp(REDUCE, lo, hi) if d == rank else
                                   ShmOp(PUBLISH, lo, hi))
            else:
                for s in range(size):
                    lo, hi = piece(col[s], (rank - s) % size, c)
                    if hi > lo and s != rank:
                        ops.append(ShmOp(FETCH, lo, hi, (s,), ((s, index[("G", c)]),)))
            steps.append(Step(shm=tuple(ops)))
        _wait_for_readers(steps, {d for d in range(size) if d != rank and row[d]})
    return Schedule("shm", rank, size, count, tuple(steps), meta={"chunk_bytes": chunk_bytes},
                    collective="alltoall", counts=pairs, inputs=inputs, outputs=outputs)


def shm_schedules(size: int, count: int, itemsize: int = 4,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  max_chunks: int = MAX_CHUNKS) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model)."""
    return [shm_schedule(r, size, count, itemsize, chunk_bytes, max_chunks)
            for r in range(size)]


__all__ = ["DEFAULT_CHUNK_BYTES", "MAX_CHUNKS", "alltoall_slots", "block_chunks", "chunk_count",
           "node_steps", "shm_alltoall_schedule", "shm_collective_schedule", "shm_schedule",
           "shm_schedules", "slices"]
