"""Hierarchical all-to-all: inside the node, across nodes, inside again. MPI-free.

Algorithm. The ranks sit on nodes (:class:`~bmlmpi.topology.nodes.Nodes`). The block from
rank s on node A to rank d on node B ≠ A takes up to three hops, one per step:

1. inside A, to A's *exporter* for B: the rank of A at local index B mod |A|;
2. across, from that exporter to B's *importer* for A: the rank of B at local index A mod |B|;
3. inside B, from that importer to d.

A hop whose holder is already the next rank is left out (s may be A's exporter for B, the
importer may be d). Every block from node A to node B thus crosses between the nodes in one
step, between the one pair of ranks that carries A → B: N_nodes·(N_nodes − 1) pairs of
partners between nodes in all, against N·(N − N/N_nodes) for a flat exchange. Blocks between
ranks of one node go straight, in step 1. Each step posts its transfers together. Layout by
:mod:`.exchange` (the work buffer holds every piece that passes through the rank once; it
lays an importer's blocks out by their destination, so the exporter's run to one importer
is cut into one transfer per (source, destination) pair where the two orders differ).

Steps: 3 (1 on a single node). Each element crosses between nodes at most once, in the
one message from A's exporter for B to B's importer for A (|A|·|B| blocks for full rows);
an element between nodes is sent up to three times, twice inside its nodes. Against the
flat exchange (:mod:`.pairwise`) it trades those intra-node copies for fewer, larger
messages between nodes: for blocks small enough that a message's latency dominates.

Source: the node-aware (two-level) all-to-all that gathers a node's blocks for another node
before they cross, with the crossing spread over the node's ranks (one exporter/importer
pair per pair of nodes) instead of one leader per node.
"""

from __future__ import annotations

import functools

from ..topology.nodes import Nodes
from .exchange import Hop, exchange_schedules
from .types import Schedule


@functools.lru_cache(maxsize=8)
def _all_ranks(size: int, pairs: tuple[int, ...], nodes: Nodes) -> tuple[Schedule, ...]:
    members = nodes.members
    node_of = [nodes.node_of(r) for r in range(size)]

    def route(s: int, d: int, piece: int) -> tuple[Hop, ...]:
        a, b = node_of[s], node_of[d]
        if a == b:
            return () if s == d else (Hop(0, d),)
        exporter = members[a][b % len(members[a])]
        importer = members[b][a % len(members[b])]
        hops, holder = [], s
        for step, to in ((0, exporter), (1, importer), (2, d)):
            if to != holder:
                hops.append(Hop(step, to))
                holder = to
        return tuple(hops)
    return exchange_schedules("hierarchical", size, pairs, 1, route,
                              3 if nodes.count > 1 else min(size - 1, 1))


def hierarchical_exchange_schedule(rank: int, size: int, pairs: tuple[int, ...],
                                   nodes: Nodes) -> Schedule:
    """Rank ``rank``'s hierarchical all-to-all of the ``size × size`` pair matrix ``pairs``
    over ``nodes``."""
    if nodes.size != size:
        raise ValueError(f"nodes {nodes.describe()} hold {nodes.size} ranks, not {size}")
    return _all_ranks(size, tuple(pairs), nodes)[rank]


__all__ = ["hierarchical_exchange_schedule"]
