import math

import numpy as np
import pytest

from bmlmpi.schedules.ring import ring_pipeline, ring_schedule, ring_schedules, ring_segments
from bmlmpi.schedules.tree import (
    multitree_schedule,
    multitree_schedules,
    tree_schedule,
    tree_schedules,
)
from bmlmpi.schedules.types import Recv, Schedule, Step
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.links import bcube_links, flat_links, preset
from bmlmpi.topology.trees import Tree, balanced_depth, binary_tree, multi_trees

SIZES = range(1, 34)


def counts(n: int) -> list[int]:
    return sorted({0, 1, max(n - 1, 0), n + 1, 10_007})


def rotated(tree: Tree, k: int) -> Tree:
    """``tree`` with every node v renamed (v + k) mod n: a valid tree rooted at root + k."""
    n = tree.size
    parent, step = [0] * n, [0] * n
    for v in range(n):
        p = tree.parent[v]
        parent[(v + k) % n] = -1 if p < 0 else (p + k) % n
        step[(v + k) % n] = tree.send_step[v]
    return Tree((tree.root + k) % n, tuple(parent), tuple(step))


# --- ring ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_ring_verifies(n):
    for c in counts(n):
        verify(ring_schedules(n, c))
    verify(ring_schedules(n, 10_007, segments=3))
    verify(ring_schedules(n, n + 1, segments=4))  # more segments than elements per chunk
    verify(ring_schedules(n, 10_007, pipeline=5))
    verify(ring_schedules(n, n + 1, pipeline=4))  # more pieces than elements per chunk


@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_pipeline_pieces_are_successive_steps_of_one_stream(n):
    pieces = 4
    count = n * pieces * 3
    for s in ring_schedules(n, count, pipeline=pieces):
        assert s.streams == 1 and len(s.steps) == (n - 1) * (pieces + 1)
        for k in range(n - 1):  # reduce-scatter round k: its pieces tile the chunk in order
            round_ = s.steps[k * pieces:(k + 1) * pieces]
            recvs = [st.recvs[0] for st in round_]
            assert all(st.recvs[0].reduce and len(st.sends) == 1 for st in round_)
            assert all(a.hi == b.lo for a, b in zip(recvs[:-1], recvs[1:], strict=True))
            assert recvs[-1].hi - recvs[0].lo == count // n
        for st in s.steps[(n - 1) * pieces:]:  # the allgather: a whole chunk a step
            assert st.recvs[0].hi - st.recvs[0].lo == count // n and not st.recvs[0].reduce


