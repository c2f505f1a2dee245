"""Sparse allreduce of filtered gradients: index/value pairs over BCube levels or a ring.

Algorithm. Each rank holds a set of (index, value) pairs (its kept elements).

* ``bml`` (and every algorithm other than ring): the BCube levels, level 0 first. At level l
  the n_l members of a level group exchange their current sets point to point (first their
  pair counts, then the pairs) and every member merges them, member 0 first: the same sums
  in the same order on every member. After the k levels every rank holds the sum over all
  ranks (each rank's set entered once through each level, like BML's reduce-scatter without
  the scatter). Step count k; bytes per rank at level
  l ≤ (n_l − 1)·min(count, K·∏_{j<l} n_j)·(4 + itemsize), K the largest kept count (the sets
  fill in as they merge).
* ``ring``: N − 1 steps around the ring; each step sends the set received in the step before
  (first its byte count, then the pairs), so after N − 1 steps every rank has all N sets and
  sums them in rank order. Bytes per rank: (N − 1)·K·(4 + itemsize) at most; 2(N − 1) messages.

Agreement without a hang: message sizes are data-dependent, so every exchange sends its counts
first (a fixed-size message) and sizes the payload receive from it; the pattern itself (who
exchanges with whom, in which order) is a schedule fixed by N and the BCube shape. Whether to
go sparse at all is decided from the agreed maximum kept count (the compression layer's one
small allreduce), so every rank takes the same path.

Dense or sparse: :func:`sparse_seconds` prices the exchange above with the α-β parameters of
the machine (the communicator's calibration, else defaults) plus the merge's cost per pair
(measured, :data:`MERGE_SECONDS_PER_PAIR`); the dense allreduce is priced by the cost model
(:func:`bmlmpi.model.estimate`). The layer goes sparse when that is cheaper;
``perf/compression/bench.py`` measures both paths at several densities to check the choice.

16-bit wire formats: the pairs carry the 16-bit codes of the wire-rounded values and the
levels forward every rank's pairs unsummed (:func:`concatenate`; at level l a rank sends
∏_{j<l} n_j·K pairs, which the price above already assumes), and the layer decodes and
sums them once at the end: rounding a partial sum to 16 bits on the way would lose exactness.

Exactness: the merge adds values in float64 (``np.bincount``) in a fixed order; every rank
computes the identical result. It equals the dense allreduce of the same kept elements up to
floating-point association (exactly, where sums are exact: integers, small-integer floats).

Source: GRACE (sparsifiers need an allgather of index/value pairs); BCube levels as in BML
(Wang et al., NeurIPS 2018); the exchange-counts-first discipline of MPI's v-collectives.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .engine import TAG_SPAN

INDEX = np.dtype(np.int32)


def pack(idx: np.ndarray, val: np.ndarray) -> np.ndarray:
    """Pairs as one byte buffer: the int32 indices, then the values."""
    return np.concatenate([idx.astype(INDEX).view(np.uint8), val.view(np.uint8)])


def unpack(buf: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    n = buf.size // (INDEX.itemsize + dtype.itemsize)
    cut = n * INDEX.itemsize
    return buf[:cut].view(INDEX), buf[cut:cut + n * dtype.itemsize].view(dtype)


def merge(sets: Sequence[tuple[np.ndarray, np.ndarray]], dtype: np.dtype
          ) -> tuple[np.ndarray, np.ndarray]:
    """Sum the sets into one (sorted indices); values added in the order of ``sets``."""
    if not sets:
        return np.empty(0, INDEX), np.empty(0, dtype)
    idx = np.concatenate([s[0] for s in sets])
    val = np.concatenate([s[1] for s in sets])
    uniq, inv = np.unique(idx, return_inverse=True)
    # bincount adds the weights in order of occurrence (set 0 first), in float64: the same
    # order on every rank, and exact for float64 and for sums of a few float32 values
    out = np.bincount(inv, weights=val, minlength=uniq.size).astype(dtype)
    return uniq.astype(INDEX), out


def concatenate(sets: Sequence[tuple[np.ndarray, np.ndarray]], dtype: np.dtype
                ) -> tuple[np.ndarray, np.ndarray]:
    """The sets side by side, unsummed, in the order of ``sets`` (an index may repeat): how
    16-bit wire codes travel, so that no partial sum is rounded to 16 bits on the way."""
    if not sets:
        return np.empty(0, INDEX), np.empty(0, dtype)
    return (np.concatenate([s[0].astype(INDEX, copy=False) for s in sets]),
            np.concatenate([s[1] for s in sets]))


#: seconds per pair merged (sort + add): 0.4 M pairs merged in 44 ms with numpy on the loaded
#: 2-core development machine (``merge`` of 4 sets of 100,000); the dense path has no such term
MERGE_SECONDS_PER_PAIR = 1.1e-7


def sparse_seconds(kept: int, count: int, itemsize: int, radices: Sequence[int] | None,
                   size: int, alpha: float, beta: float,
                   merge_s: float = MERGE_SECONDS_PER_PAIR) -> float:
    """Modelled seconds of the sparse exchange (``radices`` for BCube levels, None: ring):
    α per message round, β per byte of pairs sent, ``merge_s`` per pair merged."""
    pair = INDEX.itemsize + itemsize
    if size <= 1:
        return 0.0
    if radices is None:
        k = min(kept, count)
        return (size - 1) * (2 * alpha + k * pair * beta) + size * k * merge_s
    t, grown = 0.0, kept
    for n in radices:
        # a counts exchange and a payload exchange per level, then the merge of n sets
        k = min(count, grown)
        t += 2 * alpha + (n - 1) * k * pair * beta + n * k * merge_s
        grown *= n
    return t


def check_count(count: int) -> None:
    if count >= 2 ** 31:
        raise ValueError(f"the sparse allreduce indexes with int32: {count} elements is too many")


def level_members(levels: Sequence[MPI.Comm], comm: MPI.Comm) -> list[list[int]]:
    """For each level, the ranks in ``comm`` of this rank's level group, by member index."""
    whole = comm.Get_group()
    out = []
    for lc in levels:
        out.append(list(MPI.Group.Translate_ranks(lc.Get_group(), list(range(lc.Get_size())),
                                                  whole)))
    whole.Free()
    return out


