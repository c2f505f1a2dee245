"""Hierarchical reduce-scatter and allgather on MPI's block layout: a node tier (a ring inside
each node) and a network tier (BML on the BCube of nodes, else ring) with every local rank on
its own share of the blocks.

Sources: the two-tier reduce-scatter/allgather of Horovod's hierarchical allreduce and of
BlueConnect (Cho et al., MLSys 2019: each tier of the network busy at once), the inter-node
step BML's halves (Wang et al., "BML: A High-performance, Low-cost Gradient Synchronization
Algorithm for DML Training", NeurIPS 2018); the allreduce form is
:mod:`bmlmpi.schedules.hierarchical`, whose node layout this module shares.

Blocks and columns. MPI fixes the result: rank j owns block j (``counts[j]`` elements). N
ranks sit on M nodes; node g holds m_g ranks, L = max m_g. *Column* c (c < L) is the set of
blocks of the ranks of local rank c, one per node that has such a rank: the blocks a network
tier of M nodes reduce-scatters (or allgathers) among the ranks of local rank c. On node g,
column c is carried by local rank c mod m_g (equal nodes: local rank c carries column c, the
one that holds its own block); a node with fewer ranks gives its ranks several columns, each
with an empty block of that node.

Work layout. The work buffer holds the columns one after the other; inside column c the
blocks lie as the network tier's own schedule over the nodes wants them (ring's: in node
order; BML's: its pieces over the blocks, :func:`~bmlmpi.schedules.bml.block_layout`). The
schedule's input and output copies map MPI's layout onto it, composed from the network tier's
own copies: every transfer stays one contiguous range.

* **Reduce-scatter**: the input is copied into the work layout (the whole input, as every
  reduce-scatter copies it into its work buffer, in up to one range per piece); then the
  node tier, L−1 steps — the ring of the hierarchical allreduce over the columns: local rank
  i ends with its node's sum of the columns it carries; then the network tier, every column
  reduce-scattered across nodes by its carriers (BML's k steps or ring's M−1); rank j ends
  with its block reduced over every rank, copied out into its recvbuf.
* **Allgather**: the rank's block is copied to its place; the network tier allgathers every
  column across nodes (k or M−1 steps); the node tier's ring, L−1 steps, passes the columns
  around each node; every block is then copied out to its place in the recvbuf — one more
  pass over the result than ring, which works in the recvbuf itself (BML's allgather pays
  the same; with one node and ranks placed in order the layout is MPI's and the copy is the
  identity the executor skips).

Cost (equal nodes of r ranks, M nodes, intra-node port bandwidth b, one NIC per BCube level
of the nodes, T_F the whole buffer over one NIC): the node tier sends (r−1)/r of the buffer
from each rank over its own port, (r−1)/(r·b)·T_F; the network tier moves (M−1)/M of each
column, and the r carriers of a node share its NICs: (M−1)/(k·M)·T_F with BML on the BCube
of nodes, (M−1)/M·T_F on a one-NIC Fat-Tree. Steps (r−1) + k with BML, (r−1) + (M−1) with
ring; flat ring takes N−1 steps and the same bandwidth on a Fat-Tree.

Node tier in shared memory (``intra="shm"``): the ring over the columns is instead the
reduce-scatter (or allgather) half of :mod:`bmlmpi.schedules.shm` over the node's ranks, the
columns as the shards, cut into C cache-sized chunks: each rank publishes the other carriers'
pieces of its input and reduces its own from its node peers' segments (allgather: publishes
its own columns, fetches the others', after a first step that copies its own block into the
work buffer), 2C steps, no message inside a node. An operation that
reads the input never straddles two of the input copies (the work layout permutes the input),
so the publishes and reductions are cut at their boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..topology.nodes import Nodes
from .bml import bml_allgather_schedule, bml_reduce_scatter_schedule
from .hierarchical import INTRA_ALGORITHMS, across_nodes, node_layout, node_ring, shm_chunks
from .ring import ring_allgather_schedule, ring_reduce_scatter_schedule
from .shm import DEFAULT_CHUNK_BYTES, chunk_count, node_steps
from .types import (
    PUBLISH,
    REDUCE,
    Copy,
    Recv,
    Schedule,
    ShmOp,
    Step,
    Transfer,
    block_offsets,
    check_arguments,
    compact,
)

BLOCKED = ("reduce_scatter", "allgather")


def _split(lo: int, hi: int, bounds: Sequence[int]) -> list[tuple[int, int, int]]:
    """``[lo, hi)`` cut at ``bounds`` (block boundaries): (piece lo, piece hi, block)."""
    out = []
    for b in range(len(bounds) - 1):
        a, z = max(lo, bounds[b]), min(hi, bounds[b + 1])
        if a < z:
            out.append((a, z, b))
    return out


def _merged(copies: list[Copy]) -> tuple[Copy, ...]:
    """``copies`` without empty ones, neighbours that continue each other joined."""
    out: list[Copy] = []
    for c in sorted((c for c in copies if c.hi > c.lo), key=lambda c: (c.at, c.lo)):
        if out and out[-1].hi == c.lo and out[-1].at + out[-1].n == c.at:
            out[-1] = Copy(out[-1].lo, c.hi, out[-1].at)
        else:
            out.append(c)
    return tuple(out)


def _cut_input_reads(steps: list[Step], inputs: Sequence[Copy]) -> list[Step]:
    """``steps`` with every shared-memory op that reads the input (a publish of the input, a
    reduction) cut where one input copy ends and the next begins: the executor reads an op's
    input range through one copy."""
    cuts = sorted({c.at for c in inputs} | {c.at + c.n for c in inputs})
    out = []
    for st in steps:
        ops: list[ShmOp] = []
        for o in st.shm:
            if o.kind == REDUCE or (o.kind == PUBLISH and o.source == "input"):
                inner = [x for x in cuts if o.lo < x < o.hi]
                bounds = [o.lo, *inner, o.hi]
                ops += [replace(o, lo=a, hi=b) for a, b in zip(bounds, bounds[1:], strict=False)]
            else:
                ops.append(o)
        out.append(Step(st.sends, st.recvs, tuple(ops)))
    return out


def hierarchical_blocks_schedule(collective: str, rank: int, size: int,
                                 counts: Sequence[int], nodes: Nodes, inter: str = "auto",
                                 node_shape: Sequence[int] | None = None, intra: str = "ring",
                                 itemsize: int = 4,
                                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Schedule:
    """The two-tier reduce-scatter (``collective="reduce_scatter"``) or allgather
    (``"allgather"``) of ``rank`` for the blocks ``counts`` (MPI's layout, uneven and zero
    blocks allowed) over ``nodes`` (module docstring). ``inter``: ``bml``, ``ring`` or
    ``auto`` across nodes (:func:`~bmlmpi.schedules.hierarchical.inter_algorithm`);
    ``intra``: the node tier, ``ring`` (messages) or ``shm`` (shared memory, chunks of
    about ``chunk_bytes`` per rank for elements of ``itemsize`` bytes)."""
    if collective not in BLOCKED:
        raise ValueError(f"hierarchical block schedules are {BLOCKED}, not {collective!r}")
    if intra not in INTRA_ALGORITHMS:
        raise ValueError(f"intra-node algorithm must be one of {INTRA_ALGORITHMS}, "
                         f"got {intra!r}")
    counts = tuple(int(c) for c in counts)
    if len(counts) != size:
        raise ValueError(f"need {size} block counts, got {len(counts)}")
    count = sum(counts)
    check_arguments(rank, size, count)
    if nodes.size != size:
        raise ValueError(f"nodes describe {nodes.size} ranks but the communicator has {size}")
    n_nodes, across, shape, width, _, g, i, here, m, right, left = node_layout(
        rank, 0, nodes, inter, node_shape)
    reducing = collective == "reduce_scatter"
    off = block_offsets(counts)
    members = nodes.members

    # column c: the blocks of local rank c's ranks, one per node (empty where none)
    col_counts = [tuple(counts[node[c]] if c < len(node) else 0 for node in members)
                  for c in range(width)]
    col = block_offsets([sum(cc) for cc in col_counts])
    col_blocks = [block_offsets(cc) for cc in col_counts]

    def tier(c: int, h: int) -> Schedule | None:
        """Column c's network-tier schedule as node h runs it (None: one node)."""
        if n_nodes == 1:
            return None
        if across == "bml":
            make: Callable = (bml_reduce_scatter_schedule if reducing
                              else bml_allgather_schedule)
            return make(h, n_nodes, col_counts[c], shape)
        make = ring_reduce_scatter_schedule if reducing else ring_allgather_schedule
        return make(h, n_nodes, col_counts[c], 1)

    def layout_copies(c: int) -> tuple[Copy, ...]:
        """Column c's whole-column copies between node order and its work layout (the
        reduce-scatter's inputs, the allgather's outputs: the same on every node)."""
        n = col[c + 1] - col[c]
        sub = tier(c, 0)
        if sub is None:
            return (Copy(0, n, 0),) if n else ()
        return sub.inputs if reducing else sub.outputs

    # MPI's layout <-> the work layout, for the whole buffer (every column)
    whole: list[Copy] = []
    for c in range(width):
        for cp in layout_copies(c):
            if reducing:  # node-order input [lo, hi) -> work col[c] + at
                for a, z, h in _split(cp.lo, cp.hi, col_blocks[c]):
                    src = off[members[h][c]] + a - col_blocks[c][h]
                    whole.append(Copy(src, src + z - a, col[c] + cp.at + a - cp.lo))
            else:  # work col[c] + [lo, hi) -> node-order output at
                for a, z, h in _split(cp.at, cp.at + cp.n, col_blocks[c]):
                    dst = off[members[h][c]] + a - col_blocks[c][h]
                    whole.append(Copy(col[c] + cp.lo + a - cp.at, col[c] + cp.lo + z - cp.at,
                                      dst))
    # this rank's own block: its column is its local rank, its place the node's own
    own = tier(i, g)
    n_own = counts[rank]
    if own is None:  # one node: the column is this rank's block alone
        mine = (() if not n_own else (Copy(col[i], col[i] + n_own, 0),) if reducing
                else (Copy(0, n_own, col[i]),))
    elif reducing:
        mine = tuple(Copy(col[i] + cp.lo, col[i] + cp.hi, cp.at) for cp in own.outputs)
    else:
        mine = tuple(Copy(cp.lo, cp.hi, col[i] + cp.at) for cp in own.inputs)
    if reducing:
        inputs, outputs = _merged(whole), _merged(list(mine))
    else:
        inputs, outputs = _merged(list(mine)), _merged(whole)

    sub_streams = len(shape) if across == "bml" else 1
    inter_steps = 0
    if n_nodes > 1:
        inter_steps = len(shape) if across == "bml" else n_nodes - 1
    sends: list[list[Transfer]] = [[] for _ in range(inter_steps)]
    recvs: list[list[Recv]] = [[] for _ in range(inter_steps)]
    for c in range(i, width, m) if n_nodes > 1 else ():  # the columns this rank carries
        owners = [node[c % len(node)] for node in members]
        across_nodes(tier(c, g), owners, col[c], c * sub_streams, sends, recvs)
    network = [Step(tuple(s), tuple(r)) for s, r in zip(sends, recvs, strict=True)]
    if size == 1:
        steps: list[Step] = []
    elif intra == "shm":
        chunks = shm_chunks(col, here, chunk_count(count, itemsize, width, chunk_bytes))
        if reducing:
            steps = _cut_input_reads(node_steps(rank, here, chunks, "reduce_scatter"),
                                     inputs) + network
        else:  # the own block into the result first: shared-memory steps read no input there
            own_in = Step(shm=tuple(ShmOp(REDUCE, c.at, c.at + c.n) for c in inputs))
            steps = [own_in] + network
            steps += node_steps(rank, here, chunks, "allgather", len(steps))
    elif reducing:
        steps = node_ring(col, i, m, width, right, left, True) + network
    else:
        steps = network + node_ring(col, i, m, width, right, left, False)
    return Schedule("hierarchical", rank, size, count, compact(steps),
                    streams=max(1, width * sub_streams),
                    meta={"nodes": nodes.sizes, "inter": across,
                          "node_shape": shape if across == "bml" else None},
                    collective=collective, counts=counts, inputs=inputs, outputs=outputs)


__all__ = ["hierarchical_blocks_schedule"]
