"""The pipelined meet (:mod:`bmlmpi.schedules.meet`): every rank's schedule verified at
N = 1..64 (every position ends with every rank's addend once, transfers matched, no
hazard), every reduction taking the addends themselves at once, pieces on whole units."""

import pytest

from bmlmpi.schedules import meet
from bmlmpi.schedules.ring import ring_schedules
from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer
from bmlmpi.schedules.verify import verify


@pytest.mark.parametrize("size", range(1, 65))
def test_every_rank_count_delivers_the_sum_of_the_addends_themselves(size):
    for count in sorted({0, 1, 256 * size + 7}):
        for pieces in (1, 3):
            for unit in (1, 256):
                scheds = meet.meet_schedules(size, count, pieces, unit)
                verify(scheds)
                meet.meets_every_addend(scheds)


def test_blocks_and_pieces_fall_on_whole_units():
    for size, count, pieces, unit in ((3, 70000, 4, 256), (5, 1000, 3, 128), (2, 513, 2, 256)):
        for s in meet.meet_schedules(size, count, pieces, unit):
            assert all(b % unit == 0 or b == count for b in s.meta["blocks"])
            for step in s.steps:
                for t in (*step.sends, *step.recvs):
                    assert t.lo % unit == 0 and (t.hi % unit == 0 or t.hi == count), (t, unit)
            assert len(s.steps) <= pieces + 1


def test_a_schedule_of_partial_sums_is_refused():
    """The ring beyond two ranks reduces partial sums, not the addends; a schedule that
    sends on what it received to be reduced again is refused too."""
    with pytest.raises(AssertionError, match="not every other rank at once"):
        meet.meets_every_addend(ring_schedules(3, 300))
    meet.meets_every_addend(ring_schedules(2, 300))   # at two ranks the ring meets
    relay = [Schedule("relay", r, 3, 4, (
        Step((Transfer(2, 0, 4),) if r == 1 else (), (Recv(1, 0, 4, reduce=True),)
             if r == 2 else ()),)) for r in range(3)]
    with pytest.raises(AssertionError, match="not every other rank"):
        meet.meets_every_addend(relay)
    steps = {0: (Step((Transfer(1, 0, 4),)), Step((Transfer(2, 0, 4),))),
             1: (Step((), (Recv(0, 0, 4),)), Step((Transfer(2, 0, 4),))),
             2: (Step(), Step((), (Recv(0, 0, 4, reduce=True), Recv(1, 0, 4, reduce=True))))}
    forwarded = [Schedule("forward", r, 3, 4, steps[r]) for r in range(3)]
    with pytest.raises(AssertionError, match="not its own addends"):
        meet.meets_every_addend(forwarded)


def test_pieces_follow_the_step_bytes():
    assert meet.meet_pieces(0, 4, 2) == 1
    assert meet.meet_pieces(64 << 18, 4, 2) == (64 << 20) // meet.MEET_STEP_BYTES
    assert meet.meet_pieces(1 << 40, 8, 4) == meet.MAX_MEET_PIECES
    with pytest.raises(ValueError, match="itemsize"):
        meet.meet_pieces(10, 0, 2)
    with pytest.raises(ValueError, match="rank"):
        meet.meet_schedule(2, 2, 10)
