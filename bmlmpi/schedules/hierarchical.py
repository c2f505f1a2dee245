"""Hierarchical allreduce: reduce inside each node, BML (or ring) across nodes with every local
rank on its own shard, gather inside each node.

Sources: Horovod's hierarchical allreduce (``HOROVOD_HIERARCHICAL_ALLREDUCE``: a local
reduce-scatter, a cross-node allreduce of each shard by the local rank that holds it, a local
allgather); BlueConnect (Cho et al., MLSys 2019: the same decomposition mapped onto each tier
of the network, every tier busy at once); the MXNet tree-reduce proposal (reduce inside the
machine over its link matrix, then across machines); the inter-node step is BML on the BCube
of nodes (Wang et al., "BML: A High-performance, Low-cost Gradient Synchronization Algorithm
for DML Training", NeurIPS 2018).

Algorithm. N ranks sit on M nodes (:class:`~bmlmpi.topology.nodes.Nodes`); node g holds m_g
ranks, L = max m_g. The buffer is cut into L balanced shards; on node g shard j belongs to
local rank j mod m_g (equal nodes: local rank j owns shard j).

1. Local reduce-scatter, steps 0..L-2: a ring over the node's ranks. Chunk c of node g is the
   union of the shards local rank c owns. In step t local rank i sends chunk (i−t−1) mod m_g
   to local rank i+1 and reduce-receives chunk (i−t−2) mod m_g from i−1; after m_g−1 steps it
   holds the node's sum of its own chunk. Nodes with fewer ranks idle in the last steps.
2. Inter-node allreduce: for every shard j the M owners of shard j (one per node, in node
   order) run an allreduce of that shard — BML on the mixed-radix BCube of nodes
   (:func:`~bmlmpi.topology.bcube.default_shape` of M) when every prime factor of M is at most
   :data:`MAX_BML_RADIX`, else ring (a large prime M has no useful BCube). All shards at
   once: with equal nodes every local rank runs one of them, so every rank's link (every NIC
   of the node) works in the same step. A rank of a smaller node owns several shards and
   runs their allreduces side by side (correct, but that node's NICs carry more).
3. Local allgather, L−1 steps: the reduce-scatter's ring backwards, copying.

Node tier in shared memory (``intra="shm"``, :mod:`bmlmpi.schedules.shm`): steps 1 and 3 are
instead the reduce-scatter and allgather halves of the shared-memory allreduce over the
node's ranks, the shards cut into C cache-sized chunks (C the same on every node): each rank
publishes the other owners' pieces of its input, reduces its own pieces from its node peers'
segments (2C steps, pipelined), and after the inter-node allreduce publishes its reduced
shards and fetches the others' (2C steps). No message inside a node; the node's ranks read
each piece once where the ring forwards it m−1 times.

Reduce and broadcast (:func:`hierarchical_rooted_schedule`): the reduce is the local
reduce-scatter, a reduce of every shard across nodes toward the shard's owner on the root's
node (BML's rooted schedule on the BCube of nodes, else ring's), and one step in which those
owners send their shards to the root; the broadcast is the same backwards (the root sends
every shard to its owner on its node, every shard is broadcast across nodes, the local
allgather). Steps (L−1) + 2k + 1 with BML across nodes. With the node tier in shared memory
(``intra="shm"``) the local reduce-scatter and allgather are the shared-memory halves above,
and the step between the root and the owners on its node is one too: the owners publish their
shards and the root fetches them (reduce), or the root publishes the shards and each owner
fetches its own (broadcast), 2C steps either way.

Transfers name global ranks of the flat communicator, so the executor runs the schedule over
one communicator unchanged. Their ``level`` says which tier they use, as flat BML's does on a
BCube whose level 0 is the local rank: 0 for intra-node transfers, 1 + l for BML transfers at
level l of the BCube of nodes, 1 for ring transfers between nodes. The two-tier network of
:mod:`bmlmpi.model.network` routes by node, the level only picks the first hop.

Steps: 2(L−1) + 2k with BML across nodes (k = levels of the BCube of M nodes), 2(L−1) +
2(M−1) with ring; 2(L−1) for one node (the local ring alone), none for one rank.

Cost on a two-tier network (equal nodes of r ranks, M nodes; every rank has an intra-node port
of bandwidth b, each node one NIC per BCube level — or one NIC on a Fat-Tree — of bandwidth
1; T_F = the whole buffer over one NIC; messages between nodes load only NICs; count divisible
by r·k·M so that no range rounds):

* local reduce-scatter and allgather: r−1 steps each, every rank sends count/r per step over
  its own port: 2·(r−1)/(r·b)·T_F;
* inter-node, BML on the BCube of nodes (n_0…n_{k−1}): the r local ranks each run the same
  BML schedule on a shard of count/r, so in every step the level-l NIC carries the same
  pipeline's message from each of them — as much as one BML run on the whole buffer would
  send. Pipeline e's step w moves (n_l − 1)/(n_{L_e[0]}·…·n_{L_e[w]})·count/k in all at
  level l = L_e[w]; the k pipelines use k different NICs, so a step costs its largest
  pipeline and

      G_BCube = 2 · Σ_{w<k} max_e (n_{L_e[w]} − 1) / (k · Π_{j≤w} n_{L_e[j]})  · T_F,

  which for equal radices (M = n^k) is 2·(M−1)/(k·M)·T_F, BML's own GST on M servers;
* inter-node on a Fat-Tree (one NIC per node): everything a node sends shares its NIC, and a
  node sends r · 2(M−1)/M · count/r per allreduce: G_FT = 2·(M−1)/M·T_F (BML and ring alike);
* total: T_hier = 2·(r−1)/(r·b)·T_F + G, plus α per step.

Against it (same network):

* flat ring over all N = r·M ranks in rank order: 2(N−1) steps; each step every rank sends
  count/N, one rank per node across the node boundary, so on a Fat-Tree every step costs
  count/N over a NIC (b ≥ 1): 2·(N−1)/N·T_F — about as much bandwidth as hierarchical on a
  Fat-Tree, but 2(N−1) steps instead of 2(r−1) + 2k. On a BCube of nodes the node-order
  ring crosses one node digit per step except at carries, where it relays through another
  node's idle NIC of the next level; no link carries two of its messages in a step, so the
  price is the same 2·(N−1)/N·T_F (the unit test checks it on the tabulated shapes) and
  the other levels' NICs stay idle;
* flat BML over all N ranks on the BCube (r, n_0, …, n_{k−1}) whose level 0 is the local rank
  (the best flat shape: its level 0 never leaves the node): k+1 pipelines of count/(k+1);
  a pipeline at level 0 costs its volume / b, at node level l it costs r times its volume
  (the r local ranks share the NIC; on a Fat-Tree all node levels of a step share one NIC and
  add up), so

      T_flat = 2 · Σ_{w≤k} max_e c_{L_e[w]} · (n_{L_e[w]} − 1) / ((k+1) · Π_{j≤w} n_{L_e[j]}) · T_F,

  c_0 = 1/b, c_l = r (l ≥ 1). For r = 2, one node level (M nodes) and b → ∞: 3(M−1)/(2M) ·
  2 = 3(M−1)/M·T_F — half as much again as hierarchical's 2(M−1)/M, because every node-level
  pipeline of flat BML carries r ranks' pieces where hierarchical carries r shards of 1/r.

:func:`theory_t_f` evaluates these formulas; ``tests/unit/test_hierarchical_schedule.py``
checks them against the cost model, and ``perf/hierarchical/`` tabulates them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

from ..topology.bcube import default_shape, prime_factors
from ..topology.nodes import Nodes
from .bml import bml_schedule
from .collectives import collective as collective_record
from .ring import ring_schedule
from .shm import DEFAULT_CHUNK_BYTES, chunk_count, node_steps
from .types import Recv, Schedule, Step, Transfer, balanced_bounds, check_arguments, compact

#: The inter-node allreduce is BML while every prime factor of the node count is at most this
#: (a BCube level of radix n costs n−1 messages per step); a larger prime factor means ring.
MAX_BML_RADIX = 8
INTER_ALGORITHMS = ("auto", "bml", "ring")
INTRA_ALGORITHMS = ("ring", "shm")


def inter_algorithm(node_count: int, inter: str = "auto") -> str:
    """Which allreduce runs between the nodes: ``bml`` or ``ring`` (see the module docstring)."""
    if inter not in INTER_ALGORITHMS:
        raise ValueError(f"inter-node algorithm must be one of {INTER_ALGORITHMS}, got {inter!r}")
    if inter != "auto":
        return inter
    if node_count <= 1:
        return "bml"
    return "bml" if max(prime_factors(node_count)) <= MAX_BML_RADIX else "ring"


def _chunk(shards: list[int], owner: int, m: int) -> list[tuple[int, int]]:
    """The ranges of the shards local rank ``owner`` of an ``m``-rank node owns."""
    return [(shards[j], shards[j + 1]) for j in range(owner, len(shards) - 1, m)]


def shm_chunks(shards: list[int], members: Sequence[int], nchunks: int
                ) -> list[list[tuple[int, int, int]]]:
    """Chunk c: piece c of every shard, owned by the shard's local owner."""
    m = len(members)
    cuts = [balanced_bounds(shards[j], shards[j + 1], nchunks) for j in range(len(shards) - 1)]
    return [[(cut[c], cut[c + 1], members[j % m]) for j, cut in enumerate(cuts)]
            for c in range(nchunks)]


