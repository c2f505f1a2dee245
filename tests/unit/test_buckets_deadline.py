"""GradientBuckets' wait deadline counts progress, not only completions (bmlmpi's own rule: a slow
but progressing allreduce never times out), and still fires when nothing moves. No MPI: a
stand-in communicator whose requests finish after a set time and expose ``run.progress``."""

import time

import numpy as np
import pytest

import bmlmpi
from bmlmpi.training import GradientBuckets


class _Run:
    def __init__(self) -> None:
        self.progress = 0


class _Request:
    """Completes ``duration`` s after it starts; its run advances a step every ``step`` s
    (never, when ``step`` is None)."""

    def __init__(self, duration: float, step: float | None):
        self.t0 = time.monotonic()
        self.duration, self.step = duration, step
        self.run = _Run()

    def Test(self) -> bool:
        elapsed = time.monotonic() - self.t0
        if self.step is not None:
            self.run.progress = int(elapsed / self.step)
        return elapsed >= self.duration


class _Comm:
    """One rank: Allreduce copies (the registration check), Iallreduce is a timed request."""

    rank, size, timeout = 0, 1, 30.0
    fault_tolerant, failed, reproducible = False, (), False

    def __init__(self, duration: float, step: float | None):
        self.duration, self.step = duration, step

    def Allreduce(self, send, recv, op) -> None:
        recv[...] = send

    def Iallreduce(self, send, recv, op, reproducible=None) -> _Request:
        return _Request(self.duration, self.step)


def _one_iteration(comm: _Comm, timeout: float) -> GradientBuckets:
    grads = [np.ones(8), np.ones(3)]
    b = GradientBuckets(grads, comm=comm, plan="single", timeout=timeout, poll_interval=1e-3)
    for i in reversed(range(len(grads))):
        b.mark_ready(i)
    return b


def test_a_slow_but_progressing_bucket_does_not_time_out():
    # 1.2 s in flight, a step every 0.05 s, a deadline of 0.4 s without progress
    b = _one_iteration(_Comm(duration=1.2, step=0.05), timeout=0.4)
    try:
        t0 = time.monotonic()
        b.wait()
        assert time.monotonic() - t0 >= 1.0
        assert b.done()
    finally:
        b.close()


def test_a_stalled_bucket_times_out():
    b = _one_iteration(_Comm(duration=60.0, step=None), timeout=0.4)
    t0 = time.monotonic()
    with pytest.raises(bmlmpi.DeadlineExceeded, match="no bucket completed or advanced"):
        b.wait()
    assert time.monotonic() - t0 < 10.0
    with pytest.raises(bmlmpi.DeadlineExceeded):   # close() waits once more, with the deadline
        b.close()
    assert b._thread is None                       # and stops the progress thread anyway


def test_the_progress_threads_pacer(monkeypatch):
    """The back-off of a thread polling on others' behalf (the buckets' and the torch
    driver's): at once after progress, then ``first`` doubling up to ``cap``, never spinning."""
    from bmlmpi import execute
    slept: list[float] = []
    monkeypatch.setattr(execute.time, "sleep", slept.append)
    pacer = execute.Pacer(2e-5, 1e-4)
    for progressed in (False, False, False, False, True, False):
        pacer.pause(progressed)
    assert slept == [2e-5, 4e-5, 8e-5, 1e-4, 0.0, 2e-5]
    steady = execute.Pacer(2e-4, 2e-4)        # GradientBuckets(poll_interval=2e-4)
    slept.clear()
    for progressed in (False, False, True, False):
        steady.pause(progressed)
    assert slept == [2e-4, 2e-4, 0.0, 2e-4]
    with pytest.raises(ValueError):
        execute.Pacer(0.0, 1.0)
