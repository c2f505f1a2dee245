"""Which ranks share a node (a server, a machine), MPI-free.

A :class:`Nodes` is a partition of the ranks ``0..size-1`` into nodes. Each node lists its
ranks in ascending order; a rank's *local rank* is its index there. Nodes are ordered by their
lowest rank, so every rank derives the same numbering from the same input without talking.

Where the partition comes from (:func:`resolve_nodes`, in this order):

1. ``BMLMPI_RANKS_PER_NODE=r`` (or an explicit ``ranks_per_node``): pretend nodes of ``r``
   consecutive ranks — ranks 0..r-1 are node 0, r..2r-1 node 1, and so on — so that
   hierarchical schedules can be run and tested on one machine. When ``r`` does not divide
   the number of ranks, the last node holds the remainder (an unequal node).
2. A placement link matrix (:func:`bmlmpi.topology.links.links_from_placement`: weight 2
   between ranks on the same node, 1 between nodes): the classes of weight-2 links are the
   nodes. The matrix is what the Communicator already computes from
   ``MPI.COMM_TYPE_SHARED`` for its trees, so no further collective is needed.

Unequal nodes (real clusters where MPI placed different counts on different servers, or a
pretended partition that does not divide the size) are accepted: the hierarchical schedule
cuts the buffer into as many shards as the largest node has ranks and lets a rank of a smaller
node own several shards (:mod:`bmlmpi.schedules.hierarchical`). The fault-tolerant
communicator relies on that: after a failure it keeps every survivor on its original node
(:meth:`Nodes.restrict`), so a node that lost a rank becomes a smaller one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config

#: The environment variable that pretends nodes of that many consecutive ranks.
RANKS_PER_NODE_ENV = "BMLMPI_RANKS_PER_NODE"
#: The weight :func:`~bmlmpi.topology.links.links_from_placement` gives ranks on one node.
PLACEMENT_SAME_NODE = 2.0


@dataclass(frozen=True)
class Nodes:
    """A partition of ranks into nodes; ``members[g]`` holds node g's ranks, ascending."""

    members: tuple[tuple[int, ...], ...]
    #: the node of each rank, and each rank's place on its node (derived from ``members``)
    _node_of: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _local: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        members = tuple(tuple(int(r) for r in node) for node in self.members)
        if not members or any(not node for node in members):
            raise ValueError(f"nodes must be non-empty and hold at least one rank: {members}")
        flat = sorted(r for node in members for r in node)
        if flat != list(range(len(flat))):
            raise ValueError(f"nodes {members} are not a partition of the ranks "
                             f"0..{len(flat) - 1}")
        members = tuple(sorted((tuple(sorted(node)) for node in members), key=lambda n: n[0]))
        object.__setattr__(self, "members", members)
        node_of = [0] * len(flat)
        local = [0] * len(flat)
        for g, node in enumerate(members):
            for i, r in enumerate(node):
                node_of[r], local[r] = g, i
        object.__setattr__(self, "_node_of", tuple(node_of))
        object.__setattr__(self, "_local", tuple(local))

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self._node_of)

    @property
    def count(self) -> int:
        """The number of nodes."""
        return len(self.members)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(node) for node in self.members)

    @property
    def max_local(self) -> int:
        """The most ranks any node holds."""
        return max(self.sizes)

    @property
    def equal(self) -> bool:
        """Whether every node holds the same number of ranks."""
        return len(set(self.sizes)) == 1

    def node_of(self, rank: int) -> int:
        return self._node_of[rank]

    def local_rank(self, rank: int) -> int:
        return self._local[rank]

    def node_ids(self) -> list[int]:
        """The node of every rank, rank 0 first."""
        return list(self._node_of)

    def restrict(self, members: Sequence[int]) -> Nodes:
        """The nodes of the ranks ``members`` alone, renumbered: current rank i is the rank
        ``members[i]`` of these nodes. After ranks die, the survivors keep their nodes and a
        node that lost ranks simply holds fewer (an unequal node); a node that lost all of
        them disappears."""
        members = [int(m) for m in members]
        if not members or len(set(members)) != len(members) \
                or any(not 0 <= m < self.size for m in members):
            raise ValueError(f"restrict: {members} are not distinct ranks of {self.size}")
        return nodes_from_ids([self.node_of(m) for m in members])

    def describe(self) -> str:
        if self.equal:
            return f"{self.count} node(s) of {self.max_local} rank(s)"
        return f"{self.count} nodes of {'/'.join(map(str, self.sizes))} ranks"


def consecutive_nodes(size: int, ranks_per_node: int) -> Nodes:
    """Nodes of ``ranks_per_node`` consecutive ranks; the last one takes the remainder."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"need at least one rank, got size {size!r}")
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) \
            or ranks_per_node < 1:
        raise ValueError(f"ranks per node must be a positive integer, got {ranks_per_node!r}")
    return Nodes(tuple(tuple(range(lo, min(lo + ranks_per_node, size)))
                       for lo in range(0, size, ranks_per_node)))


def nodes_from_ids(node_of_rank: Sequence[Any]) -> Nodes:
    """Nodes from one node id per rank (any hashable: a host name, a leader rank)."""
    groups: dict[Any, list[int]] = {}
    for r, v in enumerate(node_of_rank):
        groups.setdefault(v, []).append(r)
    if not groups:
        raise ValueError("nodes_from_ids: no ranks")
    return Nodes(tuple(tuple(g) for g in groups.values()))


def nodes_from_placement(weights: Any) -> Nodes:
    """Nodes from a placement link matrix (same node 2, other node 1; zero diagonal).

    Raises ValueError when the matrix is not one: a device matrix such as ``p3.16xlarge``
    does not say which ranks share a node."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        raise ValueError(f"a placement matrix must be square and non-empty, got {w.shape}")
    n = w.shape[0]
    same = w == PLACEMENT_SAME_NODE
    np.fill_diagonal(same, True)
    ids = [int(np.argmax(same[r])) for r in range(n)]  # the lowest rank on r's node
    nodes = nodes_from_ids(ids)
    want = np.equal.outer(ids, ids)
    off = ~np.eye(n, dtype=bool)
    if not np.array_equal(same, want) or np.any(w[off & ~want] != 1.0):
        raise ValueError("the link matrix is not a placement matrix (weight 2 within a node, "
                         "1 between nodes), so it does not say which ranks share a node; set "
                         f"{RANKS_PER_NODE_ENV} or leave BMLMPI_LINKS unset")
    return nodes


def ranks_per_node_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """``BMLMPI_RANKS_PER_NODE`` as a positive integer, or None when unset or empty
    (:class:`bmlmpi.config.ConfigError`, a ValueError, for anything else)."""
    return config.get(RANKS_PER_NODE_ENV, env)


def resolve_nodes(size: int, placement: Any = None, ranks_per_node: int | None = None) -> Nodes:
    """The nodes of ``size`` ranks: pretended (``ranks_per_node``) if given, else from the
    placement matrix; one node of all ranks when neither is known."""
    if ranks_per_node is not None:
        return consecutive_nodes(size, ranks_per_node)
    if placement is None:
        return Nodes((tuple(range(size)),))
    nodes = nodes_from_placement(placement)
    if nodes.size != size:
        raise ValueError(f"the placement matrix has {nodes.size} ranks, the communicator {size}")
    return nodes


__all__ = [
    "PLACEMENT_SAME_NODE", "RANKS_PER_NODE_ENV", "Nodes", "consecutive_nodes",
    "nodes_from_ids", "nodes_from_placement", "ranks_per_node_from_env", "resolve_nodes",
]
