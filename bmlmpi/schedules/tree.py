"""Single-tree and multi-tree allreduce over topology-aware binary trees — the Apache MXNet
tree-reduce proposal ("topology-aware single-machine tree reduce"; trees from
:mod:`bmlmpi.topology.trees`).

Single tree (latency-bound, small arrays). The whole buffer is reduced to the tree's root
level by level — in tree step s every node whose ``send_step`` is s sends its partial sum to
its parent, which reduce-receives it — then broadcast back along the same edges in reverse
order (tree step D first), the children copy-receiving. A binary tree keeps every node on at
most one edge per tree step, so no node sends and writes in one step.

Multi-tree (bandwidth-bound, large arrays). The buffer is cut into n balanced flat ranges;
range i is reduced to root i over ``trees[i]`` and broadcast back from it, all n trees at
once: every tree's step-j transfers share step j, tree i on ``stream`` i. Different trees
touch different ranges, so they never conflict.

Segments (optional pipelining). With ``segments`` = S > 1 a tree's range is cut into S
balanced segments and tree step s handles segment j in schedule step (s − 1) + j (reduce) and
(D − s) + j (broadcast): a node forwards segment j to its parent while it still receives later
segments from its children. Within a step a node's send and its writes are different
segments, so the schedule stays hazard-free. S is capped at the range length.

Reduce and broadcast (:func:`rooted_tree_schedule`, :func:`multitree_rooted_schedule`). A
single tree rooted at the call's root (its own KL tree, generated for that root) runs one
half: the reduction toward the root, or the broadcast from it, D + S − 1 steps, the root
receiving or sending D·count: the latency-bound choice. The multi-trees keep their own roots:
range i is reduced over tree i to root i and then sent to the call's root in one direct step
(a broadcast: the root sends range i to root i first, then tree i broadcasts it), D + S steps,
each link carrying about (n−1)/n·count spread over the trees, the root (n−1)/n·count in its
direct step: the bandwidth-bound choice.

Steps: 2·(D + S − 1), D = the tree depth (⌈log2 n⌉ for the balanced trees of
:func:`~bmlmpi.topology.trees.binary_tree`; the maximum depth over the trees for a multi-tree);
none for n = 1.

Cost (α-β, links of a node used concurrently):

* single tree: 2(D + S − 1)·(α + count/S·β); with S = 1, 2⌈log2 n⌉·(α + count·β) — the
  fewest steps of any allreduce, but every step moves the whole buffer, and the root
  receives D times ``count`` elements.
* multi-tree: 2(D + S − 1)·α + 2·(n−1)/n·count·β·c, where each rank sends and receives
  2(n−1)/n·count elements on average (each tree moves count/n over each of its n−1 edges,
  twice), and c ≥ 1 is the worst contention, the most tree transfers sharing one link in one
  step — what the link-usage penalty of :func:`~bmlmpi.topology.trees.multi_trees` keeps low.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..topology.trees import Tree
from .collectives import collective as collective_record
from .types import Recv, Schedule, Step, Transfer, balanced_bounds, check_arguments, compact


def _add_tree(sends: list[list[Transfer]], recvs: list[list[Recv]], rank: int, tree: Tree,
              lo: int, hi: int, segments: int, stream: int, bcast_start: int | None,
              reduce: bool = True) -> None:
    """Append ``rank``'s transfers for reducing ``[lo, hi)`` over ``tree`` (starting at step 0;
    not when ``reduce`` is False) and broadcasting it back (starting at step ``bcast_start``;
    not when it is None)."""
    bounds = balanced_bounds(lo, hi, segments)
    depth = tree.depth
    mine = tree.send_step[rank]
    parent = tree.parent[rank]
    for j in range(segments):
        seg = (bounds[j], bounds[j + 1])
        for child in tree.children[rank]:  # ordered by step, one per step
            s = tree.send_step[child]
            if reduce:
                recvs[s - 1 + j].append(Recv(child, *seg, stream=stream, reduce=True))
            if bcast_start is not None:
                sends[bcast_start + depth - s + j].append(Transfer(child, *seg, stream=stream))
        if parent >= 0:
            if reduce:
                sends[mine - 1 + j].append(Transfer(parent, *seg, stream=stream))
            if bcast_start is not None:
                recvs[bcast_start + depth - mine + j].append(
                    Recv(parent, *seg, stream=stream, reduce=False))

def _steps(sends: list[list[Transfer]], recvs: list[list[Recv]]) -> tuple[Step, ...]:
    return compact([Step(tuple(s), tuple(r)) for s, r in zip(sends, recvs, strict=True)])

def tree_schedule(rank: int, size: int, count: int, tree: Tree, segments: int = 1) -> Schedule:
    """Reduce ``count`` elements to ``tree.root`` and broadcast them back, for ``rank``."""
    check_arguments(rank, size, count, segments)
    if tree.size != size:
        raise ValueError(f"tree has {tree.size} nodes but the communicator has {size} ranks")
    segs = max(1, min(segments, count))
    phase = tree.depth + segs - 1 if tree.depth else 0
    sends: list[list[Transfer]] = [[] for _ in range(2 * phase)]
    recvs: list[list[Recv]] = [[] for _ in range(2 * phase)]
    if phase:
        _add_tree(sends, recvs, rank, tree, 0, count, segs, 0, phase)
    return Schedule("tree", rank, size, count, _steps(sends, recvs), streams=1,
                    meta={"root": tree.root, "depth": tree.depth, "segments": segs})

def multitree_schedule(rank: int, size: int, count: int, trees: Sequence[Tree],
                       segments: int = 1) -> Schedule:
    """Range i of n balanced ranges reduced to ``trees[i].root`` over ``trees[i]`` and
    broadcast back from it, all trees in the same steps, tree i on stream i."""
    check_arguments(rank, size, count, segments)
    if len(trees) != size or any(t.size != size for t in trees):
        raise ValueError(f"need {size} trees of {size} nodes each, got "
                         f"{[t.size for t in trees]}")
    ranges = balanced_bounds(0, count, size)
    longest = max(ranges[i + 1] - ranges[i] for i in range(size))
    segs = max(1, min(segments, longest))
    depth = max(t.depth for t in trees)
    phase = depth + segs - 1 if depth else 0
    sends: list[list[Transfer]] = [[] for _ in range(2 * phase)]
    recvs: list[list[Recv]] = [[] for _ in range(2 * phase)]
    if phase:
        for i, tree in enumerate(trees):
            _add_tree(sends, recvs, rank, tree, ranges[i], ranges[i + 1], segs, i, phase)
    return Schedule("multitree", rank, size, count, _steps(sends, recvs), streams=size,
                    meta={"roots": tuple(t.root for t in trees), "depth": depth,
                          "segments": segs})

def rooted_tree_schedule(collective: str, rank: int, size: int, count: int, tree: Tree,
                         segments: int = 1, name: str = "tree") -> Schedule:
    """Reduce ``count`` elements to ``tree.root`` (``collective="reduce"``: the reduce half)
    or broadcast them from it (``"bcast"``: the broadcast half), for ``rank``."""
    check_arguments(rank, size, count, segments)
    if tree.size != size:
        raise ValueError(f"tree has {tree.size} nodes but the communicator has {size} ranks")
    if collective not in ("reduce", "bcast"):
        raise ValueError(f"a rooted tree serves reduce and bcast, not {collective!r}")
    segs = max(1, min(segments, count))
    phase = tree.depth + segs - 1 if tree.depth else 0
    sends: list[list[Transfer]] = [[] for _ in range(phase)]
    recvs: list[list[Recv]] = [[] for _ in range(phase)]
    if phase:
        reducing = collective == "reduce"
        _add_tree(sends, recvs, rank, tree, 0, count, segs, 0, None if reducing else 0,
                  reduce=reducing)
    coll = collective_record(collective)
    return Schedule(name, rank, size, count, _steps(sends, recvs), streams=1,
                    meta={"root": tree.root, "depth": tree.depth, "segments": segs},
                    collective=collective, root=tree.root,
                    inputs=coll.plain_inputs(rank, count, tree.root, None),
                    outputs=coll.plain_outputs(rank, count, tree.root, None))

def multitree_rooted_schedule(collective: str, rank: int, size: int, count: int,
                              trees: Sequence[Tree], root: int, segments: int = 1) -> Schedule:
    """A reduce to ``root`` (``collective="reduce"``): range i of n balanced ranges reduced
    over ``trees[i]`` to its own root, all trees at once, then every tree root sends its
    range to ``root`` in one step; or a broadcast from ``root`` (``"bcast"``): ``root`` sends
    range i to the root of ``trees[i]`` in one step, then every tree broadcasts its range.
    The n trees spread the reduction over every link as the allreduce's multi-tree does; the
    one direct step costs ``root`` (n−1)/n·count. Steps D + S (D the deepest tree)."""
    check_arguments(rank, size, count, segments)
    if len(trees) != size or any(t.size != size for t in trees):
        raise ValueError(f"need {size} trees of {size} nodes each, got "
                         f"{[t.size for t in trees]}")
    if not 0 <= root < size:
        raise ValueError(f"root {root} outside [0, {size})")
    if collective not in ("reduce", "bcast"):
        raise ValueError(f"multi-trees to a root serve reduce and bcast, not {collective!r}")
    ranges = balanced_bounds(0, count, size)
    longest = max(ranges[i + 1] - ranges[i] for i in range(size))
    segs = max(1, min(segments, longest))
    depth = max(t.depth for t in trees)
    phase = depth + segs - 1 if depth else 0
    sends: list[list[Transfer]] = [[] for _ in range(phase)]
    recvs: list[list[Recv]] = [[] for _ in range(phase)]
    reducing = collective == "reduce"
    if phase:
        for i, tree in enumerate(trees):
            _add_tree(sends, recvs, rank, tree, ranges[i], ranges[i + 1], segs, i,
                      None if reducing else 0, reduce=reducing)
    # range i between its tree's root and ``root``, one message each, on stream i
    away = [(i, t.root) for i, t in enumerate(trees) if t.root != root]
    if reducing:
        direct = Step(tuple(Transfer(root, ranges[i], ranges[i + 1], stream=i)
                            for i, r in away if r == rank),
                      tuple(Recv(r, ranges[i], ranges[i + 1], stream=i)
                            for i, r in away if rank == root))
    else:
        direct = Step(tuple(Transfer(r, ranges[i], ranges[i + 1], stream=i)
                            for i, r in away if rank == root),
                      tuple(Recv(root, ranges[i], ranges[i + 1], stream=i)
                            for i, r in away if r == rank))
    body = [Step(tuple(a), tuple(b)) for a, b in zip(sends, recvs, strict=True)]
    steps = [] if size == 1 else (body + [direct]) if reducing else ([direct] + body)
    coll = collective_record(collective)
    return Schedule("multitree", rank, size, count, compact(steps), streams=size,
                    meta={"roots": tuple(t.root for t in trees), "depth": depth,
                          "segments": segs},
                    collective=collective, root=root,
                    inputs=coll.plain_inputs(rank, count, root, None),
                    outputs=coll.plain_outputs(rank, count, root, None))

def tree_schedules(size: int, count: int, tree: Tree, segments: int = 1) -> list[Schedule]:
    return [tree_schedule(r, size, count, tree, segments) for r in range(size)]

def multitree_schedules(size: int, count: int, trees: Sequence[Tree],
                        segments: int = 1) -> list[Schedule]:
    return [multitree_schedule(r, size, count, trees, segments) for r in range(size)]
