"""Compressed allreduce with error feedback: a compressor protocol, Timed Dataflow's filters
(TDF), top-k sparsification and 16-bit wire formats, as a layer around any bmlmpi algorithm.

* :mod:`.protocol` — what a compressor is (one class: what it drops, what ranks agree on),
  the shared error feedback, and spec strings (:func:`parse`).
* :mod:`.wire` — the 16-bit wire formats' use (registered in :mod:`bmlmpi.kernels.wire_formats`)
  and the overflow-safe power-of-two scale (G-LNP).
* :mod:`.filters` — G-SMP, G-RP and their TDF combination; 16-bit wires alone (MPI-free).
* :mod:`.topk` — top-k sparsification (Deep Gradient Compression; MPI-free).
* :mod:`.layer` — the compressed allreduce (``Communicator.Allreduce(..., compression=)``).
* :mod:`.sparse` — index/value allreduce over BCube levels or the ring.
* :mod:`.sharded` — reduce-scatter / update / P-SMP-filtered allgather (the pull side).
* :mod:`.engine` — the staged request that drives them inside Test/Wait.
* :mod:`.channel` — what a communicator keeps for its compressed calls (its ``compression``).
"""

from .filters import TDF, ReducedPrecision, bf16, fp16, random, tdf, threshold
from .protocol import Compressor, parse, register
from .sharded import ShardedStep
from .topk import TopK, topk

__all__ = ["TDF", "Compressor", "ReducedPrecision", "ShardedStep", "TopK", "bf16", "fp16",
           "parse", "random", "register", "tdf", "threshold", "topk"]
