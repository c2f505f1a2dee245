"""Bruck's all-to-all: ⌈log2 N⌉ rounds, each block relayed along the binary digits of its
distance, for small blocks.

Algorithm. The block from rank s to rank d has distance i = (d − s) mod N. In round
k = 0 … ⌈log2 N⌉ − 1 every rank sends to rank (r + 2^k) mod N, in one go, every block it
holds whose distance has bit k set, and receives the same from rank (r − 2^k) mod N: a block
moves 2^k ranks forward in each round whose bit its distance has, so after the last round it
has moved i ranks and sits at d. Each round has one partner each way for every rank, however
many blocks it carries. Layout by :mod:`.exchange`: the blocks received in round k land in
an area of their own, ordered by the rounds that move them next, so a round's blocks are a
few contiguous ranges (they stay several transfers to the one partner: at N = 64 the six
rounds carry their 32 blocks each in 1, 32, 24, 16, 10 and 6 transfers).

Steps: ⌈log2 N⌉. Each round moves the blocks whose distance has that bit: about N/2 blocks,
so each rank sends about ⌈log2 N⌉·N/2·b elements in all for equal blocks of b, against
(N − 1)·b for :mod:`.pairwise`. Cost (α-β): ⌈log2 N⌉·α + ⌈log2 N⌉·(N/2)·b·β (plus the
message overhead of each transfer) — fewer latencies, more bytes: cheaper than pairwise for
tiny blocks at many ranks, dearer for large ones. Memory: the part of the row not sent
straight from the input, plus every block relayed through the rank once (about
⌈log2 N⌉·N/2 blocks) and not landed straight in the output.

Source: Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient Algorithms for All-to-All
Communications in Multiport Message-Passing Systems", IEEE TPDS 8(11), 1997 (the index
algorithm with radix 2).
"""

from __future__ import annotations

import functools

from .exchange import Hop, exchange_schedules
from .types import Schedule


def bruck_rounds(size: int) -> int:
    """⌈log2 size⌉: the rounds Bruck's exchange takes on ``size`` ranks."""
    return (size - 1).bit_length()


@functools.lru_cache(maxsize=8)
def _all_ranks(size: int, pairs: tuple[int, ...]) -> tuple[Schedule, ...]:
    rounds = bruck_rounds(size)

    def route(s: int, d: int, piece: int) -> tuple[Hop, ...]:
        distance, holder, hops = (d - s) % size, s, []
        for k in range(rounds):
            if distance >> k & 1:
                holder = (holder + (1 << k)) % size
                hops.append(Hop(k, holder))
        return tuple(hops)
    return exchange_schedules("bruck", size, pairs, 1, route, rounds)


def bruck_schedule(rank: int, size: int, pairs: tuple[int, ...]) -> Schedule:
    """Rank ``rank``'s Bruck all-to-all of the ``size × size`` pair matrix ``pairs``."""
    return _all_ranks(size, tuple(pairs))[rank]


__all__ = ["bruck_rounds", "bruck_schedule"]
