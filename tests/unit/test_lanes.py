"""Independent lanes in the executor, proven without MPI.

The executor lets each stream of a schedule run at its own pace when the streams touch disjoint
ranges (``streams_are_independent``). These tests check that property on every algorithm, that
:class:`bmlmpi.execute.Plan` splits the steps and the scratch accordingly, and, by simulating
every rank's Plan under adversarial random interleavings (messages matched by communicator,
peer and tag, first in first out, exactly as MPI matches them), that any order in which lanes
advance gives the exact allreduce.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque

import numpy as np
import pytest

from bmlmpi.execute import Plan
from bmlmpi.ft.recovery import bcube_recovery_schedules
from bmlmpi.schedules import algorithms
from bmlmpi.schedules.algorithms import Context
from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.collectives import collective
from bmlmpi.schedules.ring import ring_schedules
from bmlmpi.schedules.tree import multitree_schedules, tree_schedules
from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer, streams_are_independent
from bmlmpi.topology.bcube import default_shape
from bmlmpi.topology.links import flat_links
from bmlmpi.topology.nodes import Nodes, consecutive_nodes
from bmlmpi.topology.trees import binary_tree, multi_trees


def plan_of(sched: Schedule) -> Plan:
    return Plan(sched, [None], lambda level, peer: (0, peer))


def simulate(scheds: list[Schedule], seed: int, live: list[int] | None = None,
             separate_input: bool = False, start: dict | None = None) -> dict:
    """Run every rank's Plan with lanes advanced in a random order; return the buffers.

    ``separate_input``: as a Run given ``src`` does, the input stays in its own buffer and
    only the copies of :meth:`Plan.deferred` move it into the result, which starts as
    garbage; sends the analysis marks read the input. ``start``: each rank's work buffer
    as it enters step 0 (another collective's, filled through its input copies); then the
    buffers are returned unchecked."""
    rng = random.Random(seed)
    live = live if live is not None else [s.rank for s in scheds]
    count = scheds[0].count
    plans = {s.rank: plan_of(s) for s in scheds}
    bufs = start if start is not None else \
        {r: (np.arange(count, dtype=np.int64) * 1000 + r) * (r + 1) for r in live}
    inputs = {r: b.copy() for r, b in bufs.items()}
    copies = {r: plans[r].deferred() for r in live} if separate_input else None
    if separate_input:
        for r in live:
            bufs[r][:] = -(10 ** 12)  # garbage: any byte read before it is written shows
    wire: dict[tuple, deque] = defaultdict(deque)  # (src, dst, tag) -> payloads in order
    pos = {r: [0] * len(plans[r].lanes) for r in live}
    posted = {r: [False] * len(plans[r].lanes) for r in live}

    def runnable() -> list[tuple[int, int]]:
        return [(r, i) for r in live for i, lane in enumerate(plans[r].lanes)
                if pos[r][i] < len(lane)]

    stalled = 0
    while todo := runnable():
        r, i = rng.choice(todo)
        sp = plans[r].lanes[i][pos[r][i]]
        step = copies[r].lanes[i][pos[r][i]] if copies else None
        if not posted[r][i]:
            if step is not None:
                for lo, hi in step.before_post:
                    bufs[r][lo:hi] = inputs[r][lo:hi]
            for k, p in enumerate(sp.sends):  # buffered: the payload is captured when posted
                data = inputs[r] if step is not None and step.send_from_input[k] else bufs[r]
                wire[(r, p.world_peer, p.tag)].append(data[p.lo:p.hi].copy())
            posted[r][i] = True
        # a step completes once every receive has its message at the head of its queue
        need: dict[tuple, int] = defaultdict(int)
        for p in sp.recvs:
            need[(p.world_peer, r, p.tag)] += 1
        if any(len(wire[k]) < n for k, n in need.items()):
            stalled += 1
            assert stalled < 100_000, "deadlock: no lane can advance"
            continue
        stalled = 0
        landed = []
        for p in sp.recvs:
            data = wire[(p.world_peer, r, p.tag)].popleft()
            assert len(data) == p.hi - p.lo
            if p.scratch >= 0:
                landed.append((p.lo, p.hi, data))
            else:
                bufs[r][p.lo:p.hi] = data
        # reductions after every transfer of the step, per reduced range, as Run applies them
        for k, (lo, hi, _) in enumerate(sp.reduces):
            if step is not None and step.combine[k]:
                # one pass, input op scratch: the result's range is not read, so a wrongly
                # marked range (holding data already) would lose that data and fail below
                (data,) = [d for plo, phi, d in landed if (plo, phi) == (lo, hi)]
                bufs[r][lo:hi] = inputs[r][lo:hi] + data
                continue
            if step is not None:
                for a, b in step.before_reduce[k]:
                    bufs[r][a:b] = inputs[r][a:b]
            for plo, phi, data in landed:
                if (plo, phi) == (lo, hi):
                    bufs[r][lo:hi] += data
        pos[r][i] += 1
        posted[r][i] = False
    assert all(not q for q in wire.values()), "messages left unreceived"
    if copies:
        for r in live:
            for lo, hi in copies[r].final:
                bufs[r][lo:hi] = inputs[r][lo:hi]
    if start is not None:
        return bufs
    want = sum(inputs[r] for r in live)
    for r in live:
        np.testing.assert_array_equal(bufs[r], want, err_msg=f"rank {r}")
    return bufs


CASES = [
    ("bml 2", lambda c: bml_schedules(2, c, (2,))),
    ("ring 2", lambda c: ring_schedules(2, c)),
    ("ring 2x8", lambda c: ring_schedules(2, c, segments=8)),
    ("ring 2 pipelined", lambda c: ring_schedules(2, c, pipeline=5)),
    ("ring 4 pipelined", lambda c: ring_schedules(4, c, pipeline=3)),
    ("bml 2 pipelined", lambda c: bml_schedules(2, c, (2,), pipeline=5)),
    ("bml 2x3 pipelined", lambda c: bml_schedules(6, c, (2, 3), pipeline=3)),
    ("bml 2x2", lambda c: bml_schedules(4, c, (2, 2))),
    ("bml 3x3", lambda c: bml_schedules(9, c, (3, 3))),
    ("bml 2x2x3", lambda c: bml_schedules(12, c, (2, 2, 3))),
    ("bml 2x2x2", lambda c: bml_schedules(8, c, (2, 2, 2))),
    ("bml 5", lambda c: bml_schedules(5, c, default_shape(5))),
    ("ring 6x4", lambda c: ring_schedules(6, c, segments=4)),
    ("ring 3x8", lambda c: ring_schedules(3, c, segments=8)),
    ("multitree 8", lambda c: multitree_schedules(8, c, multi_trees(flat_links(8)))),
    ("multitree 5x3", lambda c: multitree_schedules(5, c, multi_trees(flat_links(5)),
                                                     segments=3)),
    ("tree 7x4", lambda c: tree_schedules(7, c, binary_tree(flat_links(7), 0), segments=4)),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("count", [0, 1, 7, 37, 1001])
def test_random_lane_interleavings_give_the_allreduce(name, make, count):
    scheds = make(count)
    for s in scheds:
        assert streams_are_independent(s), f"{name} rank {s.rank}"
    for seed in range(3):
        simulate(scheds, seed)
        simulate(scheds, seed, separate_input=True)


@pytest.mark.parametrize("dead", [(0,), (4,), (0, 8), (1, 5)])
def test_recovery_schedules_under_random_interleavings(dead):
    live = [r for r in range(9) if r not in dead]
    scheds = bcube_recovery_schedules((3, 3), dead, 997)
    for seed in range(3):
        simulate(scheds, seed, live)
        simulate(scheds, seed, live, separate_input=True)


def test_ring_gets_one_lane_per_segment_with_its_own_scratch():
    for s in ring_schedules(5, 4000, segments=4):
        plan = plan_of(s)
        assert len(plan.lanes) == 4
        regions = []
        for lane in plan.lanes:
            streams = {t.stream for sp in lane for t in s.steps[sp.index].sends
                       if any((t.lo, t.hi) == (p.lo, p.hi) for p in sp.sends)}
            assert len(streams) == 1
            offs = [o for sp in lane for _, _, os in sp.reduces for o in os]
            lens = [hi - lo for sp in lane for lo, hi, os in sp.reduces for _ in os]
            regions.append((min(offs), max(o + n for o, n in zip(offs, lens, strict=True))))
        regions.sort()
        for a, b in zip(regions, regions[1:], strict=False):
            assert a[1] <= b[0], regions
        assert plan.scratch_elems >= regions[-1][1]
        # every transfer of the schedule is in exactly one lane
        posted = sorted((sp.index, p.world_peer, p.lo, p.hi) for lane in plan.lanes
                        for sp in lane for p in sp.sends)
        listed = sorted((i, t.peer, t.lo, t.hi) for i, st in enumerate(s.steps)
                        for t in st.sends)
        assert posted == listed


def test_bml_pipelines_stay_in_step():
    # independent data, but each step puts the pipelines on different levels (NICs)
    for s in bml_schedules(9, 1800, (3, 3)):
        assert streams_are_independent(s)
        plan = plan_of(s)
        assert len(plan.lanes) == 1
        assert [sp.index for sp in plan.lanes[0]] == list(range(len(s.steps)))


def test_overlapping_streams_run_in_lockstep():
    # stream 1 re-sends what stream 0 reduced: the streams share a range, so one lane
    steps = (Step((Transfer(1, 0, 4, stream=0),), (Recv(1, 4, 8, stream=0, reduce=True),)),
             Step((Transfer(1, 4, 8, stream=1),), (Recv(1, 0, 4, stream=1),)))
    sched = Schedule("crafted", 0, 2, 8, steps, streams=2)
    assert not streams_are_independent(sched)
    plan = plan_of(sched)
    assert len(plan.lanes) == 1 and [sp.index for sp in plan.lanes[0]] == [0, 1]


def test_touching_ranges_are_independent():
    steps = (Step((Transfer(1, 0, 4, stream=0), Transfer(1, 4, 8, stream=1)),
                  (Recv(1, 0, 4, stream=0, reduce=True), Recv(1, 4, 8, stream=1, reduce=True))),)
    assert streams_are_independent(Schedule("crafted", 0, 2, 8, steps, streams=2))


# -- the rest of the family: the same lanes, then the collective's own result -----------------

GARBAGE = -(10 ** 12)


def simulate_family(scheds: list[Schedule], seed: int) -> None:
    """Run a reduce-scatter, allgather, reduce or broadcast through random lane interleavings
    (inputs copied in, the lanes, outputs copied out, as ``collective_run`` does) and compare
    every rank's output with the collective's result computed directly."""
    first = scheds[0]
    size, count, root, counts = first.size, first.count, first.root, first.counts
    coll = collective(first.collective)
    inputs = {s.rank: (np.arange(coll.input_size(s.rank, count, root, counts), dtype=np.int64)
                       * 1000 + s.rank + 1) * (s.rank + 1) for s in scheds}
    start = {}
    for s in scheds:
        work = np.full(count, GARBAGE, dtype=np.int64)
        for c in s.input_copies():
            work[c.at:c.at + c.n] = inputs[s.rank][c.lo:c.hi]
        start[s.rank] = work
    work = simulate(scheds, seed, start=start)
    off = [0]
    for c in counts or ():
        off.append(off[-1] + c)
    for s in scheds:
        r = s.rank
        out = np.full(coll.output_size(r, count, root, counts), GARBAGE, dtype=np.int64)
        for c in s.output_copies():
            out[c.at:c.at + c.n] = work[r][c.lo:c.hi]
        if first.collective == "reduce_scatter":
            want = sum(inputs[j][off[r]:off[r + 1]] for j in range(size))
        elif first.collective == "allgather":
            want = np.concatenate([inputs[j] for j in range(size)])
        elif first.collective == "reduce":
            want = sum(inputs[j] for j in range(size)) if r == root else out
        else:
            want = inputs[root]
        np.testing.assert_array_equal(out, want, err_msg=f"{first.collective} rank {r}")


def family(name, coll, size, shape=None, **kw):
    def make(count):
        counts = None
        if coll in ("reduce_scatter", "allgather"):
            counts = tuple((count * (i + 1) + i) % 11 for i in range(size))
            count = sum(counts)
        return algorithms.schedules(name, Context(size, count, 4, collective=coll,
                                                  counts=counts, shape=shape, **kw))
    return make


FAMILY_CASES = [
    ("ring rs 5x3", family("ring", "reduce_scatter", 5, segments=3)),
    ("ring rs 2 pipelined", family("ring", "reduce_scatter", 2, pipeline=4)),
    ("ring ag 4x2", family("ring", "allgather", 4, segments=2)),
    ("bml rs 2x2", family("bml", "reduce_scatter", 4, (2, 2))),
    ("bml rs 2x3 pipelined", family("bml", "reduce_scatter", 6, (2, 3), pipeline=3)),
    ("bml rs 2x2x3", family("bml", "reduce_scatter", 12, (2, 2, 3))),
    ("bml ag 3x3", family("bml", "allgather", 9, (3, 3))),
    ("bml ag 2x2x2", family("bml", "allgather", 8, (2, 2, 2))),
    ("bml reduce 3x2 root 4", family("bml", "reduce", 6, (3, 2), root=4)),
    ("bml bcast 2x2x2 root 5", family("bml", "bcast", 8, (2, 2, 2), root=5)),
    ("tree reduce 7 root 3", family("tree", "reduce", 7, root=3, segments=3)),
    ("tree bcast 6 root 5", family("tree", "bcast", 6, root=5, segments=2)),
    ("multitree reduce 6 root 2", family("multitree", "reduce", 6, root=2, segments=2)),
    ("multitree bcast 5 root 4", family("multitree", "bcast", 5, root=4)),
    ("hierarchical reduce 3x2 root 3", family("hierarchical", "reduce", 6, root=3,
                                              nodes=consecutive_nodes(6, 2))),
    ("hierarchical bcast 2+1+3 root 4", family("hierarchical", "bcast", 6, root=4,
                                               nodes=Nodes(((0, 1), (2,), (3, 4, 5))))),
    ("rabenseifner reduce 5 root 2", family("rabenseifner", "reduce", 5, root=2)),
    ("rabenseifner bcast 4 root 3", family("rabenseifner", "bcast", 4, root=3, segments=2)),
]


@pytest.mark.parametrize("name,make", FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES])
@pytest.mark.parametrize("count", [0, 1, 7, 37])
def test_random_lane_interleavings_give_each_collective(name, make, count):
    scheds = make(count)
    for seed in range(3):
        simulate_family(scheds, seed)