def node_layout(rank: int, count: int, nodes: Nodes, inter: str,
                node_shape: Sequence[int] | None) -> tuple:
    """What both hierarchical builders derive first: the node count, the inter-node
    algorithm and node shape (checked), the L = max m_g balanced shards, this rank's node g,
    local rank i, the node's members and their number m, and its ring neighbours."""
    n_nodes = nodes.count
    across = inter_algorithm(n_nodes, inter)
    shape = tuple(default_shape(n_nodes) if node_shape is None else node_shape)
    if across == "bml" and math.prod(shape) != n_nodes:
        raise ValueError(f"node shape {shape} has {math.prod(shape)} nodes, not {n_nodes}")
    width = nodes.max_local
    shards = balanced_bounds(0, count, width)
    g, i = nodes.node_of(rank), nodes.local_rank(rank)
    mine = nodes.members[g]
    m = len(mine)
    right, left = mine[(i + 1) % m], mine[(i - 1) % m]
    return n_nodes, across, shape, width, shards, g, i, mine, m, right, left


def across_nodes(sub: Schedule, owners: Sequence[int], base: int, stream: int,
                 sends: list[list[Transfer]], recvs: list[list[Recv]]) -> None:
    """Add the network tier's schedule ``sub`` (over the nodes, on a range of its own) to
    the steps ``sends``/``recvs``: node h becomes rank ``owners[h]``, ranges move by
    ``base``, streams by ``stream``, levels to the network tiers 1 + l."""
    for w, st in enumerate(sub.steps):
        for t in st.sends:
            sends[w].append(Transfer(owners[t.peer], base + t.lo, base + t.hi,
                                     stream=stream + t.stream, level=1 + max(t.level, 0)))
        for t in st.recvs:
            recvs[w].append(Recv(owners[t.peer], base + t.lo, base + t.hi,
                                 stream=stream + t.stream, level=1 + max(t.level, 0),
                                 reduce=t.reduce))


