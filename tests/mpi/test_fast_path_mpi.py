"""The blocking fast path (a native signature's calls after its checked first call go straight
to MPI_Allreduce) gives exactly what the checked path gives: mpi4py's results, and the same
errors on every rank when a later call of the same shapes passes a bad buffer.

Every case calls three times: the first call takes the checked, polled path; the next two
must take the fast path where docs/api.md says they do (the watchdog's call count tells)."""

import numpy as np
import pytest
from conftest import all_ranks_agree
from fast_path_misuse import error_of, misuse_failures, mutation_failures, resize_failures
from mpi4py import MPI

import bmlmpi

DTYPES = [np.float64, np.float32, np.int32, np.int64, np.complex128]
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def _data(comm, shape, dtype, order="C"):
    n = int(np.prod(shape))
    # position- and rank-dependent, small enough that PROD stays exact
    flat = (np.arange(n) % 3 + 1 + (comm.rank % 2)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        flat = flat + 1j * (np.arange(n) % 2)
    return np.array(flat.reshape(shape), order=order)


def _fast_calls(ctx) -> int:
    """The calls that took a fast path entry: the watchdog counts every blocking MPI call,
    the checked path's of an agreed native signature too (FastPath.blocking_native)."""
    return ctx._watchdog.calls - ctx._fast_path.checked_blocking


def _expected(comm, send, op):
    out = np.empty_like(send)
    comm.Allreduce(send, out, op)
    return out


@pytest.fixture
def ctx(comm, request):
    """A native communicator: every signature's calls after its first take the fast path."""
    native = bmlmpi.Communicator(comm, algorithm="native", timeout=30)
    request.addfinalizer(native.Free)
    return native


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opname", list(OPS))
def test_fast_path_results_equal_mpi4py(comm, ctx, dtype, opname):
    if np.dtype(dtype).kind == "c" and opname in ("min", "max"):
        pytest.skip("MIN/MAX are not defined for complex")
    op = OPS[opname]
    failures = []
    for shape, order in [((13,), "C"), ((3, 5), "C"), ((3, 5), "F")]:
        send = _data(comm, shape, dtype, order)
        want = _expected(comm, send, op)
        before = _fast_calls(ctx)
        for i in range(3):
            recv = np.zeros(shape, dtype, order=order)
            ctx.Allreduce(send, recv, op)
            if not np.array_equal(recv, want):
                failures.append(f"{shape} {order} call {i}: {recv} != {want}")
            inplace = send.copy(order="A")
            ctx.Allreduce(MPI.IN_PLACE, inplace, op)
            if not np.array_equal(inplace, want):
                failures.append(f"{shape} {order} IN_PLACE call {i}: {inplace} != {want}")
        # 2 later calls x 2 forms; the Fortran-ordered (3, 5) has the shapes and dtype of the
        # C-ordered one, whose first call opened the fast path (MPI takes memory order)
        fast = 6 if order == "F" else 4
        if _fast_calls(ctx) - before != fast:
            failures.append(f"{shape} {order}: {_fast_calls(ctx) - before} fast calls, "
                            f"not {fast}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_module_level_and_module_algorithms(comm):
    send = _data(comm, (17,), np.float64)
    want = _expected(comm, send, MPI.SUM)
    failures = []
    for _ in range(3):
        recv = np.empty(17)
        bmlmpi.Allreduce(send, recv, MPI.SUM, comm=comm, algorithm="NATIVE")
        if not np.array_equal(recv, want):
            failures.append(f"module-level: {recv} != {want}")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_forms_the_fast_path_leaves_to_the_checked_path(comm, ctx):
    failures = []
    send = _data(comm, (8,), np.float64)
    want = _expected(comm, send, MPI.SUM)
    before = _fast_calls(ctx)
    for _ in range(3):
        # in place spelled with two names: the same memory, always the checked path
        same = send.copy()
        ctx.Allreduce(same, same, MPI.SUM)
        if not np.array_equal(same, want):
            failures.append(f"same array twice: {same} != {want}")
        # a receive buffer longer than the send: count from the send
        big = np.full(12, -1.0)
        ctx.Allreduce(send, big, MPI.SUM)
        if not (np.array_equal(big[:8], want) and np.all(big[8:] == -1)):
            failures.append(f"longer recvbuf: {big}")
        # AVG is bmlmpi's own op
        avg = np.empty(8)
        ctx.Allreduce(send, avg, bmlmpi.AVG)
        if not np.allclose(avg, want / comm.size):
            failures.append(f"AVG: {avg}")
    if _fast_calls(ctx) != before:
        failures.append(f"{_fast_calls(ctx) - before} fast calls for forms it leaves")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_bad_buffers_after_the_signature_opened_the_fast_path(comm, ctx):
    """Same shapes and dtype as a signature on the fast path, but a buffer MPI must not take:
    the same error as on a first call, on every rank, and the communicator still works."""
    send = _data(comm, (16,), np.float64)
    want = _expected(comm, send, MPI.SUM)
    recv = np.empty(16)
    for _ in range(2):
        ctx.Allreduce(send, recv, MPI.SUM)
    failures = misuse_failures(ctx, send, recv, want)
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_module_level_forgets_a_freed_communicator(comm):
    """The module-level calls remember their last communicator; freeing it must leave the
    next call on it failing as it did before (MPI: invalid communicator), not reusing it."""
    dup = comm.Dup()
    send, recv = _data(comm, (5,), np.float64), np.empty(5)
    for _ in range(3):
        bmlmpi.Allreduce(send, recv, MPI.SUM, comm=dup)
    dup.Free()
    kind, _ = error_of(lambda: bmlmpi.Allreduce(send, recv, MPI.SUM, comm=dup))
    all_ranks_agree(comm, [] if kind == "Exception" else [f"freed communicator: {kind}"])


@pytest.mark.mpi
def test_the_same_arrays_changed_in_place_after_the_fast_path_opened(comm, ctx):
    """The communicator remembers the last pair of arrays that took the fast path and skips
    the signature lookup when they come again: the same objects made read-only,
    non-contiguous, given another dtype or byte order, reshaped or resized must still take
    the checked path's error or give mpi4py's result."""
    send = _data(comm, (16,), np.float64)
    want = _expected(comm, send, MPI.SUM)
    recv = np.empty(16)
    for _ in range(2):
        ctx.Allreduce(send, recv, MPI.SUM)
    failures = mutation_failures(ctx, send, recv, want, lambda: _fast_calls(ctx))
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_the_fast_path_keeps_the_arrays_resizable(comm, ctx):
    send = _data(comm, (16,), np.float64)
    want = _expected(comm, send, MPI.SUM)
    all_ranks_agree(comm, resize_failures(ctx, lambda: _data(comm, (16,), np.float64), want))


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "auto", "ring", "ring-fresh",
                                       "ring-reproducible"])
