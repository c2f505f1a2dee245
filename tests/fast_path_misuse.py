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
