"""The blocking path of a scheduled signature (its calls after the checked first call build
the Run straight from the cached plan) gives exactly what the checked path gives: the exact
reduction of position- and rank-dependent data for every algorithm, dtype and op, in place
and not; the checked path's errors on every rank for bad buffers of the same shapes; a
DeadlineExceeded naming the step when a rank is missing.

Every case calls three times: the first takes the checked path, the next two must take the
fast one (its per-signature counter tells).

Every datatype runs at 1-4 ranks; at 5, 6, 8, 9 and 12 ranks the datatypes of
``conftest.DTYPES_BEYOND_4`` (one of each element size and kernel family) run with every
algorithm, op, shape and mode, so a misplaced range fails at every N (tests/mpi/conftest.py
says why)."""

import numpy as np
import pytest
from conftest import ALL_DTYPES, OP_IDS, OPS, all_ranks_agree, rank_input, reference
from fast_path_misuse import error_of, misuse_failures, mutation_failures, resize_failures
from mpi4py import MPI

import bmlmpi

ALGORITHMS = ["bml", "ring", "tree", "multitree"]


def fast_calls(ctx) -> int:
    return sum(e.calls for e in ctx._fast_path.entries.values() if e.plan is not None)


@pytest.fixture(params=ALGORITHMS)
def ctx(comm, request):
    c = bmlmpi.Communicator(comm, algorithm=request.param, timeout=30)
    request.addfinalizer(c.Free)
    return c


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[np.dtype(d).name for d in ALL_DTYPES])
@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
def test_fast_path_gives_the_exact_reduction(comm, ctx, dtype, op):
    if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
        pytest.skip("MIN/MAX are not defined for complex")
    failures = []
    for n, shape in [(1, (1,)), (13, (13,)), (15, (3, 5)), (4099, (4099,))]:
        send = rank_input(n, comm.rank, dtype, op).reshape(shape)
        want = reference(n, comm.size, dtype, op).reshape(shape)
        before = fast_calls(ctx)
        for i in range(3):
            recv = np.full(shape, 77, dtype)  # garbage the result must overwrite
            ctx.Allreduce(send, recv, op)
            if not np.array_equal(recv, want):
                failures.append(f"{shape} call {i}: {recv.ravel()[:8]} != {want.ravel()[:8]}")
            inplace = send.copy()
            ctx.Allreduce(MPI.IN_PLACE, inplace, op)
            if not np.array_equal(inplace, want):
                failures.append(f"{shape} IN_PLACE call {i}")
        if not np.array_equal(send, rank_input(n, comm.rank, dtype, op).reshape(shape)):
            failures.append(f"{shape}: sendbuf was written")
        if fast_calls(ctx) - before != 4:
            failures.append(f"{shape}: {fast_calls(ctx) - before} fast calls, not 4")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_ring_segments_and_large_counts(comm):
    """Several ring segments per chunk (a chunk over 2 MiB, segments of 1 MiB): several lanes
    on the fast path."""
    ctx = bmlmpi.Communicator(comm, algorithm="ring", timeout=60)
    n = (1 << 18) * comm.size + 3
    send = rank_input(n, comm.rank, np.float64, MPI.SUM)
    want = reference(n, comm.size, np.float64, MPI.SUM)
    failures = []
    for i in range(3):
        recv = np.full(n, -1.0)
        ctx.Allreduce(send, recv, MPI.SUM)
        if not np.array_equal(recv, want):
            failures.append(f"call {i}: {np.flatnonzero(recv != want)[:5]} differ")
    if fast_calls(ctx) != 2:
        failures.append(f"{fast_calls(ctx)} fast calls, not 2")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_module_level_calls_and_an_outstanding_iallreduce(comm):
    """The module-level drop-in takes the same path; with an Iallreduce outstanding a blocking
    call takes the checked path (tags and progress stay in order) and both are right."""
    send = rank_input(1000, comm.rank, np.int64, MPI.SUM)
    want = reference(1000, comm.size, np.int64, MPI.SUM)
    failures = []
    for _ in range(3):
        recv = np.empty(1000, np.int64)
        bmlmpi.Allreduce(send, recv, MPI.SUM, comm=comm, algorithm="ring")
        if not np.array_equal(recv, want):
            failures.append("module-level ring")
    ctx = bmlmpi.Communicator(comm, algorithm="bml", timeout=30)
    for _ in range(2):
        ctx.Allreduce(send, np.empty(1000, np.int64))
    before = fast_calls(ctx)
    big = 1 << 18  # a rendezvous: still outstanding after Iallreduce's first poll
    big_send = rank_input(big, comm.rank, np.int64, MPI.SUM)
    pending_out = np.empty(big, np.int64)
    req = ctx.Iallreduce(big_send, pending_out)
    outstanding = bool(ctx._active)
    recv = np.empty(1000, np.int64)
    ctx.Allreduce(send, recv)
    req.Wait()
    if outstanding and fast_calls(ctx) != before:
        failures.append("the fast path ran beside an outstanding Iallreduce")
    if not (np.array_equal(recv, want)
            and np.array_equal(pending_out, reference(big, comm.size, np.int64, MPI.SUM))):
        failures.append("blocking call beside an Iallreduce")
    fast_before = fast_calls(ctx)
    ctx.Allreduce(send, recv)
    if fast_calls(ctx) != fast_before + 1 or not np.array_equal(recv, want):
        failures.append("the fast path after the Iallreduce completed")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_bad_buffers_after_the_signature_opened_the_fast_path(comm, ctx):
    send = rank_input(16, comm.rank, np.float64, MPI.SUM)
    want = reference(16, comm.size, np.float64, MPI.SUM)
    recv = np.empty(16)
    for _ in range(2):
        ctx.Allreduce(send, recv, MPI.SUM)
    failures = misuse_failures(ctx, send, recv, want)
    # the same memory under two names is an in-place call
    same = send.copy()
    ctx.Allreduce(same, same, MPI.SUM)
    if not np.array_equal(same, want):
        failures.append("same array twice")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_the_same_arrays_changed_in_place_after_the_fast_path_opened(comm, ctx):
    """The remembered pair of arrays (the fast path skips the signature lookup for it),
    changed in place: each change takes the checked path's error or gives the reduction."""
    send = rank_input(16, comm.rank, np.float64, MPI.SUM)
    want = reference(16, comm.size, np.float64, MPI.SUM)
    recv = np.empty(16)
    for _ in range(2):
        ctx.Allreduce(send, recv, MPI.SUM)
    failures = mutation_failures(ctx, send, recv, want, lambda: fast_calls(ctx))
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_missing_rank_on_the_fast_path_hits_the_deadline(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    ctx = bmlmpi.Communicator(comm, algorithm="ring", timeout=1.5)
    x, y = np.ones(64), np.empty(64)
    for _ in range(2):
        ctx.Allreduce(x, y)
    failures = []
    kind = None
    if comm.rank != 0:
        before = fast_calls(ctx)
        kind, msg = error_of(lambda: ctx.Allreduce(x, y))
        # A rank whose own deadline comes second may first get the notice of the rank that
        # gave up (docs/contracts.md): CommunicatorRevoked, which is a DeadlineExceeded.
        if not (kind == "DeadlineExceeded" and "step" in msg
                or kind == "CommunicatorRevoked"):
            failures.append(f"raised {kind}: {msg}")
        if fast_calls(ctx) != before + 1:
            failures.append("the call did not take the fast path")
    kinds = comm.allgather(kind)
    if comm.rank == 0 and "DeadlineExceeded" not in kinds:
        failures.append(f"no rank reached its own deadline: {kinds}")
    comm.Barrier()
    all_ranks_agree(comm, failures)
    ctx.Free()


@pytest.mark.mpi
def test_the_fast_path_keeps_the_arrays_resizable(comm, ctx):
    want = reference(16, comm.size, np.float64, MPI.SUM)
    all_ranks_agree(comm, resize_failures(
        ctx, lambda: rank_input(16, comm.rank, np.float64, MPI.SUM), want))
