"""Networks as graphs of directional links, for the cost model. MPI-free.

A network routes a message from one rank to another over a path of *links* and gives each link
a bandwidth. Links are directional (full duplex: a server's uplink and downlink are separate
links) and named by hashable tuples. Bandwidths are relative to the *reference link*, bandwidth
1: one NIC port of a BCube or Fat-Tree server, one rank's port into shared memory, one single
NVLink. A message of m elements loads every link of its path with m elements; T_F, the paper's
"time to transmit the full gradients by full link speed", is ``count`` elements over a link of
bandwidth 1.

Networks:

* :class:`BCubeNetwork` — BCube(n,k) with mixed radices. Server ``a`` has one NIC per level;
  a hop at level l from ``a`` to ``b`` (addresses differing in digit l only, one level-l
  switch between them) uses a's level-l uplink ``("up", a, l)`` and b's level-l downlink
  ``("down", b, l)``. Switches are non-blocking, so they are not links. Servers that differ in
  several digits are reached by relaying through servers (BCube is server-centric): the route
  fixes one differing digit per hop, the transfer's own level first when it names one, then
  the others in ascending level order. A 2-hop transfer therefore loads two NIC pairs.
* :class:`BCubeWithout` — the same BCube with some servers dead and their links gone: a
  transfer between survivors routes around them (shortest path through live servers); what
  the recovery schedules of :mod:`bmlmpi.ft.recovery` are priced on.
* :class:`FatTree` — one NIC per server and a non-blocking core: a message uses the sender's
  uplink and the receiver's downlink only. The paper's Fat-Tree(k') (k'^3/4 servers) has the
  same cost at any k'; :func:`fat_tree_groups` gives its edge/pod hierarchy for BML-like
  hierarchical schedules.
* :class:`SharedMemoryNode` — one machine, ranks exchanging through shared memory: each rank
  has an outgoing and an incoming port of bandwidth 1 (what one rank can copy), plus, when
  ``bus`` is given, one memory bus of that bandwidth shared by every transfer.
* :class:`LinkMatrixNetwork` — a link-weight matrix W (:mod:`bmlmpi.topology.links`): weights
  map to bandwidths in units of one NVLink (25 GB/s on p3.16xlarge) by
  :data:`WEIGHT_BANDWIDTH`: 3 (two bonded NVLinks, 50 GB/s) → 2, 2 (one NVLink) → 1,
  1 (PCIe through the CPU, 10 GB/s) → 2/5. NVLinks are point-to-point: the pair (i, j) has its
  own link ``("link", i, j)``. A weight in ``shared`` (default {1}, PCIe) is not a private wire
  but a path through the host: it uses i's port ``("host-up", i)`` and j's ``("host-down", j)``,
  shared by all of i's and j's host-path transfers. Weight 0 means no path: routing raises.
* :class:`TwoTierNetwork` — servers (nodes) holding several ranks each: inside a node every
  rank has an outgoing and an incoming port ``("out", r)``/``("in", r)`` of bandwidth
  ``intra`` (NVLink or shared memory, a multiple of the NIC's); between nodes the nodes' NICs,
  bandwidth 1, either a BCube of nodes (one NIC per level per node, ``("up", g, l)`` /
  ``("down", g, l)``, relaying through nodes as :class:`BCubeNetwork` does) or a Fat-Tree
  (one NIC per node, ``("up", g)``/``("down", g)``). A message between nodes loads the NICs
  of its path only (the NIC is the bottleneck; the copy to it is not modelled), so all ranks
  of a node share its NICs. A transfer's ``level`` 0 means "inside the node"; level 1 + l
  asks for the first hop at digit l of the BCube of nodes (hierarchical schedules, and flat
  BML on a shape whose level 0 is the local rank, annotate so); a level that does not fit
  the pair is ignored.

Symmetry. :meth:`Network.link_class` names the orbit of a link under the network's
translation symmetry (BCube: digit-wise addition; Fat-Tree and shared memory: any relabelling);
:meth:`Network.class_size` says how many links the orbit holds. When a schedule set is
equivariant under a group that acts transitively on the ranks and maps the network onto itself
(BML and the P2P parameter server on BCube or Fat-Tree; ring on Fat-Tree or shared memory),
every link of an orbit carries the same load, and one rank's schedule is enough to price the
whole set (:func:`bmlmpi.model.cost.price_symmetric`). A link-weight matrix has no such
symmetry in general (``symmetric = False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from ..topology.bcube import BCube, default_shape, parse_shape
from ..topology.nodes import Nodes

Link = tuple
Bandwidth = int | Fraction | float

#: Bandwidth of each link-matrix weight, in units of one single NVLink (25 GB/s): the MXNet
#: proposal's p3.16xlarge figures 50, 25 and 10 GB/s divided by 25.
WEIGHT_BANDWIDTH: dict[float, Bandwidth] = {3.0: 2, 2.0: 1, 1.0: Fraction(2, 5)}
#: Weights whose transfers go through the host (PCIe/CPU) and share a per-rank port.
SHARED_WEIGHTS = frozenset({1.0})


def _check_rank(size: int, rank: int, what: str) -> None:
    if not 0 <= rank < size:
        raise ValueError(f"{what} {rank} outside [0, {size})")


def _as_bandwidth(value: Any, what: str) -> Bandwidth:
    if isinstance(value, bool) or not isinstance(value, int | Fraction | float):
        raise ValueError(f"{what}: bandwidth must be a number, got {value!r}")
    if not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{what}: bandwidth must be positive and finite, got {value!r}")
    return value


class Network:
    """Base class: ``size`` ranks, directional links, a route for every ordered pair."""

    name: str = "network"
    size: int = 0
    #: Whether :meth:`link_class` names orbits of a rank-transitive symmetry.
    symmetric: bool = False

    def route(self, src: int, dst: int, level: int = -1) -> tuple[Link, ...]:
        """The links a message from ``src`` to ``dst`` loads (``level``: the schedule's hint)."""
        raise NotImplementedError

    def bandwidth(self, link: Link) -> Bandwidth:
        """The bandwidth of ``link`` relative to the reference link."""
        raise NotImplementedError

    def link_class(self, link: Link) -> Hashable:
        """The orbit of ``link`` under the network's symmetry (only if ``symmetric``)."""
        raise NotImplementedError(f"{self.name} has no rank-transitive symmetry")

    def class_size(self, cls: Hashable) -> int:
        """How many links the orbit ``cls`` holds."""
        raise NotImplementedError(f"{self.name} has no rank-transitive symmetry")

    def _pair(self, src: int, dst: int) -> None:
        _check_rank(self.size, src, "source rank")
        _check_rank(self.size, dst, "destination rank")
        if src == dst:
            raise ValueError(f"{self.name}: a transfer from rank {src} to itself")


class BCubeNetwork(Network):
    """BCube(n,k) or a mixed-radix BCube: one NIC per level per server, relaying servers."""

    symmetric = True

    def __init__(self, radices: str | Sequence[int], bandwidth: Bandwidth = 1):
        self.cube = BCube(parse_shape(radices))
        self.size = self.cube.size
        self.levels = self.cube.levels
        self.link_bandwidth = _as_bandwidth(bandwidth, "BCube link")
        self.name = f"BCube({'x'.join(map(str, self.cube.radices))})"

    def hops(self, src: int, dst: int, level: int = -1) -> list[tuple[int, int, int]]:
        """The hops ``(from, to, level)``: the transfer's level first, then ascending levels."""
        self._pair(src, dst)
        cube = self.cube
        differ = [lv for lv in range(self.levels) if cube.digit(src, lv) != cube.digit(dst, lv)]
        if level >= 0:
            if level not in differ:
                raise ValueError(f"{self.name}: transfer {src}->{dst} is marked level {level} "
                                 f"but the two addresses agree in digit {level}")
            differ.remove(level)
            differ.insert(0, level)
        out, at = [], src
        for lv in differ:
            nxt = cube.with_digit(at, lv, cube.digit(dst, lv))
            out.append((at, nxt, lv))
            at = nxt
        return out

    def route(self, src: int, dst: int, level: int = -1) -> tuple[Link, ...]:
        links: list[Link] = []
        for a, b, lv in self.hops(src, dst, level):
            links.append(("up", a, lv))
            links.append(("down", b, lv))
        return tuple(links)

    def bandwidth(self, link: Link) -> Bandwidth:
        return self.link_bandwidth

    def link_class(self, link: Link) -> Hashable:
        return (link[0], link[2])

    def class_size(self, cls: Hashable) -> int:
        return self.size


class BCubeWithout(BCubeNetwork):
    """A BCube whose ``dead`` servers are gone with their links: what the survivors have.

    A transfer between two survivors takes BCube's own route when none of its relays is dead,
    else the shortest path through live servers (breadth-first, lower addresses first, so the
    route is deterministic). A transfer from or to a dead server, or between survivors the dead
    servers cut apart, raises ``ValueError``. No symmetry: price with ``price``.
    """

    symmetric = False

    def __init__(self, radices: str | Sequence[int], dead: Sequence[int] | frozenset[int],
                 bandwidth: Bandwidth = 1):
        super().__init__(radices, bandwidth)
        self.dead = frozenset(int(d) for d in dead)
        bad = sorted(d for d in self.dead if not 0 <= d < self.size)
        if bad:
            raise ValueError(f"{self.name}: dead servers {bad} outside [0, {self.size})")
        self.name = f"{self.name} without {sorted(self.dead)}"

    def _live_neighbours(self, a: int) -> list[tuple[int, int]]:
        cube = self.cube
        out = []
        for lv in range(self.levels):
            for v in range(cube.radices[lv]):
                b = cube.with_digit(a, lv, v)
                if b != a and b not in self.dead:
                    out.append((b, lv))
        return sorted(out)

    def hops(self, src: int, dst: int, level: int = -1) -> list[tuple[int, int, int]]:
        for r in (src, dst):
            if r in self.dead:
                raise ValueError(f"{self.name}: server {r} is dead")
        direct = super().hops(src, dst, level)
        if all(b not in self.dead for _, b, _ in direct):
            return direct
        prev: dict[int, tuple[int, int] | None] = {src: None}
        frontier = [src]
        while frontier and dst not in prev:
            nxt = []
            for a in frontier:
                for b, lv in self._live_neighbours(a):
                    if b not in prev:
                        prev[b] = (a, lv)
                        nxt.append(b)
            frontier = nxt
        if dst not in prev:
            raise ValueError(f"{self.name}: servers {src} and {dst} are cut apart")
        out, at = [], dst
        while (step := prev[at]) is not None:
            out.append((step[0], at, step[1]))
            at = step[0]
        return out[::-1]

    def link_class(self, link: Link) -> Hashable:
        raise NotImplementedError(f"{self.name} has no rank-transitive symmetry")


class _PortNetwork(Network):
    """Every rank has one outgoing and one incoming port; optionally one shared link."""

    symmetric = True
    _out = "up"
    _in = "down"
    _shared_name = "bus"

    def __init__(self, size: int, shared: Bandwidth | None = None):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{type(self).__name__} needs size >= 1, got {size!r}")
        self.size = size
        self.shared = None if shared is None else _as_bandwidth(shared, self._shared_name)

    def route(self, src: int, dst: int, level: int = -1) -> tuple[Link, ...]:
        self._pair(src, dst)
        if self.shared is None:
            return ((self._out, src), (self._in, dst))
        return ((self._out, src), (self._shared_name,), (self._in, dst))

    def bandwidth(self, link: Link) -> Bandwidth:
        return self.shared if link[0] == self._shared_name else 1

    def link_class(self, link: Link) -> Hashable:
        return link[0]

    def class_size(self, cls: Hashable) -> int:
        return 1 if cls == self._shared_name else self.size


class FatTree(_PortNetwork):
    """A non-blocking Fat-Tree: one NIC per server; only NIC up/down links are contended."""

    def __init__(self, size: int):
        super().__init__(size)
        self.name = f"Fat-Tree({size} servers)"


class SharedMemoryNode(_PortNetwork):
    """One machine: each rank's copy-out and copy-in port, and an optional shared memory bus."""

    _out = "out"
    _in = "in"

    def __init__(self, size: int, bus: Bandwidth | None = None):
        super().__init__(size, bus)
        self.name = f"shared memory ({size} ranks)"


class TwoTierNetwork(Network):
    """Nodes of several ranks: fast intra-node ports, NICs between nodes (module docstring)."""

    def __init__(self, nodes: Any, inter: str | Sequence[int] = "fat-tree",
                 intra: Bandwidth = 10, nic: Bandwidth = 1):
        """``nodes``: a :class:`~bmlmpi.topology.nodes.Nodes` or a list of node sizes (nodes
        of consecutive ranks); ``inter``: ``"fat-tree"``, ``"bcube"`` (the BCube of the prime
        factors of the node count) or the radices of the BCube of nodes; ``intra``/``nic``:
        bandwidths of a rank's intra-node port and of one NIC."""
        if not isinstance(nodes, Nodes):
            sizes = [int(m) for m in nodes]
            if not sizes or min(sizes) < 1:
                raise ValueError(f"node sizes must be positive, got {sizes}")
            starts = [sum(sizes[:g]) for g in range(len(sizes))]
            nodes = Nodes(tuple(tuple(range(s, s + m)) for s, m in zip(starts, sizes,
                                                                        strict=True)))
        self.nodes = nodes
        self.size = nodes.size
        self.intra = _as_bandwidth(intra, "intra-node port")
        self.nic = _as_bandwidth(nic, "NIC")
        self._node_of = nodes.node_ids()
        if isinstance(inter, str) and inter.lower() == "fat-tree":
            self.cube: BCube | None = None
            between = "Fat-Tree"
        else:
            radices = (default_shape(nodes.count) if isinstance(inter, str)
                       and inter.lower() == "bcube" else parse_shape(inter))
            self.cube = BCube(radices)
            if self.cube.size != nodes.count:
                raise ValueError(f"BCube of nodes {radices} has {self.cube.size} nodes, the "
                                 f"network {nodes.count}")
            between = f"BCube({'x'.join(map(str, radices)) or '1'})"
        self.name = f"{nodes.describe()}, intra {self.intra}, {between} of nodes"

    @property
    def weights(self) -> Any:
        """The placement link matrix (same node 2, other node 1) of the ranks."""
        from ..topology.links import links_from_nodes
        return links_from_nodes(self._node_of)

    def route(self, src: int, dst: int, level: int = -1) -> tuple[Link, ...]:
        self._pair(src, dst)
        a, b = self._node_of[src], self._node_of[dst]
        if a == b:
            return (("out", src), ("in", dst))
        if self.cube is None:
            return (("up", a), ("down", b))
        cube = self.cube
        differ = [lv for lv in range(cube.levels) if cube.digit(a, lv) != cube.digit(b, lv)]
        if level - 1 in differ:
            differ.remove(level - 1)
            differ.insert(0, level - 1)
        links: list[Link] = []
        at = a
        for lv in differ:
            nxt = cube.with_digit(at, lv, cube.digit(b, lv))
            links += [("up", at, lv), ("down", nxt, lv)]
            at = nxt
        return tuple(links)

    def bandwidth(self, link: Link) -> Bandwidth:
        return self.intra if link[0] in ("out", "in") else self.nic


def fat_tree_groups(ports: int) -> tuple[int, int, int]:
    """The hierarchy of the paper's Fat-Tree(k'), k' = ``ports``: (servers per edge switch,
    edge switches per pod, pods) = (k'/2, k'/2, k'), k'^3/4 servers in all. As radices it is
    the BCube shape whose BML schedule is the paper's "hierarchical" synchronisation."""
    if isinstance(ports, bool) or not isinstance(ports, int) or ports < 2 or ports % 2:
        raise ValueError(f"a Fat-Tree needs an even number of switch ports >= 2, got {ports!r}")
    return (ports // 2, ports // 2, ports)


class LinkMatrixNetwork(Network):
    """Ranks joined as a link-weight matrix says (see the module docstring for the mapping)."""

    def __init__(self, weights: Any, bandwidth: Mapping[float, Bandwidth] | Callable[
                     [float], Bandwidth] | None = None,
                 shared: frozenset[float] | set[float] = SHARED_WEIGHTS,
                 name: str = "link matrix"):
        from ..topology.links import validate_links

        self.weights = validate_links(weights, name)
        self.size = int(self.weights.shape[0])
        self.name = name
        self._map = bandwidth if bandwidth is not None else WEIGHT_BANDWIDTH
        self.shared = frozenset(float(w) for w in shared)

    def weight_bandwidth(self, weight: float) -> Bandwidth:
        if callable(self._map):
            return _as_bandwidth(self._map(weight), f"{self.name} weight {weight:g}")
        try:
            value = self._map[float(weight)]
        except KeyError:
            raise ValueError(f"{self.name}: no bandwidth for link weight {weight:g}; known "
                             f"weights {sorted(self._map)} (pass bandwidth=...)") from None
        return _as_bandwidth(value, f"{self.name} weight {weight:g}")

    def route(self, src: int, dst: int, level: int = -1) -> tuple[Link, ...]:
        self._pair(src, dst)
        w = float(self.weights[src, dst])
        if w == 0:
            raise ValueError(f"{self.name}: ranks {src} and {dst} have no link (weight 0)")
        if w in self.shared:
            return (("host-up", src, w), ("host-down", dst, w))
        return (("link", src, dst, w),)

    def bandwidth(self, link: Link) -> Bandwidth:
        return self.weight_bandwidth(link[-1])


__all__ = [
    "SHARED_WEIGHTS", "WEIGHT_BANDWIDTH", "BCubeNetwork", "BCubeWithout", "FatTree", "Link",
    "LinkMatrixNetwork", "Network", "SharedMemoryNode", "TwoTierNetwork", "fat_tree_groups",
]