def test_ring_pipeline_count():
    mib = 1 << 20
    assert ring_pipeline(0, 4, 2) == 1
    assert ring_pipeline(4 * mib // 4, 4, 2) == 1     # 2 MiB chunks stay whole
    assert ring_pipeline(64 * mib // 4, 4, 2) == 16   # 32 MiB chunks: 2 MiB pieces
    assert ring_pipeline(1 << 40, 4, 2) == 64         # clamped
    with pytest.raises(ValueError):
        ring_pipeline(10, 0, 2)
    with pytest.raises(ValueError, match="segments == 1"):
        ring_schedule(0, 2, 100, segments=2, pipeline=2)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_steps_bytes_and_segments_in_flight(n):
    segments = 3
    count = n * segments * 5
    for s in ring_schedules(n, count, segments):
        assert s.nsteps == 2 * (n - 1)
        assert s.sent_elements() == s.received_elements() == 2 * (n - 1) * count // n
        for i, step in enumerate(s.steps):
            assert len(step.sends) == len(step.recvs) == segments
            assert {t.peer for t in step.sends} == {(s.rank + 1) % n}
            assert {t.peer for t in step.recvs} == {(s.rank - 1) % n}
            assert [t.stream for t in step.sends] == list(range(segments))
            assert all(r.reduce == (i < n - 1) for r in step.recvs)


def test_ring_single_rank_has_no_steps():
    assert ring_schedule(0, 1, 100, segments=4).steps == ()


def test_ring_bad_inputs():
    with pytest.raises(ValueError):
        ring_schedule(3, 3, 10)
    with pytest.raises(ValueError):
        ring_schedule(0, 3, -1)
    with pytest.raises(ValueError):
        ring_schedule(0, 3, 10, segments=0)


def test_ring_segments():
    mib = 1 << 20
    assert ring_segments(0, 4, 8) == 1
    assert ring_segments(1000, 4, 8) == 1
    assert ring_segments(8 * mib, 4, 8) == 4  # 4 MiB chunks, 1 MiB target
    assert ring_segments(1 << 30, 4, 2) == 8  # clamped
    assert ring_segments(8 * mib, 4, 8, target_bytes=2 * mib) == 2
    with pytest.raises(ValueError):
        ring_segments(10, 0, 2)


def test_verifier_catches_a_broken_ring():
    """The schedules pass because they are right: dropping one reduce breaks the result."""
    good = ring_schedules(4, 40)
    s0 = good[0]
    step = s0.steps[0]
    bad_step = Step(step.sends, tuple(Recv(r.peer, r.lo, r.hi, r.stream, r.level, reduce=False)
                                      for r in step.recvs))
    bad = Schedule(s0.algorithm, 0, 4, 40, (bad_step, *s0.steps[1:]))
    with pytest.raises(ScheduleError):
        verify([bad, *good[1:]])


# --- single tree --------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_tree_verifies(n):
    tree = binary_tree(flat_links(n), n // 2)
    d = balanced_depth(n)
    for c in counts(n):
        scheds = tree_schedules(n, c, tree)
        verify(scheds)
        assert all(s.nsteps == 2 * d for s in scheds)
    scheds = tree_schedules(n, 10_007, tree, segments=3)
    verify(scheds)
    assert all(s.nsteps == (2 * (d + 2) if n > 1 else 0) for s in scheds)


@pytest.mark.parametrize("root", range(8))
def test_tree_on_p3_trees(root):
    tree = binary_tree(preset("p3.16xlarge"), root)
    for segments in (1, 2, 5):
        scheds = tree_schedules(8, 1001, tree, segments)
        verify(scheds)
        # the root receives the whole range once per child, nothing is sent by it upward
        root_sched = scheds[root]
        reduced = sum(r.n for st in root_sched.steps for r in st.recvs if r.reduce)
        assert reduced == 1001 * len(tree.children[root])


def test_tree_messages_follow_tree_edges():
    tree = binary_tree(bcube_links((3, 3)), 4)
    edges = {frozenset(e) for e in tree.edges}
    for s in tree_schedules(9, 90, tree):
        for st in s.steps:
            for t in (*st.sends, *st.recvs):
                assert frozenset((s.rank, t.peer)) in edges


def test_tree_deeper_than_balanced_still_verifies():
    w = np.zeros((8, 8))
    for i in range(7):
        w[i, i + 1] = w[i + 1, i] = 1
    tree = binary_tree(w, 0)  # a path: 7 steps
    for segments in (1, 4):
        scheds = tree_schedules(8, 77, tree, segments)
        verify(scheds)
        assert scheds[0].nsteps == 2 * (7 + segments - 1)


def test_tree_bad_inputs():
    tree = binary_tree(flat_links(4), 0)
    with pytest.raises(ValueError, match="4 nodes"):
        tree_schedule(0, 5, 10, tree)
    with pytest.raises(ValueError):
        tree_schedule(0, 4, 10, tree, segments=0)
    with pytest.raises(ValueError):
        tree_schedule(4, 4, 10, tree)


# --- multi-tree ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_multitree_verifies(n):
    base = binary_tree(flat_links(n), 0)
    trees = [rotated(base, k) for k in range(n)]
    d = balanced_depth(n)
    for c in counts(n):
        scheds = multitree_schedules(n, c, trees)
        verify(scheds)
        assert all(s.nsteps == 2 * d for s in scheds)
    verify(multitree_schedules(n, 10_007, trees, segments=3))


@pytest.mark.parametrize("name, w", [("p3.16xlarge", preset("p3.16xlarge")),
                                     ("bcube3x3", bcube_links((3, 3))),
                                     ("bcube4x4", bcube_links((4, 4))),
                                     ("bcube2x2x3", bcube_links((2, 2, 3)))])
def test_multitree_on_generated_trees(name, w):
    n = len(w)
    trees = multi_trees(w)
    for c in counts(n):
        verify(multitree_schedules(n, c, trees))
    verify(multitree_schedules(n, 100_003, trees, segments=4))
    # range i goes to root i: rank i reduce-receives only elements of its own range
    count = n * 10
    for s in multitree_schedules(n, count, trees):
        lo, hi = s.rank * 10, s.rank * 10 + 10
        root_steps = [r for st in s.steps for r in st.recvs
                      if r.reduce and r.stream == s.rank]
        assert root_steps and all(lo <= r.lo and r.hi <= hi for r in root_steps)


def test_multitree_streams_and_bytes():
    n, per = 8, 12
    trees = multi_trees(preset("p3.16xlarge"))
    scheds = multitree_schedules(n, n * per, trees)
    for s in scheds:
        assert s.streams == n
        for st in s.steps:
            assert {t.stream for t in (*st.sends, *st.recvs)} <= set(range(n))
    # each tree moves its range over each of its n-1 edges, up and down
    total = sum(s.sent_elements() for s in scheds)
    assert total == n * 2 * (n - 1) * per
    assert math.isclose(total / n, 2 * (n - 1) / n * n * per)


def test_multitree_bad_inputs():
    trees = multi_trees(flat_links(4))
    with pytest.raises(ValueError, match="need 4 trees"):
        multitree_schedule(0, 4, 10, trees[:3])
    with pytest.raises(ValueError):
        multitree_schedule(0, 4, -1, trees)
