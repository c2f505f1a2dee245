"""The verifier must reject broken schedules; otherwise passing it proves nothing."""

import dataclasses

import pytest

from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer, balanced_bounds
from bmlmpi.schedules.verify import ScheduleError, verify


def _replace_step(s: Schedule, i: int, step: Step) -> Schedule:
    steps = list(s.steps)
    steps[i] = step
    return dataclasses.replace(s, steps=tuple(steps))


def good():
    return bml_schedules(9, 36, (3, 3))


def test_good_schedule_passes():
    verify(good())


def test_missing_schedule_rejected():
    with pytest.raises(ScheduleError, match="expected"):
        verify(good()[:-1])


def test_unmatched_send_rejected():
    s = good()
    st = s[0].steps[0]
    s[0] = _replace_step(s[0], 0, Step(st.sends[1:], st.recvs))
    with pytest.raises(ScheduleError, match="sends"):
        verify(s)


def test_misplaced_range_rejected():
    s = good()
    for r in range(9):  # shift one range on both sides, so matching still holds
        st = s[r].steps[3]
        sends = tuple(dataclasses.replace(t, lo=t.lo, hi=t.hi) for t in st.sends)
        s[r] = _replace_step(s[r], 3, Step(sends, st.recvs))
    verify(s)
    # now drop the last allgather step everywhere: results incomplete
    bad = [dataclasses.replace(x, steps=x.steps[:-1]) for x in good()]
    with pytest.raises(ScheduleError, match="exactly once"):
        verify(bad)


def test_double_count_rejected():
    s = good()
    # turn an allgather copy into a reduce: the piece is counted twice
    x = s[4]
    st = x.steps[3]
    recvs = (dataclasses.replace(st.recvs[0], reduce=True),) + st.recvs[1:]
    s[4] = _replace_step(x, 3, Step(st.sends, recvs))
    with pytest.raises(ScheduleError):
        verify(s)


def test_read_write_hazard_rejected():
    sched = [
        Schedule("t", 0, 2, 4, (Step((Transfer(1, 0, 4),), (Recv(1, 0, 4, reduce=True),)),)),
        Schedule("t", 1, 2, 4, (Step((Transfer(0, 0, 4),), (Recv(0, 0, 4, reduce=True),)),)),
    ]
    with pytest.raises(ScheduleError, match="written while"):
        verify(sched)


def test_bad_peer_and_range_rejected():
    s = [Schedule("t", 0, 2, 4, (Step((Transfer(0, 0, 4),), ()),)),
         Schedule("t", 1, 2, 4, ())]
    with pytest.raises(ScheduleError, match="bad peer"):
        verify(s)
    s = [Schedule("t", 0, 2, 4, (Step((Transfer(1, 2, 9),), ()),)),
         Schedule("t", 1, 2, 4, (Step((), (Recv(0, 2, 9),)),))]
    with pytest.raises(ScheduleError, match="bad range"):
        verify(s)


def test_balanced_bounds():
    assert balanced_bounds(0, 10, 3) == [0, 4, 7, 10]
    assert balanced_bounds(5, 7, 4) == [5, 6, 7, 7, 7]
    assert balanced_bounds(0, 0, 2) == [0, 0, 0]
    with pytest.raises(ValueError):
        balanced_bounds(0, 1, 0)
