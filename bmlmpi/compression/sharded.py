"""The pull side for allreduce: a sharded step whose parameter allgather is filtered by P-SMP,
with TDF's timed parameter storage (every rank keeps its older copy of unsent parameters).

Algorithm (one ``step(grad)``; the parameters are split in N balanced ranges, rank r owns
range r):

1. Reduce-scatter the gradients (MPI ``Ireduce_scatter``, SUM; ``bmlmpi.AVG`` divides by N):
   rank r receives the summed gradient of its range only.
2. Rank r applies ``update(grad_shard, master_shard)`` to its **master** copy of its range (the
   full-precision parameters only the owner holds: the parameter server's global storage).
3. P-SMP (TDF, Eq. 3): the owner publishes θ'_j unless |(θ'_j − θ_j)/θ_j| < φ'/(1 + d'·ln
   t), where θ_j is the value last published (what every replica holds; θ_j = 0 counts as
   changed unless θ'_j = 0). Unpublished changes stay in the master and accumulate until they
   pass the filter: nothing is lost (the paper's server drops them; we keep them, the same
   traffic and a master that never falls behind).
4. Allgather of the published (index, value) pairs: counts first (``Iallgather``, fixed size),
   then the pairs (``Iallgatherv`` sized from the counts: no rank can disagree about a size).
   Every rank writes them into its replica; the replica keeps the older value of every
   unpublished parameter (timed parameter storage: its version is the iteration of its last
   publication). When the pairs would outweigh the plain shards (more than itemsize/(4 +
   itemsize) of the parameters changed: decided from the agreed counts, so identically on every
   rank) the dense allgather of the whole shards runs instead.

With P-SMP off every parameter is published at every step and the replica equals a plain
allreduce followed by the same (elementwise) update, exactly where the sums are exact.

Cost against a plain allreduce + update: the reduce-scatter and the allgather move the same
bytes as a ring or BML allreduce, (N−1)/N of the array each way; the update runs on 1/N of the
parameters per rank (N× less update work), at the price of a master shard (1/N of the
parameters) and one small counts allgather (a latency α) per step. P-SMP replaces the
allgather's itemsize bytes per parameter by (4 + itemsize) per *published* parameter: it saves
when fewer than itemsize/(4 + itemsize) of them change (1/2 for float32, 2/3 for float64).
Replicas then compute with parameters up to one filter threshold (relative) out of date.

Source: Timed Dataflow (Sec. III-B timed parameter storage, III-D hybrid parameter filter); the
sharded step is ZeRO/"reduce-scatter, update, allgather" data parallelism.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..handles import Request
from ..ops import op_name
from ..schedules.types import balanced_bounds
from .engine import StagedRequest
from .sparse import INDEX, check_count, pack, unpack


def psmp_threshold(phi: float, d: float, t: int) -> float:
    """P-SMP's relative-change threshold at iteration ``t`` ≥ 1: φ' / (1 + d'·ln t)."""
    return phi / (1.0 + d * math.log(t))


def psmp_publishes(new: np.ndarray, old: np.ndarray, phi: float, d: float, t: int) -> np.ndarray:
    """Which parameters P-SMP sends: relative change |(new − old)/old| ≥ the threshold."""
    thr = psmp_threshold(phi, d, t)
    if thr <= 0:
        return np.ones(new.size, bool)    # nothing is below a zero threshold
    diff = np.abs(new - old)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(old != 0, diff / np.abs(old), np.where(diff != 0, np.inf, 0.0))
    return rel >= thr


Update = Callable[[np.ndarray, np.ndarray], None]


class ShardedStep:
    """Reduce-scatter, owner update, P-SMP-filtered allgather (module docstring).

    ``comm``: a :class:`bmlmpi.Communicator`. ``params``: the flat float parameter replica
    (updated in place by every step; the same initial values on every rank). ``update(grad,
    param)``: an elementwise optimizer step applied in place to a range (called with the
    owned range only). ``psmp``: (φ', d') or None (publish everything). ``op``: MPI.SUM or
    bmlmpi.AVG.
    """

    def __init__(self, comm: Any, params: np.ndarray, update: Update,
                 psmp: tuple[float, float] | None = None, op: Any = MPI.SUM):
        if not isinstance(params, np.ndarray) or params.ndim != 1 or params.dtype.kind != "f":
            raise ValueError("params must be a flat floating-point numpy array")
        if not params.flags.writeable or not params.flags.c_contiguous:
            raise ValueError("params must be writable and contiguous")
        if op_name(op) not in ("sum", "avg"):
            raise ValueError("the sharded step reduces with MPI.SUM or bmlmpi.AVG")
        if psmp is not None and (psmp[0] < 0 or psmp[1] < 0):
            raise ValueError(f"P-SMP needs phi >= 0 and d >= 0, got {psmp}")
        check_count(params.size)
        self.comm = comm
        self.params = params
        self.update = update
        self.psmp = psmp
        self.average = op_name(op) == "avg"
        self.bounds = balanced_bounds(0, params.size, comm.size)
        self.lo, self.hi = self.bounds[comm.rank], self.bounds[comm.rank + 1]
        self.master = params[self.lo:self.hi].copy()
        self.t = 0
        #: per step: (parameters published by all ranks, dense allgather or not)
        self.published: list[tuple[int, bool]] = []

    def step(self, grad: np.ndarray) -> None:
        """One training step on the summed ``grad`` (flat, the size of ``params``)."""
        self.start(grad).Wait()

    def start(self, grad: np.ndarray) -> Request:
        if not isinstance(grad, np.ndarray) or grad.shape != self.params.shape \
                or grad.dtype != self.params.dtype:
            raise ValueError(f"grad must be a {self.params.dtype} array of shape "
                             f"{self.params.shape}")
        return Request(StagedRequest(self._stages(np.ascontiguousarray(grad)),
                                     self.comm.timeout, "sharded step",
                                     queue=self.comm.compression.queue))

    def _stages(self, grad: np.ndarray):
        dup = self.comm.compression.comm
        size = self.comm.size
        counts = np.diff(self.bounds).astype(np.int64)
        shard = np.empty(self.hi - self.lo, grad.dtype)
        yield [dup.Ireduce_scatter(grad, shard, counts, MPI.SUM)]
        if self.average:
            shard /= grad.dtype.type(size)
        self.t += 1
        self.update(shard, self.master)
        old = self.params[self.lo:self.hi]
        send = (np.ones(shard.size, bool) if self.psmp is None else
                psmp_publishes(self.master, old, self.psmp[0], self.psmp[1], self.t))
        idx = np.flatnonzero(send) + self.lo
        mine = pack(idx, self.master[send])
        nbytes = np.empty(size, np.int64)
        yield [dup.Iallgather(np.array([mine.size], np.int64), nbytes)]
        pair = INDEX.itemsize + grad.dtype.itemsize
        published = int(nbytes.sum()) // pair
        dense = int(nbytes.sum()) >= self.params.nbytes
        if dense:
            displs = np.asarray(self.bounds[:-1], np.int64)
            yield [dup.Iallgatherv(self.master.copy(), [self.params, counts, displs,
                                                       MPI.Datatype.fromcode(grad.dtype.char)])]
            published = self.params.size
        else:
            got = np.empty(int(nbytes.sum()), np.uint8)
            displs = np.concatenate([[0], np.cumsum(nbytes)[:-1]])
            yield [dup.Iallgatherv(mine, [got, nbytes, displs, MPI.BYTE])]
            for r in range(size):
                i, v = unpack(got[displs[r]:displs[r] + nbytes[r]], grad.dtype)
                self.params[i] = v
        self.published.append((published, dense))


__all__ = ["ShardedStep", "psmp_publishes", "psmp_threshold"]