def hierarchical_schedule(rank: int, size: int, count: int, nodes: Nodes, inter: str = "auto",
                          node_shape: Sequence[int] | None = None, intra: str = "ring",
                          itemsize: int = 4,
                          chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Schedule:
    """The hierarchical schedule of ``rank`` for ``count`` elements over ``nodes``.

    ``inter``: ``bml``, ``ring`` or ``auto`` (:func:`inter_algorithm`); ``node_shape``: the
    BCube of nodes BML runs on (default: the prime factors of the node count); ``intra``: the
    node tier, ``ring`` (messages) or ``shm`` (shared memory, chunks of about ``chunk_bytes``
    per rank for elements of ``itemsize`` bytes)."""
    _check_tiers(rank, size, count, nodes, intra)
    n_nodes, across, shape, width, shards, g, i, mine, m, right, left = node_layout(
        rank, count, nodes, inter, node_shape)

    steps: list[Step] = []
    chunks: list = []
    if intra == "shm" and count:
        nchunks = chunk_count(count, itemsize, width, chunk_bytes)
        chunks = shm_chunks(shards, mine, nchunks)
        steps += node_steps(rank, mine, chunks, "reduce_scatter")
    for t in range(width - 1 if intra == "ring" else 0):  # local reduce-scatter
        if t >= m - 1:
            steps.append(Step())
            continue
        out, into = _chunk(shards, (i - t - 1) % m, m), _chunk(shards, (i - t - 2) % m, m)
        steps.append(Step(tuple(Transfer(right, lo, hi, level=0) for lo, hi in out),
                          tuple(Recv(left, lo, hi, level=0, reduce=True) for lo, hi in into)))

    middle, sub_streams = _inter_node_steps(
        nodes, across, shape, shards, i, m, 2 * (n_nodes - 1),
        lambda n: (bml_schedule(g, n_nodes, n, shape) if across == "bml"
                   else ring_schedule(g, n_nodes, n)))
    steps += middle

    if chunks:
        steps += node_steps(rank, mine, chunks, "allgather", len(steps))
    for t in range(width - 1 if intra == "ring" else 0):  # local allgather
        if t >= m - 1:
            steps.append(Step())
            continue
        out, into = _chunk(shards, (i - t) % m, m), _chunk(shards, (i - t - 1) % m, m)
        steps.append(Step(tuple(Transfer(right, lo, hi, level=0) for lo, hi in out),
                          tuple(Recv(left, lo, hi, level=0, reduce=False) for lo, hi in into)))
    return Schedule("hierarchical", rank, size, count, compact(steps),
                    streams=max(1, width * sub_streams),
                    meta={"nodes": nodes.sizes, "inter": across, "intra": intra,
                          "node_shape": shape if across == "bml" else None})


def _inter_node_steps(nodes: Nodes, across: str, shape: Sequence[int], shards: list[int],
                      i: int, m: int, ring_steps: int,
                      sub_of: Callable[[int], Schedule]) -> tuple[list[Step], int]:
    """The tier across nodes: for every shard local rank ``i`` of an ``m``-rank node carries,
    ``sub_of(elements)``'s schedule among the shard's owners (one per node), merged into one
    step list (2k steps with BML, ``ring_steps`` with ring); and the streams each shard
    takes. No steps on one node."""
    sub_streams = len(shape) if across == "bml" else 1
    if nodes.count == 1:
        return [], sub_streams
    inter_steps = 2 * len(shape) if across == "bml" else ring_steps
    sends: list[list[Transfer]] = [[] for _ in range(inter_steps)]
    recvs: list[list[Recv]] = [[] for _ in range(inter_steps)]
    for j in range(i, len(shards) - 1, m):  # the shards this rank carries across nodes
        lo, hi = shards[j], shards[j + 1]
        owners = [node[j % len(node)] for node in nodes.members]
        across_nodes(sub_of(hi - lo), owners, lo, j * sub_streams, sends, recvs)
    return [Step(tuple(s), tuple(r)) for s, r in zip(sends, recvs, strict=True)], sub_streams


def _check_tiers(rank: int, size: int, count: int, nodes: Nodes, intra: str) -> None:
    """The arguments both tiers share: rank, size and count, the node tier's algorithm, and
    nodes that describe this communicator."""
    check_arguments(rank, size, count)
    if intra not in INTRA_ALGORITHMS:
        raise ValueError(f"intra-node algorithm must be one of {INTRA_ALGORITHMS}, "
                         f"got {intra!r}")
    if nodes.size != size:
        raise ValueError(f"nodes describe {nodes.size} ranks but the communicator has {size}")


def node_ring(shards: list[int], i: int, m: int, width: int, right: int, left: int,
              reduce: bool) -> list[Step]:
    """The node tier's ring, one half: ``width`` − 1 steps over the shards (boundaries
    ``shards``) for local rank ``i`` of an ``m``-rank node. The reduce-scatter (``reduce``)
    leaves local rank i with its node's sum of the shards it owns, the allgather passes every
    owner's shards around; a node with fewer ranks idles in the last steps."""
    out: list[Step] = []
    for t in range(width - 1):
        if t >= m - 1:
            out.append(Step())
            continue
        sent = (i - t - 1) % m if reduce else (i - t) % m
        into = (i - t - 2) % m if reduce else (i - t - 1) % m
        out.append(Step(tuple(Transfer(right, lo, hi, level=0)
                              for lo, hi in _chunk(shards, sent, m)),
                        tuple(Recv(left, lo, hi, level=0, reduce=reduce)
                              for lo, hi in _chunk(shards, into, m))))
    return out


def hierarchical_rooted_schedule(collective: str, rank: int, size: int, count: int,
                                 nodes: Nodes, root: int, inter: str = "auto",
                                 node_shape: Sequence[int] | None = None, intra: str = "ring",
                                 itemsize: int = 4,
                                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Schedule:
    """The two-tier reduce (``collective="reduce"``) or broadcast (``"bcast"``) of ``rank``.

    Reduce: the local reduce-scatter of the allreduce (local rank i ends with its node's sum
    of its shards), then for every shard a reduce across nodes among the shard's owners
    toward the owner on ``root``'s node (BML's rooted schedule on the BCube of nodes, else
    ring's: :func:`~bmlmpi.schedules.ring.ring_rooted_schedule`), then one step in which the
    owners on ``root``'s node send their shards to ``root``. Broadcast, the other way: one
    step in which ``root`` sends every shard to its owner on ``root``'s node, a broadcast of
    every shard across nodes from that owner, and the local allgather of the allreduce.
    Steps (L−1) + 2k + 1 with BML across nodes (L the most ranks on a node, k the levels of
    the BCube of nodes); every NIC of a node carries a shard, as in the allreduce. ``intra``:
    the node tier, ``ring`` (messages) or ``shm`` (shared memory, as
    :func:`hierarchical_schedule`'s)."""
    from .bml import bml_rooted_schedule
    from .ring import ring_rooted_schedule
    _check_tiers(rank, size, count, nodes, intra)
    if not 0 <= root < size:
        raise ValueError(f"root {root} outside [0, {size})")
    if collective not in ("reduce", "bcast"):
        raise ValueError(f"hierarchical rooted schedules are reduce and bcast, not "
                         f"{collective!r}")
    reducing = collective == "reduce"
    n_nodes, across, shape, width, shards, g, i, mine, m, right, left = node_layout(
        rank, count, nodes, inter, node_shape)
    home = nodes.node_of(root)
    at_home = nodes.members[home]

    # the step between root and the owners on its node (shard j: local rank j mod m there)
    owners_home = [(at_home[j % len(at_home)], shards[j], shards[j + 1]) for j in range(width)]
    far = [(o, lo, hi) for o, lo, hi in owners_home if o != root and hi > lo]
    if reducing:
        direct = Step(tuple(Transfer(root, lo, hi, level=0) for o, lo, hi in far if o == rank),
                      tuple(Recv(o, lo, hi, level=0) for o, lo, hi in far if rank == root))
    else:
        direct = Step(tuple(Transfer(o, lo, hi, level=0) for o, lo, hi in far if rank == root),
                      tuple(Recv(root, lo, hi, level=0) for o, lo, hi in far if o == rank))

    middle, sub_streams = _inter_node_steps(
        nodes, across, shape, shards, i, m, n_nodes,
        lambda n: (bml_rooted_schedule(collective, g, n_nodes, n, shape, home)
                   if across == "bml" else
                   ring_rooted_schedule(collective, g, n_nodes, n, home)))
    if size == 1:
        steps: list[Step] = []
    elif intra == "shm":
        steps = _shm_rooted(reducing, rank, count, width, shards, mine, at_home, root,
                            middle, itemsize, chunk_bytes)
    elif reducing:
        steps = node_ring(shards, i, m, width, right, left, True) + middle + [direct]
    else:
        steps = [direct] + middle + node_ring(shards, i, m, width, right, left, False)
    coll = collective_record(collective)
    return Schedule("hierarchical", rank, size, count, compact(steps),
                    streams=max(1, width * sub_streams),
                    meta={"nodes": nodes.sizes, "inter": across,
                          "node_shape": shape if across == "bml" else None},
                    collective=collective, root=root,
                    inputs=coll.plain_inputs(rank, count, root, None),
                    outputs=coll.plain_outputs(rank, count, root, None))


def _shm_rooted(reducing: bool, rank: int, count: int, width: int, shards: list[int],
                mine: Sequence[int], at_home: Sequence[int], root: int, middle: list[Step],
                itemsize: int, chunk_bytes: int) -> list[Step]:
    """:func:`hierarchical_rooted_schedule`'s steps with the node tier in shared memory:
    reduce — the local reduce-scatter, the network tier (``middle``), the root collecting
    the shards from their owners on its node; broadcast — the root scattering the shards to
    their owners on its node, the network tier, the local allgather. Ranks off the root's
    node skip the root's stage (before the network tier they idle through its steps, so
    that the network tier's steps line up)."""
    if not count:
        return []
    nchunks = chunk_count(count, itemsize, width, chunk_bytes)
    chunks = shm_chunks(shards, mine, nchunks)
    home = list(at_home)
    if reducing:
        steps = node_steps(rank, mine, chunks, "reduce_scatter") + middle
        if rank in home:
            steps += node_steps(rank, home, shm_chunks(shards, home, nchunks), "collect",
                                len(steps), root=root)
        return steps
    stage = 2 * nchunks  # the root's scatter: G and F for every chunk
    steps = (node_steps(rank, home, shm_chunks(shards, home, nchunks), "scatter", root=root)
             if rank in home else [Step() for _ in range(stage)])
    steps += middle
    return steps + node_steps(rank, mine, chunks, "allgather", len(steps))


def hierarchical_schedules(size: int, count: int, nodes: Nodes, inter: str = "auto",
                           node_shape: Sequence[int] | None = None, intra: str = "ring",
                           itemsize: int = 4,
                           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model)."""
    return [hierarchical_schedule(r, size, count, nodes, inter, node_shape, intra, itemsize,
                                  chunk_bytes) for r in range(size)]


# -- the formulas of the module docstring, in units of T_F ------------------------------------

def _bml_sum(radices: Sequence[int], weight: Sequence[Fraction], add_levels: Sequence[bool],
             ) -> Fraction:
    """Σ over reduce-scatter steps of the busiest link, doubled for the allgather: pipeline e
    at level l in step w costs weight[l]·(n_l − 1)/(k·Π_{j≤w} n_{L_e[j]}); levels flagged in
    ``add_levels`` share one link (a Fat-Tree NIC) and add up, the others are maxed."""
    k = len(radices)
    total = Fraction(0)
    for w in range(k):
        shared, best = Fraction(0), Fraction(0)
        for e in range(k):
            order = [(e + j) % k for j in range(k)]
            lv = order[w]
            vol = Fraction(radices[lv] - 1, k * math.prod(radices[x] for x in order[:w + 1]))
            if add_levels[lv]:
                shared += weight[lv] * vol
            else:
                best = max(best, weight[lv] * vol)
        total += max(best, shared)
    return 2 * total


def theory_t_f(algorithm: str, node_count: int, ranks_per_node: int, intra: Fraction | int,
               inter: str = "bcube") -> Fraction:
    """The bandwidth term in T_F of ``algorithm`` (``hierarchical``, ``ring`` or ``bml`` —
    flat BML on the shape whose level 0 is the local rank) on a two-tier network of
    ``node_count`` equal nodes of ``ranks_per_node`` ranks, intra-node port bandwidth
    ``intra`` and NICs of bandwidth 1, between nodes a BCube of ``default_shape(node_count)``
    (``inter="bcube"``) or a Fat-Tree (``"fat-tree"``). Hierarchical with BML across nodes;
    counts divisible by every piece count (no rounding)."""
    r, big_m, b = ranks_per_node, node_count, Fraction(intra)
    if inter not in ("bcube", "fat-tree"):
        raise ValueError(f"inter must be 'bcube' or 'fat-tree', got {inter!r}")
    fat = inter == "fat-tree"
    radices = tuple(default_shape(big_m))
    n = r * big_m
    if algorithm == "hierarchical":
        local = Fraction(2 * (r - 1), r) / b
        if big_m == 1:
            return local
        if fat:
            return local + Fraction(2 * (big_m - 1), big_m)
        return local + _bml_sum(radices, [Fraction(1)] * len(radices), [False] * len(radices))
    if algorithm == "ring":
        if n == 1:
            return Fraction(0)
        if big_m == 1:
            return Fraction(2 * (n - 1), n) / b
        return Fraction(2 * (n - 1), n) * max(Fraction(1), 1 / b)
    if algorithm == "bml":
        flat = ((r,) if r > 1 else ()) + radices
        weight = ([1 / b] if r > 1 else []) + [Fraction(r)] * len(radices)
        shared = ([False] if r > 1 else []) + [fat] * len(radices)
        return _bml_sum(flat, weight, shared) if flat else Fraction(0)
    raise ValueError(f"no formula for {algorithm!r}")


__all__ = ["INTER_ALGORITHMS", "MAX_BML_RADIX", "hierarchical_rooted_schedule",
           "hierarchical_schedule",
           "hierarchical_schedules", "inter_algorithm", "theory_t_f"]
