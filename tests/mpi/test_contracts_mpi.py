"""docs/contracts.md, the parts that need no failure: one NaN rule for MIN/MAX, two threads on
one communicator refused, communicators freed with the user's, Free() with calls outstanding
refused."""

import gc
import threading
import time

import numpy as np
import pytest
from conftest import all_ranks_agree
from mpi4py import MPI

import bmlmpi
from bmlmpi import config


def watchdog_threads() -> int:
    return sum(t.name == "bmlmpi-watchdog" and t.is_alive() for t in threading.enumerate())


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["auto", "bml", "ring", "tree"])
@pytest.mark.parametrize("op", [MPI.MIN, MPI.MAX], ids=["min", "max"])
def test_nan_propagates_in_min_and_max_at_every_size(comm, algorithm, op):
    """numpy's rule: a NaN on any rank gives NaN at that position, whatever auto picks."""
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm, timeout=60)
    failures = []
    for n in (8, 1 << 17):
        x = (np.arange(n) % 13 + comm.rank).astype(np.float64)
        if comm.rank == comm.size - 1:
            x[3] = np.nan
        y = np.zeros(n)
        ctx.Allreduce(x, y, op)
        want = x.copy()
        for r in range(comm.size):
            other = (np.arange(n) % 13 + r).astype(np.float64)
            if r == comm.size - 1:
                other[3] = np.nan
            want = (np.minimum if op is MPI.MIN else np.maximum)(want, other)
        if not np.array_equal(y, want, equal_nan=True):
            failures.append(f"{algorithm} n={n}: {y[:5]} != {want[:5]}")
    all_ranks_agree(comm, failures)
    ctx.Free()


@pytest.mark.mpi
def test_a_second_thread_inside_a_call_is_refused(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks (a call that waits)")
    ctx = bmlmpi.Communicator(comm, algorithm="ring", timeout=60)
    x, y = np.ones(16), np.zeros(16)
    ctx.Allreduce(x, y)  # the signature's agreed first call: the next start does not wait
    failures = []
    if comm.rank == 0:
        req = ctx.Iallreduce(x, y)
        entered = threading.Event()

        def waiter() -> None:
            entered.set()
            while True:
                try:
                    req.Wait()
                    return
                except RuntimeError:  # the main thread was inside its Test just then
                    time.sleep(1e-3)

        t = threading.Thread(target=waiter)
        t.start()
        entered.wait()
        refused = False
        end = time.monotonic() + 30
        while time.monotonic() < end and t.is_alive():
            try:
                req.Test()  # from a second thread while the waiter is inside Wait
            except RuntimeError as exc:
                refused = "two threads" in str(exc)
                break
            time.sleep(1e-3)
        comm.Barrier()  # now the others join the call
        t.join(60)
        if not refused:
            failures.append("a second thread inside a call was not refused")
    else:
        comm.Barrier()
        ctx.Iallreduce(x, y).Wait()
    if not np.array_equal(y, np.full(16, comm.size)):
        failures.append(f"result {y[:4]}")
    all_ranks_agree(comm, failures)
    ctx.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "bml"])
def test_a_second_thread_in_a_family_fast_call_is_refused(comm, algorithm):
    """A repeated blocking family call (its scheduled fast path) holds the communicator as
    Allreduce's does: another thread's call on it meanwhile raises RuntimeError before
    anything moves. (A native one cannot be raced from Python: mpi4py's blocking collective
    keeps the interpreter's lock while MPI waits.)"""
    if comm.size < 2:
        pytest.skip("needs two ranks (a call that waits)")
    ctx = bmlmpi.Communicator(comm, timeout=60)
    x, y = np.arange(4.0 * comm.size) + comm.rank, np.zeros(4)
    ctx.Reduce_scatter_block(x, y, algorithm=algorithm)  # the checked first call
    want = (np.arange(4.0 * comm.size) * comm.size
            + comm.size * (comm.size - 1) / 2)[4 * comm.rank:4 * comm.rank + 4]
    failures = []
    if comm.rank == 0:
        inside = threading.Thread(target=ctx.Reduce_scatter_block, args=(x, y),
                                  kwargs={"algorithm": algorithm})
        inside.start()  # waits inside its fast call: the others are at the barrier
        end = time.monotonic() + 30
        while ctx.family.gate.owner is None and time.monotonic() < end:
            time.sleep(1e-3)
        other = np.zeros(4)
        try:
            ctx.Reduce_scatter_block(x, other, algorithm=algorithm)
            failures.append("a second thread's fast call was not refused")
        except RuntimeError as exc:
            if "two threads" not in str(exc):
                failures.append(f"refused with {exc}")
        comm.Barrier()  # now the others join the first thread's call
        inside.join(60)
    else:
        comm.Barrier()
        ctx.Reduce_scatter_block(x, y, algorithm=algorithm)
    if not np.array_equal(y, want):
        failures.append(f"result {y}")
    all_ranks_agree(comm, failures)
    ctx.Free()


