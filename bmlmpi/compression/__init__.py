"""Compressed allreduce with error feedback: Timed Dataflow's filters (TDF) and 16-bit
wire formats, as a layer around any bmlmpi algorithm.

* :mod:`.wire` — fp16/bf16 codecs and the overflow-safe power-of-two scale (G-LNP).
* :mod:`.filters` — G-SMP, G-RP, their TDF combination, error feedback (MPI-free).
* :mod:`.layer` — the compressed allreduce (``Communicator.Allreduce(..., compression=)``).
* :mod:`.sparse` — index/value allreduce over BCube levels or the ring.
* :mod:`.sharded` — reduce-scatter / update / P-SMP-filtered allgather (the pull side).
* :mod:`.engine` — the staged request that drives them inside Test/Wait.
* :mod:`.channel` — what a communicator keeps for its compressed calls (its ``compression``).
"""

from .filters import Compressor, bf16, fp16, parse, random, tdf, threshold
from .sharded import ShardedStep

__all__ = ["Compressor", "ShardedStep", "bf16", "fp16", "parse", "random", "tdf", "threshold"]