def test_a_blocking_call_while_some_ranks_have_a_call_outstanding(comm, algorithm):
    """What mpi4py runs, bmlmpi runs: the even ranks start a non-blocking call of a signature
    on the fast path and make the next blocking call before they wait; the odd ranks wait
    first. Every rank must make the same MPI call for the blocking one (MPI never matches a
    blocking collective with a non-blocking one): a rank with calls outstanding completes
    them first (docs/api.md), for the allreduce and the rest of the family. The checked
    path too: ``auto`` timing its candidates, a blocking call of a new signature each round
    (``-fresh``), the reproducible mode (``-reproducible``); its argument check must not
    wait for ranks that wait for this rank's part of the earlier call."""
    algorithm, _, mode = algorithm.partition("-")
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm, timeout=30,
                              reproducible=mode == "reproducible")
    failures = []
    try:
        n = 24
        send = _data(comm, (n,), np.float64)
        want = _expected(comm, send, MPI.SUM)
        root = comm.size - 1
        for round_ in range(3):  # the first round opens every signature's fast path
            early = np.zeros(n)
            req = ctx.Iallreduce(send, early, MPI.SUM)
            if comm.rank % 2:
                req.Wait()
            blocking = np.zeros(n)
            if mode == "fresh":  # a signature of its own each round: checked every time
                fresh = np.zeros(n + round_ + 1)
                ctx.Allreduce(np.resize(send, n + round_ + 1), fresh, MPI.SUM)
                blocking = fresh[:n]
            else:
                ctx.Allreduce(send, blocking, MPI.SUM)
            reduced = np.zeros(n)
            ctx.Reduce(send, reduced, MPI.SUM, root)
            cast = send * (round_ + 1) if comm.rank == root else np.zeros(n)
            ctx.Bcast(cast, root)
            if not comm.rank % 2:
                req.Wait()
            if not np.array_equal(early, want) or not np.array_equal(blocking, want):
                failures.append(f"round {round_}: allreduce {early[:4]} / {blocking[:4]}, "
                                f"want {want[:4]}")
            if comm.rank == root and not np.array_equal(reduced, want):
                failures.append(f"round {round_}: reduce {reduced[:4]}, want {want[:4]}")
            root_send = _data(comm, (n,), np.float64) if comm.rank == root else None
            root_send = comm.bcast(root_send, root=root)
            if not np.array_equal(cast, root_send * (round_ + 1)):
                failures.append(f"round {round_}: bcast {cast[:4]}")
    finally:
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_a_blocking_native_call_whose_buffers_are_spelled_differently_on_some_ranks(comm):
    """mpi4py takes a buffer as an array on one rank and as ``[array, MPI.DOUBLE]`` on
    another: a native signature's later blocking calls must be the same MPI call on every
    rank however each spelled its buffers (the fast path opens for numpy arrays only)."""
    ctx = bmlmpi.Communicator(comm, algorithm="native", timeout=30)
    failures = []
    try:
        n = 10
        send = _data(comm, (n,), np.float64)
        want = _expected(comm, send, MPI.SUM)
        root = 0
        for round_ in range(4):
            out = np.zeros(n)
            if comm.rank % 2:
                ctx.Allreduce([send, MPI.DOUBLE], [out, MPI.DOUBLE], MPI.SUM)
            else:
                ctx.Allreduce(send, out, MPI.SUM)
            if not np.array_equal(out, want):
                failures.append(f"round {round_}: allreduce {out[:4]}, want {want[:4]}")
            cast = send * (round_ + 1) if comm.rank == root else np.zeros(n)
            ctx.Bcast([cast, MPI.DOUBLE] if comm.rank % 2 else cast, root)
            root_send = comm.bcast(send if comm.rank == root else None, root=root)
            if not np.array_equal(cast, root_send * (round_ + 1)):
                failures.append(f"round {round_}: bcast {cast[:4]}")
    finally:
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "reduce",
                                        "bcast"])
