"""Pairwise exchange all-to-all: N − 1 rounds, one partner each way per round.

Algorithm. In round k = 1 … N − 1, rank r sends its block for rank (r + k) mod N straight to
that rank and receives the block of rank (r − k) mod N; its own block goes from its input to
its output without a message. Every block takes one hop, so nothing is relayed and no byte
crosses the network twice. The rotation gives every rank one send and one receive per round
(a permutation: no rank receives two messages in one round). Layout by
:mod:`.exchange`: nothing is relayed, so every block is sent straight from the sender's
input and received straight into its place in the receiver's output, and the own block is
one copy from input to output; there is no work buffer (in place, the executor first
copies aside the blocks that a receive would overwrite before they are sent: those sent in
the later half of the rounds).

Steps: N − 1. Each rank sends its row and receives its column, each element once:
(N − 1)·b elements each way for equal blocks of b. Cost (α-β, one port per rank):
(N − 1)·(α + b·β) — latency linear in N, so it suits blocks large enough that b·β dominates
α; for tiny blocks :mod:`.bruck`'s ⌈log2 N⌉ rounds are cheaper. Memory: none beyond the
user's buffers (in place, the blocks copied aside, up to half the row).

Source: the pairwise-exchange all-to-all of MPI libraries (Open MPI's ``tuned`` component,
MPICH's long-message algorithm), Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005.
"""

from __future__ import annotations

import functools

from .exchange import Hop, exchange_schedules
from .types import Schedule


@functools.lru_cache(maxsize=8)
def _all_ranks(size: int, pairs: tuple[int, ...]) -> tuple[Schedule, ...]:
    def route(s: int, d: int, piece: int) -> tuple[Hop, ...]:
        return () if s == d else (Hop((d - s) % size - 1, d),)
    return exchange_schedules("pairwise", size, pairs, 1, route, max(size - 1, 0))


def pairwise_schedule(rank: int, size: int, pairs: tuple[int, ...]) -> Schedule:
    """Rank ``rank``'s pairwise all-to-all of the ``size × size`` pair matrix ``pairs``."""
    return _all_ranks(size, tuple(pairs))[rank]


__all__ = ["pairwise_schedule"]
