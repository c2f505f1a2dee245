"""Which schedule each algorithm name builds, and over which communicators it runs.

The one place that maps an algorithm name to its schedule function. ``build(name, ctx,
count, itemsize)`` returns the rank's Schedule, the communicators its transfers use and a
function mapping a transfer's (level, peer) to (communicator index, rank in that communicator).

Trees (``tree``, ``multitree``) are generated from the communicator's link-weight matrix
(:meth:`bmlmpi.Communicator.links`: ``BMLMPI_LINKS``, else MPI placement), once per
communicator, lazily: the multi-tree set costs seconds of CPU at 64 ranks, the single tree
milliseconds. Every rank derives the same trees from the same matrix without talking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mpi4py import MPI

from .schedules.bml import bml_schedule
from .schedules.hierarchical import hierarchical_schedule
from .schedules.ring import ring_schedule, ring_segments
from .schedules.tree import multitree_schedule, tree_schedule
from .schedules.types import Schedule
from .topology.bcube import BCube

if TYPE_CHECKING:
    from .api import Communicator

PeerMap = Callable[[int, int], tuple[int, int]]
Built = tuple[Schedule, list[MPI.Comm], PeerMap]


def _flat(level: int, peer: int) -> tuple[int, int]:
    return 0, peer


def _bml(ctx: Communicator, count: int, itemsize: int) -> Built:
    sched = bml_schedule(ctx.rank, ctx.size, count, ctx.shape)
    cube = BCube(ctx.shape)

    def level_peer(level: int, peer: int) -> tuple[int, int]:
        # level communicators are keyed by the digit, so a peer's rank there is its digit
        if level < 0:
            return 0, peer
        return level + 1, cube.digit(peer, level)

    return sched, [ctx.comm, *ctx.level_comms], level_peer


def _ring(ctx: Communicator, count: int, itemsize: int) -> Built:
    segments = ring_segments(count, itemsize, ctx.size)
    return ring_schedule(ctx.rank, ctx.size, count, segments), [ctx.comm], _flat


def _tree(ctx: Communicator, count: int, itemsize: int) -> Built:
    return tree_schedule(ctx.rank, ctx.size, count, ctx.tree()), [ctx.comm], _flat


def _multitree(ctx: Communicator, count: int, itemsize: int) -> Built:
    return multitree_schedule(ctx.rank, ctx.size, count, ctx.trees()), [ctx.comm], _flat


def _hierarchical(ctx: Communicator, count: int, itemsize: int) -> Built:
    # global peers on the flat communicator; levels only name the tier for the cost model
    return hierarchical_schedule(ctx.rank, ctx.size, count, ctx.nodes()), [ctx.comm], _flat


BUILDERS: dict[str, Callable[[Communicator, int, int], Built]] = {
    "bml": _bml,
    "ring": _ring,
    "tree": _tree,
    "multitree": _multitree,
    "hierarchical": _hierarchical,
}


def build(name: str, ctx: Communicator, count: int, itemsize: int) -> Built:
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} has no schedule") from None
    return builder(ctx, count, itemsize)
