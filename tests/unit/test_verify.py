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


def _messages(size: int, steps: list[list[tuple[int, int, bool]]]) -> list[Schedule]:
    """An allreduce of one element from steps of (sender, receiver, reduce) messages."""
    out = []
    for r in range(size):
        out.append(Schedule("toy", r, size, 1, tuple(
            Step(tuple(Transfer(b, 0, 1) for a, b, _ in st if a == r),
                 tuple(Recv(a, 0, 1, reduce=red) for a, b, red in st if b == r))
            for st in steps)))
    return out


def test_ranks_reducing_one_element_in_one_order_pass():
    # ranks 0 and 3 both reduce the element, as (x0 + x1) + (x2 + x3) and
    # (x2 + x3) + (x0 + x1): one operation on the same operands, the same bits
    verify(_messages(4, [[(1, 0, True), (3, 2, True)],
                         [(0, 1, False), (2, 3, False)],
                         [(2, 0, True), (1, 3, True)],
                         [(0, 2, False), (3, 1, False)]]))


def test_ranks_reducing_one_element_in_two_orders_fail():
    # every count is right, but rank 3 folds ((x2 + x3) + x0) + x1 while the others hold
    # (x0 + x1) + (x2 + x3): in floating point the last bits differ
    with pytest.raises(ScheduleError, match=r"rank 3: .*another order than rank 0"):
        verify(_messages(4, [[(3, 2, True)],
                             [(2, 3, False)],
                             [(0, 3, True)],
                             [(1, 0, True), (1, 3, True)],
                             [(2, 0, True)],
                             [(0, 1, False), (0, 2, False)]]))