def test_the_communicators_algorithm_assigned_applies_from_the_next_call(comm, collective):
    """Calls that name no algorithm run the communicator's: assigning ``algorithm`` between
    two calls of a signature that took the fast path makes the next call run the new one
    (the flight recorder says which ran), and back, with mpi4py's results."""
    c = bmlmpi.Communicator(comm, algorithm="native", timeout=30)
    size, rank = comm.size, comm.rank
    x = _data(comm, (4 * size,), np.float64) * (rank + 2)
    out = np.empty(4 if collective == "reduce_scatter" else 4 * size)
    ref = np.empty_like(out)
    part = x[:4]
    mine = {"allreduce": lambda: c.Allreduce(x, out),
            "reduce_scatter": lambda: c.Reduce_scatter_block(x, out),
            "allgather": lambda: c.Allgather(part, out),
            "reduce": lambda: c.Reduce(x, out, MPI.SUM, 0),
            "bcast": lambda: c.Bcast(out, 0)}[collective]
    theirs = {"allreduce": lambda: comm.Allreduce(x, ref),
              "reduce_scatter": lambda: comm.Reduce_scatter_block(x, ref),
              "allgather": lambda: comm.Allgather(part, ref),
              "reduce": lambda: comm.Reduce(x, ref, MPI.SUM, 0),
              "bcast": lambda: comm.Bcast(ref, 0)}[collective]
    other = next(a for a in bmlmpi.algorithms(collective) if a not in ("auto", "native"))
    failures = []
    for algorithm in ("native", other, "native"):
        c.algorithm = algorithm
        for i in range(3):
            if collective == "bcast":
                out[:] = x if rank == 0 else -1
            else:
                out[:] = -1
            ref[:] = out
            mine()
            theirs()
            ran = c.recorder.calls()[-1]["chosen"]
            if ran != algorithm:
                failures.append(f"{algorithm}, call {i}: {ran} ran")
            if (collective != "reduce" or rank == 0) and not np.array_equal(out, ref):
                failures.append(f"{algorithm}, call {i}: {out} != {ref}")
    c.Free()
    all_ranks_agree(comm, failures)
