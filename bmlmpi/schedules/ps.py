"""Peer-to-peer parameter server allreduce — the baseline of Wang et al., NeurIPS 2018, §2
("implement the logical parameter server in a P2P manner, i.e., every machine plays as both a
worker and a parameter server").

Algorithm. The buffer is cut into N balanced shards; rank j is the parameter server of shard j.

* Push (step 0): every rank sends shard j to rank j, for every j ≠ itself, and reduce-receives
  its own shard from all N − 1 others.
* Pull (step 1): every rank sends its reduced shard to all N − 1 others and copy-receives
  shard j from rank j.

A step never writes a range it sends: the push writes only the rank's own shard and sends only
the others; the pull the reverse.

Steps: 2 (none for N = 1). Each rank sends and receives 2·(N−1)/N·count elements — as ring or
BML — but in two steps of N − 1 messages each, all flat: on a one-NIC non-blocking Fat-Tree the
GST is 2(N−1)/N·T_F (the paper's Table II), and on BCube every transfer between servers that
differ in several digits is relayed, so it loads more links than BML's and aggregates nothing
on the way. Cost (α-β, one full-duplex port per rank): 2α + 2(N−1)/N·count·β, with N − 1
concurrent messages per step.
"""

from __future__ import annotations

from .types import Recv, Schedule, Step, Transfer, balanced_bounds, compact


def ps_schedule(rank: int, size: int, count: int) -> Schedule:
    """The P2P parameter-server schedule of ``rank`` for ``count`` elements over ``size``."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    if count < 0:
        raise ValueError(f"negative count {count}")
    if size == 1:
        return Schedule("ps", rank, size, count, (), streams=1)
    shards = balanced_bounds(0, count, size)
    own = (shards[rank], shards[rank + 1])
    # Visit peers starting after oneself, so the N senders of a step address N distinct
    # receivers at any position in the list (no hot spot if an executor serialises sends).
    peers = [(rank + d) % size for d in range(1, size)]
    push = Step(tuple(Transfer(j, shards[j], shards[j + 1]) for j in peers),
                tuple(Recv(j, *own, reduce=True) for j in peers))
    pull = Step(tuple(Transfer(j, *own) for j in peers),
                tuple(Recv(j, shards[j], shards[j + 1], reduce=False) for j in peers))
    return Schedule("ps", rank, size, count, compact([push, pull]), streams=1)


def ps_schedules(size: int, count: int) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model)."""
    return [ps_schedule(r, size, count) for r in range(size)]