@pytest.mark.mpi
def test_module_level_communicators_are_freed_with_the_users(comm):
    """No watchdog thread (and no communicator) left per freed user communicator."""
    before = watchdog_threads()
    x, y = np.ones(4), np.zeros(4)
    for _ in range(20):
        d = comm.Dup()
        for _ in range(3):  # the first call is checked, the next ones take the fast path
            bmlmpi.Allreduce(x, y, comm=d, algorithm="native")
        d.Free()
    failures = []
    if watchdog_threads() > before:
        failures.append(f"{watchdog_threads() - before} watchdog thread(s) left")
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_a_dropped_communicator_ends_its_watchdog_thread(comm):
    before = watchdog_threads()
    ctx = bmlmpi.Communicator(comm, algorithm="native", timeout=60)
    x, y = np.ones(4), np.zeros(4)
    for _ in range(3):
        ctx.Allreduce(x, y)
    del ctx
    gc.collect()
    end = time.monotonic() + 10
    while watchdog_threads() > before and time.monotonic() < end:
        time.sleep(0.05)
    all_ranks_agree(comm, [] if watchdog_threads() <= before else ["the thread lives on"])


@pytest.mark.mpi
def test_one_watchdog_thread_serves_every_communicator(comm):
    """One watchdog thread per process: several communicators on the blocking native fast
    path share it, and 200 module-level Dup/Free cycles leave the thread count flat."""
    if comm.size == 1 or config.get("BMLMPI_BLOCKING") != "watchdog":
        return  # no fast path, no watchdog
    x, y = np.ones(4), np.zeros(4)
    ctxs = [bmlmpi.Communicator(comm, algorithm="native", timeout=60) for _ in range(3)]
    for ctx in ctxs:
        for _ in range(3):  # the first call is checked, the next ones take the fast path
            ctx.Allreduce(x, y)
    failures = [] if watchdog_threads() == 1 else [f"{watchdog_threads()} watchdog threads "
                                                   f"for 3 communicators"]
    for _ in range(200):
        d = comm.Dup()
        for _ in range(3):
            bmlmpi.Allreduce(x, y, comm=d, algorithm="native")
        d.Free()
    if watchdog_threads() != 1:
        failures.append(f"{watchdog_threads()} watchdog threads after 200 Dup/Free")
    for ctx in ctxs:
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_free_with_a_call_outstanding_is_refused(comm):
    ctx = bmlmpi.Communicator(comm, algorithm="native", timeout=60)
    x, y = np.ones(1 << 16), np.zeros(1 << 16)
    req = ctx.Iallreduce(x, y)
    failures = []
    if req.Test():
        pass  # already complete here: nothing outstanding to refuse
    else:
        try:
            ctx.Free()
            failures.append("Free() with a call outstanding did not raise")
        except RuntimeError as exc:
            if "outstanding" not in str(exc) and "not completed" not in str(exc):
                failures.append(f"unclear error: {exc}")
    req.Wait()
    if not np.array_equal(y, np.full(1 << 16, comm.size)):
        failures.append("wrong result")
    ctx.Free()
    all_ranks_agree(comm, failures)
