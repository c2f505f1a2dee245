"""Bad input raises a clear error on every rank, never a hang or wrong data."""

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi


def _outcome(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        return type(exc).__name__, str(exc)
    return None, ""


def _expect_everywhere(comm, fn, types, text=None):
    kind, msg = _outcome(fn)
    failures = []
    if kind not in types:
        failures.append(f"raised {kind}: {msg}")
    elif text and text not in msg and kind != "RemoteArgumentError":
        failures.append(f"message {msg!r} lacks {text!r}")
    all_ranks_agree(comm, failures)


@pytest.fixture
def ctx(comm):
    c = bmlmpi.Communicator(comm, algorithm="bml", timeout=30)
    yield c
    c.Free()


@pytest.mark.mpi
def test_count_differs_across_ranks(comm, ctx):
    n = 10 + (comm.rank == comm.size - 1)
    x, y = np.ones(n), np.empty(n)
    if comm.size == 1:
        pytest.skip("needs two ranks")
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, y), {"ArgumentMismatch"}, "differ")


@pytest.mark.mpi
def test_dtype_differs_across_ranks(comm, ctx):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    dt = np.float32 if comm.rank == 0 else np.float64
    x, y = np.ones(8, dt), np.empty(8, dt)
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, y), {"ArgumentMismatch"})


@pytest.mark.mpi
def test_op_differs_across_ranks(comm, ctx):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    op = MPI.SUM if comm.rank == 0 else MPI.MAX
    x, y = np.ones(8), np.empty(8)
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, y, op=op), {"ArgumentMismatch"})


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", bmlmpi.algorithms())
def test_unsupported_dtype_and_op(comm, algorithm):
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm, timeout=30)
    b = np.ones(4, bool)
    _expect_everywhere(comm, lambda: ctx.Allreduce(b, b.copy()), {"TypeError"}, "dtype")
    c = np.ones(4, np.complex64)
    _expect_everywhere(comm, lambda: ctx.Allreduce(c, c.copy(), op=MPI.MAX), {"TypeError"},
                       "complex")
    x = np.ones(4)
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, x.copy(), op=MPI.BAND), {"ValueError"},
                       "unsupported reduction op")
    ctx.Free()


@pytest.mark.mpi
def test_read_only_recvbuf_on_one_rank(comm, ctx):
    x = np.ones(16)
    y = np.empty(16)
    if comm.rank == 0:
        y.flags.writeable = False
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, y),
                       {"BufferSpecError", "RemoteArgumentError"}, "read-only")


@pytest.mark.mpi
def test_too_small_recvbuf(comm, ctx):
    x, y = np.ones(16), np.empty(15)
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, y), {"BufferSpecError"}, "fewer")


@pytest.mark.mpi
def test_non_contiguous_refused(comm, ctx):
    x = np.ones((8, 8))[:, ::2]
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, np.empty(32)), {"BufferSpecError"},
                       "contiguous")


@pytest.mark.mpi
def test_mismatched_send_recv_dtypes_and_overlap(comm, ctx):
    x = np.ones(8, np.float32)
    _expect_everywhere(comm, lambda: ctx.Allreduce(x, np.empty(8)), {"BufferSpecError"},
                       "differs")
    z = np.ones(16)
    _expect_everywhere(comm, lambda: ctx.Allreduce(z[:8], z[4:12]), {"BufferSpecError"},
                       "overlap")


@pytest.mark.mpi
def test_bad_topology_and_algorithm(comm):
    _expect_everywhere(comm, lambda: bmlmpi.Communicator(comm, topology=f"{comm.size + 1}"),
                       {"ValueError"}, "servers")
    _expect_everywhere(comm, lambda: bmlmpi.Communicator(comm, algorithm="quantum"),
                       {"ValueError"}, "unknown algorithm")


@pytest.mark.mpi
def test_missing_rank_hits_the_deadline_not_a_hang(comm):
    """A rank that never joins: the others fail within the deadline, naming the step and it."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    ctx = bmlmpi.Communicator(comm, algorithm="bml", timeout=1.5, validate=False)
    x, y = np.ones(64), np.empty(64)
    failures = []
    if comm.rank != 0:
        kind, msg = _outcome(lambda: ctx.Allreduce(x, y))
        # its own deadline, or the notice of another waiting rank that gave up first
        if kind not in ("DeadlineExceeded", "CommunicatorRevoked"):
            failures.append(f"raised {kind}: {msg}")
        elif "step" not in msg:
            failures.append(f"message lacks the step: {msg}")
    comm.Barrier()
    all_ranks_agree(comm, failures)
    ctx.Free()


@pytest.mark.mpi
def test_an_empty_spec_on_one_rank_fails_every_rank(comm, ctx):
    y = np.empty(8)
    bad = comm.rank == comm.size - 1
    types = {"BufferSpecError"} if bad else {"RemoteArgumentError"}
    _expect_everywhere(comm, lambda: ctx.Allreduce(np.ones(8), [] if bad else y), types,
                       "empty buffer spec")
