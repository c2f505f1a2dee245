import pytest

from bmlmpi.schedules.ps import ps_schedule, ps_schedules
from bmlmpi.schedules.verify import verify


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 12, 16])
def test_ps_verifies(n):
    for count in sorted({0, 1, n - 1, n, n + 1, 3 * n + 2, 1001}):
        verify(ps_schedules(n, count))


@pytest.mark.parametrize("n", [2, 3, 7, 9])
def test_ps_steps_and_volume(n):
    count = 5 * n
    for s in ps_schedules(n, count):
        assert s.nsteps == 2
        push, pull = s.steps
        assert len(push.sends) == len(pull.recvs) == n - 1
        assert {t.peer for t in push.sends} == set(range(n)) - {s.rank}
        assert all(t.reduce for t in push.recvs) and not any(t.reduce for t in pull.recvs)
        assert s.sent_elements() == s.received_elements() == 2 * (n - 1) * count // n


def test_ps_one_rank_and_bad_input():
    assert ps_schedule(0, 1, 10).nsteps == 0
    with pytest.raises(ValueError):
        ps_schedule(3, 3, 10)
    with pytest.raises(ValueError):
        ps_schedule(0, 3, -1)
