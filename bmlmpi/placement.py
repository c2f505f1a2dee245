"""Where a communicator's ranks are: the link-weight matrix its trees are built on, which
ranks share a node, the node's shared-memory tier, and the BCube level communicators.

:class:`Placement` belongs to one :class:`~bmlmpi.api.Communicator` (its ``owner``) and reads
only the owner's public state (``comm``, ``size``, ``rank``, ``timeout``, ``links`` and
``nodes()``, which a variant may narrow to its current members), so that it follows the
owner across a repair or a membership change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .shm import NodeTier
from .topology.bcube import BCube, Shape
from .topology.links import links_from_env, links_from_placement
from .topology.nodes import Nodes, ranks_per_node_from_env, resolve_nodes


def split_levels(comm: MPI.Comm, shape: Shape, rank: int) -> list[MPI.Comm]:
    """One communicator per BCube level of ``shape``: the ranks sharing all digits but that
    level's (``Split`` with the digit as key, so member b of a group has rank b)."""
    cube = BCube(shape)
    levels = []
    for lv in range(cube.levels):
        c = comm.Split(cube.color(rank, lv), cube.digit(rank, lv))
        c.Set_errhandler(MPI.ERRORS_RETURN)
        levels.append(c)
    return levels


class Placement:
    """The owner's placement: where its link matrix and nodes come from, and its node tier
    (made on first use)."""

    def __init__(self, owner: Any, interrupt: Callable[[], None] | None = None):
        self.owner = owner
        #: raises once a notice says the owner's current call failed on another rank: the
        #: node tier's bounded set-up polls it (a refusing rank never joins that set-up)
        self.interrupt = interrupt
        self.ranks_per_node = ranks_per_node_from_env()
        self.placement: np.ndarray | None = None  # None: the link matrix is the placement
        self.tier: NodeTier | None = None

    def find_links(self) -> np.ndarray:
        """The link-weight matrix trees are built on: ``BMLMPI_LINKS``, else MPI placement.

        Also fixes where :meth:`nodes` comes from: ``BMLMPI_RANKS_PER_NODE``, else the
        placement matrix (the returned one, or a separate one when ``BMLMPI_LINKS`` names
        devices)."""
        owner = self.owner
        w = links_from_env()
        if w is None:
            return links_from_placement(owner.comm)
        if self.ranks_per_node is None:
            self.placement = links_from_placement(owner.comm)
        if w.shape != (owner.size, owner.size):
            raise ValueError(f"BMLMPI_LINKS describes {w.shape[0]} devices but the "
                             f"communicator has {owner.size} ranks")
        return w

    def nodes(self) -> Nodes:
        """Which ranks share a node: ``BMLMPI_RANKS_PER_NODE`` consecutive ranks when set at
        construction, else MPI placement."""
        owner = self.owner
        placement = owner.links if self.placement is None else self.placement
        return resolve_nodes(owner.size, placement, self.ranks_per_node)

    def nodes_for_auto(self) -> Nodes | None:
        """The owner's nodes, or None where they are unknown (a stale placement after
        failures: then ``auto`` considers no hierarchical algorithm)."""
        try:
            return self.owner.nodes()
        except ValueError:
            return None

    def node_tier(self) -> NodeTier:
        """This rank's node of the owner's current communicator (made on first use,
        collective; remade, the old one dropped without a collective, after the members
        changed)."""
        tier, comm = self.tier, self.owner.comm
        if tier is not None and tier.comm is comm:
            return tier
        if tier is not None:
            tier.abandon()
        tier = self.tier = NodeTier(comm, self.owner.nodes(), self.owner.timeout,
                                    self.interrupt)
        return tier

    def free(self, collective: bool = True) -> None:
        """Free the node tier: with its collective when it is on the owner's current
        communicator and ``collective`` (the owner was not revoked: after a deadline the
        others may have dropped their windows already), else dropped without one."""
        if self.tier is not None:
            if self.tier.comm is self.owner.comm and collective:
                self.tier.free()
            else:
                self.tier.abandon()
            self.tier = None
