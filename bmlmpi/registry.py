"""Which schedule each algorithm name builds, and over which communicators it runs.

The one place that maps an algorithm name to its schedule function. ``build(name, ctx,
count)`` returns the rank's Schedule, the communicators its transfers use and a function
mapping a transfer's (level, peer) to (communicator index, rank in that communicator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mpi4py import MPI

from .schedules.bml import bml_schedule
from .schedules.types import Schedule
from .topology.bcube import BCube

if TYPE_CHECKING:
    from .api import Communicator

PeerMap = Callable[[int, int], tuple[int, int]]


def _flat(level: int, peer: int) -> tuple[int, int]:
    return 0, peer


def _bml(ctx: Communicator, count: int) -> tuple[Schedule, list[MPI.Comm], PeerMap]:
    sched = bml_schedule(ctx.rank, ctx.size, count, ctx.shape)
    cube = BCube(ctx.shape)

    def level_peer(level: int, peer: int) -> tuple[int, int]:
        # level communicators are keyed by the digit, so a peer's rank there is its digit
        if level < 0:
            return 0, peer
        return level + 1, cube.digit(peer, level)

    return sched, [ctx.comm, *ctx.level_comms], level_peer


BUILDERS: dict[str, Callable[[Communicator, int], tuple[Schedule, list[MPI.Comm], PeerMap]]] = {
    "bml": _bml,
}


def build(name: str, ctx: Communicator, count: int) -> tuple[Schedule, list[MPI.Comm], PeerMap]:
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} has no schedule") from None
    return builder(ctx, count)
