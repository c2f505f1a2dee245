"""Binds a schedule to the MPI communicators its transfers run on.

The schedule itself comes from the algorithm records, :mod:`bmlmpi.schedules.algorithms`
(name → Schedule, MPI-free);
this module only decides, per transfer, which communicator carries it and the peer's rank
there. A transfer placed on a BCube link level (``level >= 0``: BML and its recovery) goes over
that level's communicator, made by ``Split`` with the digit as key, so the peer's rank there is
its digit on that level; every other transfer goes over the allreduce communicator itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpi4py import MPI

from .execute import Plan
from .schedules.types import Schedule
from .topology.bcube import BCube, Shape


def bind(sched: Schedule, comm: MPI.Comm, level_comms: Sequence[MPI.Comm],
         shape: Shape) -> Plan:
    """``sched`` compiled to run on ``comm`` and the BCube level communicators of ``shape``
    (level 0 first); without level communicators every transfer runs on ``comm``."""
    if not level_comms:
        return Plan.flat(sched, comm)
    cube = BCube(shape)

    def level_peer(level: int, peer: int) -> tuple[int, int]:
        if level < 0:
            return 0, peer
        return level + 1, cube.digit(peer, level)

    return Plan(sched, [comm, *level_comms], level_peer)
