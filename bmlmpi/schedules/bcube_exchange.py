"""All-to-all on a (mixed-radix) BCube, one address digit at a time, in k pipelines.

Algorithm. On BCube(n, k) (radices n_0 … n_{k−1}, N = Π n_l; any N through its prime
factors, as :mod:`.bml`) a server's level-l group is the n_l servers that differ from it in
digit l only, behind one level-l switch. The block from s to d reaches d by fixing one digit
per step: at the step of level l its holder sends it to the group member whose digit l is
d's (no message where the digits already agree). After a step over every level, each digit
is d's: the block has arrived, relayed through at most k − 1 servers (BCube is
server-centric: the servers relay).

Pipelines. Every block is cut into k balanced pieces; piece e visits the levels in the
rotated order e, e + 1, …, e + k − 1 (mod k), as BML's pipeline e does, on stream e. In step
w pipeline e works on level (e + w) mod k, so each step keeps all k levels busy, each with
one pipeline: on BCube hardware all k NICs of a server carry a phase at once. Without the
pipelines (``pipelines=1``) step w uses level w alone and k − 1 NICs idle. The pieces cost
transfers: a piece is a transfer of its own wherever its neighbours in the layout of
:mod:`.exchange` are not contiguous with it on both sides (at N = 64, BCube(2,6), equal
blocks: 666 transfers per server over the 6 steps, against 88 with one pipeline), so small
blocks are better served by :mod:`.bruck`.

Steps: k. At level l a server sends the pieces whose destination digit l differs from its
own: (n_l − 1)/n_l of what it holds, to n_l − 1 group members. For equal blocks of b elements
each server holds N·b elements of each pipeline's pieces throughout, so step w moves
(n_l − 1)/n_l · N·b/k elements over the level-l NIC of each pipeline. Cost (α-β, one NIC per
level, equal radices n): k·α + (n − 1)/n · N·b·β — against (N − 1)·b·β for any all-to-all
through one NIC (a Fat-Tree server: every block but its own must cross it); BCube(3,2):
6·b against 8·b. The transfers carry ``level=l``: the executor sends them on the level-l
digit communicator, the cost model routes them over level-l links. Memory: the part of the
row not sent straight from the input, plus every piece relayed through the server once (up
to k − 1 hops each).

Source: Guo et al., "BCube: A High Performance, Server-centric Network Architecture for
Modular Data Centers", SIGCOMM 2009 (all-to-all by correcting one digit per step, with all
of a server's ports in use at once); the rotated pipelines are BML's (Wang et al., NeurIPS
2018).
"""

from __future__ import annotations

import functools

from ..topology.bcube import BCube
from .exchange import Hop, exchange_schedules
from .types import Schedule


@functools.lru_cache(maxsize=8)
def _all_ranks(size: int, pairs: tuple[int, ...], radices: tuple[int, ...],
               pipelines: int) -> tuple[Schedule, ...]:
    cube = BCube(radices)
    levels = cube.levels

    def route(s: int, d: int, piece: int) -> tuple[Hop, ...]:
        holder, hops = s, []
        for w in range(levels):
            level = (piece + w) % levels
            want = cube.digit(d, level)
            if cube.digit(holder, level) != want:
                holder = cube.with_digit(holder, level, want)
                hops.append(Hop(w, holder, level, piece))
        return tuple(hops)
    return exchange_schedules("bcube", size, pairs, pipelines, route, levels,
                              streams=pipelines)


def bcube_pipelines(radices: tuple[int, ...], pipelines: int | None) -> int:
    """The pipelines to run: one per level by default (``None``), at most one per level."""
    levels = max(len(radices), 1)
    if pipelines is None:
        return levels
    if pipelines < 1:
        raise ValueError(f"pipelines must be >= 1, got {pipelines}")
    return min(pipelines, levels)


def bcube_exchange_schedule(rank: int, size: int, pairs: tuple[int, ...],
                            radices: tuple[int, ...], pipelines: int | None = None) -> Schedule:
    """Rank ``rank``'s BCube all-to-all of the ``size × size`` pair matrix ``pairs`` on the
    BCube of ``radices`` (level 0 first), in ``pipelines`` rotated pipelines (one per level
    by default)."""
    cube = BCube(tuple(radices))
    if cube.size != size:
        raise ValueError(f"BCube {radices} has {cube.size} servers, not {size}")
    return _all_ranks(size, tuple(pairs), tuple(radices),
                      bcube_pipelines(tuple(radices), pipelines))[rank]


__all__ = ["bcube_exchange_schedule", "bcube_pipelines"]