def levels_exchange(members: Sequence[Sequence[int]], comm: MPI.Comm, tag: int,
                    idx: np.ndarray, val: np.ndarray, result: list,
                    stats: list, combine: Any = merge) -> Generator[list, None, None]:
    """Allgather-and-merge over the BCube level groups (``members``: each level's group as
    ranks of ``comm``), point to point on ``comm``: per level, counts to every member, then the
    pairs. ``result`` receives the summed (indices, values) (``combine``: :func:`merge`, or
    :func:`concatenate` to carry every rank's pairs unsummed); ``stats[0]`` adds the bytes
    this rank sends."""
    dtype = val.dtype
    me = comm.Get_rank()
    for lv, group in enumerate(members):
        n = len(group)
        if n == 1:
            continue
        mine = pack(idx, val)
        peers = [p for p in group if p != me]
        counts = {p: np.empty(1, np.int64) for p in peers}
        head = np.array([mine.size], np.int64)
        yield ([comm.Irecv(counts[p], p, tag + 2 * lv) for p in peers] +
               [comm.Isend(head, p, tag + 2 * lv) for p in peers])
        got = {p: np.empty(int(counts[p][0]), np.uint8) for p in peers}
        yield ([comm.Irecv(got[p], p, tag + 2 * lv + 1) for p in peers] +
               [comm.Isend(mine, p, tag + 2 * lv + 1) for p in peers])
        stats[0] += len(peers) * (mine.size + 8)
        sets = [(idx, val) if p == me else unpack(got[p], dtype) for p in group]
        idx, val = combine(sets, dtype)
    result.append((idx, val))


def ring_exchange(comm: MPI.Comm, tag: int, idx: np.ndarray, val: np.ndarray,
                  result: list, stats: list, combine: Any = merge
                  ) -> Generator[list, None, None]:
    """Ring allgather of the sets (counts first each step), then ``combine`` (:func:`merge`
    or :func:`concatenate`) in rank order."""
    dtype = val.dtype
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % size, (rank - 1) % size
    sets: list[Any] = [None] * size
    sets[rank] = (idx.astype(INDEX), val)
    cur = pack(idx, val)
    for s in range(size - 1):
        # the tags fold into the call's span: steps run one after another, and messages of
        # one sender and tag arrive in order, so a reused tag cannot be mismatched
        t = tag + (2 * s) % TAG_SPAN
        nbytes = np.empty(1, np.int64)
        yield [comm.Isend(np.array([cur.size], np.int64), right, t),
               comm.Irecv(nbytes, left, t)]
        got = np.empty(int(nbytes[0]), np.uint8)
        stats[0] += cur.size + 8
        yield [comm.Isend(cur, right, t + 1), comm.Irecv(got, left, t + 1)]
        sets[(rank - 1 - s) % size] = unpack(got, dtype)
        cur = got
    result.append(combine(sets, dtype))


__all__ = ["concatenate", "level_members", "levels_exchange", "merge", "pack", "ring_exchange",
           "sparse_seconds", "unpack"]
