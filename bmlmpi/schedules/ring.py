"""Bandwidth-optimal ring allreduce — Patarasuk and Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 69(2), 2009 — and its halves for the rest of
the family (Rabenseifner, "Optimization of collective reduction operations", ICCS 2004, for
the reduce; van de Geijn et al.'s scatter-allgather broadcast).

Algorithm. The buffer is cut into N balanced chunks (chunk c is ``balanced_bounds(0, count,
N)[c:c+2]``). Ranks form the ring r → r+1 (mod N).

* Reduce-scatter, steps k = 0..N−2: rank r sends chunk (r−k) mod N to r+1 and reduce-receives
  chunk (r−k−1) mod N from r−1. After N−1 steps rank r holds chunk (r+1) mod N fully reduced.
* Allgather, steps k = 0..N−2: rank r sends chunk (r+1−k) mod N to r+1 and copy-receives chunk
  (r−k) mod N from r−1.

The chunk sent and the chunk written in one step always differ (N ≥ 2), so no range is written
while it is being sent.

Segments. Every chunk is cut again into ``segments`` balanced sub-ranges, each a separate
message on its own ``stream`` (= segment index) in the same step: several messages per peer are
in flight at once, so a large chunk is not one huge transfer, and an executor may reduce a
segment as soon as it lands. Sender and receiver list the segments in the same order.
:func:`ring_segments` picks the number from the message size.

Pipelining (``pipeline = P > 1``, with one segment). Each reduce-scatter step is cut into P
successive steps, one piece of the chunk each (the allgather stays one step per round). The
executor gives a lane's steps the same scratch, so the piece received in one step is still in
the cache when it is reduced, where a whole chunk received at once (or P concurrent segments,
each with its own scratch) goes through memory twice more: once written by the receive, once
read by the reduction. Measured at N = 2 on the 2-core development VM, 64 MiB of float32,
bare mpi4py: 7.3–7.6 ms in pieces of 1–4 MiB against 9.1–13.4 ms unpiped
(``perf/profile/README.md``). :func:`ring_pipeline` picks P; the catalog uses it at N = 2.

The rest of the family on the same halves. Reduce-scatter
(:func:`ring_reduce_scatter_schedule`): the reduce-scatter half with chunk j = rank j's block
(MPI's layout, ``counts`` uneven or zero), rotated by one so that rank r ends with block r —
no permutation, only block r copied out into the recvbuf. Allgather
(:func:`ring_allgather_schedule`): the allgather half, rank r starting with block r (its
sendbuf copied into its place), N−1 steps. Reduce and broadcast
(:func:`ring_rooted_schedule`, the algorithm ``rabenseifner``): the reduce-scatter half, then
every rank's block to the root in one step (Rabenseifner's reduce), or the root's blocks to
every rank in one step, then the allgather half (van de Geijn's broadcast). Each half: N−1
steps, (N−1)/N·count per rank, (N−1)/N·T_F.

Steps: 2(N−1) (none for N = 1); with pipelining (N−1)·(P+1). Each rank sends and receives
2(N−1)/N·count elements, the lower bound for any allreduce in which every rank sends the same
amount. Cost (α-β, one full-duplex link per rank): 2(N−1)·(segments·α + count/N·β) —
segmenting buys concurrency for the price of α per extra message; pipelining costs
(N−1)·(P−1)·α more than one piece and saves memory traffic the α-β model does not see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from . import types
from .collectives import collective as collective_record
from .types import Recv, Schedule, Step, Transfer, balanced_bounds, block_offsets, check_arguments

#: Target bytes per ring segment in :func:`ring_segments`: large enough that each message
#: stays well above MPI eager limits (so α stays small relative to the payload), small enough
#: that a multi-megabyte chunk becomes several concurrent messages. Not tuned by measurement.
RING_SEGMENT_BYTES = 1 << 20
#: At most this many segments per chunk (messages per peer per step).
MAX_RING_SEGMENTS = 8
#: Target bytes per reduce-scatter piece when pipelining (:func:`ring_pipeline`): pieces of
#: 1–4 MiB were equally fast at N = 2 for 64 MiB (module docstring); 2 MiB stays in a
#: server's last-level cache beside the input it is reduced with.
RING_PIPELINE_BYTES = 2 << 20
#: At most this many pieces per chunk.
MAX_RING_PIPELINE = 64


def ring_segments(count: int, itemsize: int, size: int,
                  target_bytes: int = RING_SEGMENT_BYTES,
                  max_segments: int = MAX_RING_SEGMENTS) -> int:
    """Segments per chunk so that each is about ``target_bytes``: ⌈chunk bytes / target⌉,
    clamped to [1, ``max_segments``]; a chunk is ⌈count/size⌉ elements of ``itemsize`` bytes."""
    if count < 0 or itemsize <= 0 or size <= 0:
        raise ValueError(f"ring_segments needs count >= 0, itemsize > 0, size > 0; got "
                         f"{count}, {itemsize}, {size}")
    if target_bytes <= 0 or max_segments < 1:
        raise ValueError(f"need target_bytes > 0 and max_segments >= 1, got {target_bytes}, "
                         f"{max_segments}")
    chunk_bytes = math.ceil(count / size) * itemsize
    return max(1, min(max_segments, math.ceil(chunk_bytes / target_bytes)))


def ring_pipeline(count: int, itemsize: int, size: int,
                  target_bytes: int = RING_PIPELINE_BYTES,
                  max_pieces: int = MAX_RING_PIPELINE) -> int:
    """Reduce-scatter pieces per chunk so that each is about ``target_bytes``: ⌊chunk bytes /
    target⌋, clamped to [1, ``max_pieces``] (a chunk under twice the target stays whole)."""
    if count < 0 or itemsize <= 0 or size <= 0:
        raise ValueError(f"ring_pipeline needs count >= 0, itemsize > 0, size > 0; got "
                         f"{count}, {itemsize}, {size}")
    chunk_bytes = math.ceil(count / size) * itemsize
    return max(1, min(max_pieces, chunk_bytes // target_bytes))


def _ring_steps(rank: int, size: int, chunks: list[int], shift: int, reduce: bool,
                segments: int, pipeline: int) -> list[Step]:
    """The N−1 steps of one ring half over the chunks ``chunks`` (N+1 boundaries): in step k
    rank r sends chunk (r−k−shift) mod N to r+1 and receives chunk (r−k−1−shift) mod N from
    r−1, reducing or copying; reduce steps cut into ``pipeline`` pieces (module docstring)."""
    right, left = (rank + 1) % size, (rank - 1) % size

    def pieces(chunk: int) -> list[tuple[int, int, int]]:
        b = balanced_bounds(chunks[chunk], chunks[chunk + 1], segments)
        return [(b[j], b[j + 1], j) for j in range(segments)]

    steps = []
    for k in range(size - 1):
        out, into = (rank - k - shift) % size, (rank - k - 1 - shift) % size
        if reduce and pipeline > 1:  # one piece a step, every rank cutting both chunks alike
            bo = balanced_bounds(chunks[out], chunks[out + 1], pipeline)
            bi = balanced_bounds(chunks[into], chunks[into + 1], pipeline)
            steps += [Step((Transfer(right, bo[j], bo[j + 1]),),
                           (Recv(left, bi[j], bi[j + 1], reduce=True),))
                      for j in range(pipeline)]
            continue
        steps.append(Step(tuple(Transfer(right, lo, hi, stream=j) for lo, hi, j in pieces(out)),
                          tuple(Recv(left, lo, hi, stream=j, reduce=reduce)
                                for lo, hi, j in pieces(into))))
    return steps


def _check_pipeline(segments: int, pipeline: int) -> None:
    if pipeline < 1 or pipeline > 1 and segments > 1:
        raise ValueError(f"pipeline must be >= 1 and needs segments == 1, got pipeline="
                         f"{pipeline}, segments={segments}")


def ring_schedule(rank: int, size: int, count: int, segments: int = 1,
                  pipeline: int = 1) -> Schedule:
    """The ring schedule of ``rank`` for ``count`` elements over ``size`` ranks."""
    check_arguments(rank, size, count, segments)
    _check_pipeline(segments, pipeline)
    chunks = balanced_bounds(0, count, size)
    # the reduce-scatter leaves chunk r+1 on rank r, which the allgather sends first
    steps = (_ring_steps(rank, size, chunks, 0, True, segments, pipeline)
             + _ring_steps(rank, size, chunks, -1, False, segments, 1))
    return Schedule("ring", rank, size, count, types.compact(steps), streams=segments,
                    meta={"segments": segments, "pipeline": pipeline})


def ring_reduce_scatter_schedule(rank: int, size: int, counts: Sequence[int],
                                 segments: int = 1, pipeline: int = 1) -> Schedule:
    """Ring's reduce-scatter half as MPI's reduce-scatter: chunk j is rank j's block
    (``counts[j]`` elements, MPI's layout), and the rotation by one makes rank r finish with
    block r — no permutation and no copy beyond taking block r out of the work buffer."""
    check_arguments(rank, size, sum(counts), segments)
    _check_pipeline(segments, pipeline)
    chunks = _blocks(size, counts)
    steps = _ring_steps(rank, size, chunks, 1, True, segments, pipeline)
    return _family("reduce_scatter", rank, size, counts, steps, segments, pipeline)


def ring_allgather_schedule(rank: int, size: int, counts: Sequence[int],
                            segments: int = 1) -> Schedule:
    """Ring's allgather half as MPI's allgather(v): rank r starts with its block r (copied
    from its sendbuf into its place in the recvbuf) and passes blocks on, N−1 steps."""
    check_arguments(rank, size, sum(counts), segments)
    chunks = _blocks(size, counts)
    steps = _ring_steps(rank, size, chunks, 0, False, segments, 1)
    return _family("allgather", rank, size, counts, steps, segments, 1)


def ring_rooted_schedule(collective: str, rank: int, size: int, count: int, root: int,
                         segments: int = 1, pipeline: int = 1) -> Schedule:
    """The bandwidth-optimal reduce and broadcast for large messages (Rabenseifner's reduce,
    van de Geijn's broadcast), over ring's halves: a reduce (``collective="reduce"``) is the
    ring reduce-scatter leaving block r on rank r, then one step in which every rank sends
    its block to ``root``; a broadcast (``"bcast"``) is one step in which ``root`` sends
    block j to rank j, then the ring allgather. Blocks: ``count`` cut into N balanced ranges.

    Steps N (none for N = 1). The root receives (reduce) or sends (bcast) (N−1)/N·count in
    its one direct step, every rank (N−1)/N·count in the ring half: 2(N−1)/N·count·β in all,
    against ⌈log2 N⌉·count·β for a tree — the better choice from a few blocks per α.
    """
    check_arguments(rank, size, count, segments)
    _check_pipeline(segments, pipeline)
    if not 0 <= root < size:
        raise ValueError(f"root {root} outside [0, {size})")
    chunks = balanced_bounds(0, count, size)
    steps: list[Step] = []
    if size > 1:
        mine = (chunks[rank], chunks[rank + 1])
        others = [(j, chunks[j], chunks[j + 1]) for j in range(size) if j != root]
        if collective == "reduce":
            steps = _ring_steps(rank, size, chunks, 1, True, segments, pipeline)
            steps.append(Step((Transfer(root, *mine),) if rank != root else (),
                              tuple(Recv(j, lo, hi) for j, lo, hi in others)
                              if rank == root else ()))
        elif collective == "bcast":
            steps = [Step(tuple(Transfer(j, lo, hi) for j, lo, hi in others)
                          if rank == root else (),
                          (Recv(root, *mine),) if rank != root else ())]
            steps += _ring_steps(rank, size, chunks, 0, False, segments, 1)
        else:
            raise ValueError(f"ring's rooted schedules are reduce and bcast, not "
                             f"{collective!r}")
    coll = collective_record(collective)
    return Schedule("rabenseifner", rank, size, count, types.compact(steps), streams=segments,
                    meta={"segments": segments, "pipeline": pipeline},
                    collective=collective, root=root,
                    inputs=coll.plain_inputs(rank, count, root, None),
                    outputs=coll.plain_outputs(rank, count, root, None))


def _blocks(size: int, counts: Sequence[int]) -> list[int]:
    if len(counts) != size:
        raise ValueError(f"need {size} block counts, got {len(counts)}")
    return block_offsets(counts)


def _family(name: str, rank: int, size: int, counts: Sequence[int], steps: list[Step],
            segments: int, pipeline: int) -> Schedule:
    coll = collective_record(name)
    counts = tuple(counts)
    count = sum(counts)
    return Schedule("ring", rank, size, count, types.compact(steps), streams=segments,
                    meta={"segments": segments, "pipeline": pipeline}, collective=name,
                    counts=counts, inputs=coll.plain_inputs(rank, count, 0, counts),
                    outputs=coll.plain_outputs(rank, count, 0, counts))


def ring_schedules(size: int, count: int, segments: int = 1,
                   pipeline: int = 1) -> list[Schedule]:
    """Every rank's ring schedule (for the verifier and the cost model)."""
    return [ring_schedule(r, size, count, segments, pipeline) for r in range(size)]
