"""bmlmpi.deferred: the input copies a run with a separate input still makes (the lane
simulator in test_lanes.py runs every algorithm with them; these check the pieces)."""

import random

from bmlmpi.deferred import analyse, touch, untouched
from bmlmpi.execute import Plan
from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.ring import ring_schedules


def test_intervals_against_a_set_of_elements():
    rng = random.Random(5)
    for _ in range(300):
        touched, covered = [], set()
        for _ in range(rng.randrange(6)):
            lo = rng.randrange(40)
            hi = lo + rng.randrange(10)
            touched = touch(touched, lo, hi)
            covered |= set(range(lo, hi))
        assert all(a < b for a, b in touched)
        assert all(b < c for (_, b), (c, _) in zip(touched[:-1], touched[1:], strict=True))
        assert {x for a, b in touched for x in range(a, b)} == covered
        lo = rng.randrange(50)
        hi = lo + rng.randrange(20)
        parts = untouched(touched, lo, hi)
        assert {x for a, b in parts for x in range(a, b)} == set(range(lo, hi)) - covered


def test_no_steps_copies_everything_at_the_end():
    assert analyse([], 7).final == ((0, 7),)


def test_two_ranks_send_from_the_input_and_copy_only_the_reduced_half():
    for sched in (bml_schedules(2, 1000, (2,))[0], ring_schedules(2, 1000, segments=1)[0]):
        plan = Plan(sched, [None], lambda level, peer: (0, peer))
        d = plan.deferred()
        steps = [st for lane in d.lanes for st in lane]
        assert all(not st.before_post for st in steps)
        assert steps[0].send_from_input == (True,)  # the reduce-scatter sends the input
        assert sum(b - a for st in steps for parts in st.before_reduce
                   for a, b in parts) == 500  # half the buffer, once
        assert d.final == ()


def test_two_ranks_reduce_in_one_pass_from_the_input():
    """At N = 2 every reduction of ring and BML covers a range that still holds only the input
    and has one source: the executor writes input op scratch instead of copy then reduce."""
    for sched in (bml_schedules(2, 1000, (2,))[1], ring_schedules(2, 1000, segments=3)[1],
                  ring_schedules(2, 1000, pipeline=4)[0], bml_schedules(2, 1000, (2,), 4)[0]):
        plan = Plan(sched, [None], lambda level, peer: (0, peer))
        steps = [st for lane in plan.deferred().lanes for st in lane]
        flags = [c for st in steps for c in st.combine]
        assert flags and all(flags)
        assert len(flags) == sum(len(st.before_reduce) for st in steps)


def test_a_reduction_over_data_already_received_is_not_combined():
    # BML on 3x3: the second reduce-scatter step folds into part of the block the first one
    # reduced into, so that range holds data and is reduced in place, never combined
    seen_false = False
    for sched in bml_schedules(9, 999, (3, 3)):
        plan = Plan(sched, [None], lambda level, peer: (0, peer))
        for lane, copies in zip(plan.lanes, plan.deferred().lanes, strict=True):
            for sp, st in zip(lane, copies, strict=True):
                for (lo, hi, offs), parts, flag in zip(sp.reduces, st.before_reduce,
                                                       st.combine, strict=True):
                    assert flag == (len(offs) == 1 and parts == ((lo, hi),))
                    seen_false |= not flag
    assert seen_false
