"""The buffers MPI must not take, tried on a signature whose fast path is open: shared by the
native and the scheduled fast-path tests (tests/mpi/test_fast_path_mpi.py,
tests/mpi/test_fast_schedule_mpi.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI


def error_of(fn: Callable[[], object]) -> tuple[str, str]:
    """(exception type name, message) of ``fn()``, ("", "") when it returns."""
    kind = text = ""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        kind, text = type(exc).__name__, str(exc)
    return kind, text


def misuse_failures(ctx, send: np.ndarray, recv: np.ndarray, want: np.ndarray) -> list[str]:
    """After ``ctx.Allreduce(send, recv)`` opened the fast path (16 float64): a read-only,
    two strided and an overlapping buffer must each raise BufferSpecError naming the problem,
    and a correct call must still give ``want``; what went otherwise, one line each."""
    read_only = np.empty(16)
    read_only.flags.writeable = False
    backing = np.ones(24)
    cases = [(lambda: ctx.Allreduce(send, read_only, MPI.SUM), "read-only"),
             (lambda: ctx.Allreduce(np.ones(32)[::2], recv, MPI.SUM), "contiguous"),
             (lambda: ctx.Allreduce(send, np.empty(32)[::2], MPI.SUM), "contiguous"),
             (lambda: ctx.Allreduce(backing[:16], backing[8:], MPI.SUM), "overlap")]
    failures = []
    for fn, text in cases:
        kind, msg = error_of(fn)
        if kind != "BufferSpecError" or text not in msg:
            failures.append(f"{text}: raised {kind}: {msg}")
    recv[:] = 0
    ctx.Allreduce(send, recv, MPI.SUM)
    if not np.array_equal(recv, want):
        failures.append(f"after the errors: {recv} != {want}")
    return failures


def mutation_failures(ctx, send: np.ndarray, recv: np.ndarray, want: np.ndarray,
                      fast_calls: Callable[[], int]) -> list[str]:
    """After ``ctx.Allreduce(send, recv)`` opened the fast path (16 float64) and was called
    again with these same two objects (so the communicator remembers them: ``_Repeat``):
    change the *same* objects in place — read-only, another dtype, the other byte order,
    another shape, a resize, a stride that makes them non-contiguous — and check that each
    takes the checked path's error or gives the right result; ``fast_calls()`` counts the
    calls that took the fast path, so the unchanged pair must still take it. What went
    otherwise, one line each."""
    import warnings

    failures = []

    def good(label: str, expect_fast: bool = True) -> None:
        recv[...] = 0
        before = fast_calls()
        ctx.Allreduce(send, recv, MPI.SUM)
        if not np.array_equal(recv.reshape(-1)[:16], want.reshape(-1)):
            failures.append(f"{label}: {recv} != {want}")
        if expect_fast and fast_calls() != before + 1:
            failures.append(f"{label}: the same pair did not take the fast path")

    def bad(label: str, text: str) -> None:
        kind, msg = error_of(lambda: ctx.Allreduce(send, recv, MPI.SUM))
        if kind != "BufferSpecError" or text not in msg:
            failures.append(f"{label}: raised {kind}: {msg}")

    good("remembered pair")
    recv.flags.writeable = False
    bad("recvbuf made read-only", "read-only")
    recv.flags.writeable = True
    good("writeable again")
    recv.dtype = np.int64  # the same bytes, another dtype object
    bad("recvbuf's dtype reassigned", "differs")
    recv.dtype = np.float64
    good("dtype restored")
    recv.dtype = recv.dtype.newbyteorder()
    bad("recvbuf's byte order swapped", "differs")
    recv.dtype = recv.dtype.newbyteorder()
    good("byte order restored")
    send.shape = recv.shape = (4, 4)  # the same 16 elements: the same allreduce
    good("both reshaped", expect_fast=False)
    send.shape = recv.shape = (16,)
    good("shapes restored")
    try:  # numpy refuses to resize an array with weak references (bmlmpi keeps some)
        recv.resize(20, refcheck=False)
    except ValueError:
        pass
    else:  # longer than the send: the checked path, count 16
        good("recvbuf resized to 20", expect_fast=False)
        if recv[16:].any():
            failures.append(f"recvbuf resized to 20: written past the count: {recv}")
        recv.resize(16, refcheck=False)  # back to 16 (the memory may have moved)
        good("recvbuf resized back to 16", expect_fast=False)
    good("after a resize")
    with warnings.catch_warnings():  # setting strides is deprecated, not yet refused
        warnings.simplefilter("ignore", DeprecationWarning)
        recv.strides = (0,)  # last: numpy cannot set them back on an array that owns its data
    bad("recvbuf made non-contiguous", "contiguous")
    return failures


def resize_failures(ctx, make: Callable[[], np.ndarray], want: np.ndarray) -> list[str]:
    """mpi4py leaves the arrays of a call resizable in place; so must a fast path that has
    opened for them (numpy refuses ``ndarray.resize()`` on an array referenced elsewhere,
    weak references included). ``make()`` returns a fresh send array of 16 float64 whose
    allreduce is ``want``."""
    import sys
    import weakref

    send, recv = make(), np.empty(16)
    refs = sys.getrefcount(send), sys.getrefcount(recv)
    for _ in range(3):
        ctx.Allreduce(send, recv, MPI.SUM)
    failures = []
    if not np.array_equal(recv, want):
        failures.append(f"{recv} != {want}")
    if (sys.getrefcount(send), sys.getrefcount(recv)) != refs:
        failures.append("the communicator holds references to the arrays")
    if weakref.getweakrefcount(send) or weakref.getweakrefcount(recv):
        failures.append("the communicator holds weak references to the arrays")
    try:
        recv.resize(32)
        send.resize(32)
    except ValueError as exc:
        failures.append(f"resize refused: {exc}")
    return failures
