"""The toy collective of tests/toy_collective.py (``reverse``: rank r receives rank
size - 1 - r's block), registered from its files alone, runs blocking, non-blocking and
persistent through the pipeline's entry for a collective (``Communicator.family``), on the
plain and the fault-tolerant communicator (where the launch has failure mitigation:
tests/test_toy_collective_launch.py), with position- and rank-dependent data."""

import numpy as np
import pytest
from mpi4py import MPI
from toy_collective import ALGORITHM, NAME, builder, registered

import bmlmpi
from bmlmpi.ft.errors import ulfm_support


def _block(rank: int, n: int) -> np.ndarray:
    return rank * 1000 + np.arange(n, dtype=np.int64) * 7 + 1


@pytest.fixture(params=[False, True], ids=["plain", "fault_tolerant"])
def toy_comm(request):
    if request.param and not ulfm_support(MPI.COMM_WORLD)[0]:
        # the suite's launch has no failure mitigation; tests/test_toy_collective_launch.py
        # launches this file with it (bmlmpi-run --ft) and requires both to pass
        pytest.skip("the fault-tolerant communicator needs a launch with bmlmpi-run --ft")
    with registered():
        c = bmlmpi.Communicator(MPI.COMM_WORLD, fault_tolerant=request.param)
        try:
            yield c
        finally:
            c.Free()


@pytest.mark.mpi
def test_the_toy_runs_blocking_nonblocking_and_persistent(toy_comm):
    c = toy_comm
    rank, size = c.rank, c.size
    partner = size - 1 - rank
    family = c.family
    for n in (1, 5, 1000):
        send, recv = _block(rank, n), np.full(n, -1, np.int64)
        family.blocking(NAME, ALGORITHM, builder(c, send, recv))       # twice: a repeat
        assert np.array_equal(recv, _block(partner, n))
        recv[:] = -1
        family.blocking(NAME, ALGORITHM, builder(c, send, recv))
        assert np.array_equal(recv, _block(partner, n))
        recv[:] = -1
        family.start(NAME, ALGORITHM, builder(c, send, recv)).Wait()
        assert np.array_equal(recv, _block(partner, n))
        req = family.init(NAME, None, builder(c, send, recv))           # auto: toyrev
        for k in range(2):
            send[:] = _block(rank + k, n)
            recv[:] = -1
            req.Start()
            req.Wait()
            assert np.array_equal(recv, _block(partner + k, n))
        req.Free()


@pytest.mark.mpi
def test_a_rank_whose_toy_arguments_are_wrong_raises_on_every_rank(toy_comm):
    c = toy_comm
    send = _block(c.rank, 4)
    recv = np.zeros(4, np.int32 if c.rank == 0 else np.int64)
    with pytest.raises((TypeError, bmlmpi.RemoteArgumentError)):
        c.family.blocking(NAME, ALGORITHM, builder(c, send, recv))
