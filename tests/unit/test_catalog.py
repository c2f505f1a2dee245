"""The algorithm records: every name gives the schedule its module builds, verified, and the
survivors' BCube-preserving schedule only where it applies."""

from __future__ import annotations

import pytest

from bmlmpi.ft.recovery import bcube_preserving, bcube_recovery_schedule
from bmlmpi.schedules import algorithms
from bmlmpi.schedules.algorithms import Context
from bmlmpi.schedules.bml import bml_schedule
from bmlmpi.schedules.ring import ring_pipeline, ring_schedule, ring_segments
from bmlmpi.schedules.tree import tree_schedule
from bmlmpi.schedules.verify import verify
from bmlmpi.topology.links import preset
from bmlmpi.topology.trees import binary_tree


def schedule(name, rank, size, count, itemsize, shape=None, links=None):
    return algorithms.build(name, Context(size, count, itemsize, rank, shape=shape,
                                          links=links))


@pytest.mark.parametrize("name", sorted(algorithms.scheduled("allreduce")))
@pytest.mark.parametrize("size", [1, 2, 5, 8, 9])
def test_every_schedule_of_the_catalog_verifies(name, size):
    verify(algorithms.schedules(name, Context(size, 1001, 4)))


def test_the_catalog_builds_what_the_algorithm_modules_build():
    assert schedule("bml", 4, 9, 100, 8, "3x3") == bml_schedule(4, 9, 100, (3, 3))
    assert schedule("ring", 1, 4, 1 << 20, 4) == \
        ring_schedule(1, 4, 1 << 20, ring_segments(1 << 20, 4, 4))
    # two ranks: pipelined pieces instead of concurrent segments
    assert schedule("ring", 1, 2, 1 << 24, 4) == \
        ring_schedule(1, 2, 1 << 24, 1, ring_pipeline(1 << 24, 4, 2))
    assert ring_pipeline(1 << 24, 4, 2) == 16
    # BML on BCube(2) is the same exchange: pipelined alike
    assert schedule("bml", 0, 2, 1 << 24, 4) == \
        bml_schedule(0, 2, 1 << 24, (2,), ring_pipeline(1 << 24, 4, 2))
    assert schedule("bml", 0, 2, 1 << 24, 4).nsteps == 17
    assert schedule("bml", 0, 2, 1 << 18, 4).nsteps == 2  # 1 MiB: one piece
    w = preset("p3.16xlarge")
    assert schedule("tree", 3, 8, 100, 4, links=w) == \
        tree_schedule(3, 8, 100, binary_tree(w, 0))
    with pytest.raises(ValueError, match="no schedule"):
        schedule("native", 0, 2, 10, 4)


def test_bcube_preserving_only_for_bml_after_a_failure():
    assert bcube_preserving("bml", 1, (3, 3), (0,), 100) == \
        bcube_recovery_schedule(1, (3, 3), (0,), 100)
    assert bcube_preserving("ring", 1, (3, 3), (0,), 100) is None
    assert bcube_preserving("bml", 1, (3, 3), (), 100) is None
    assert bcube_preserving("bml", 0, (2, 2), (1, 2), 100) is None  # none exists
