"""The watchdog that bounds blocking MPI calls (bmlmpi.watchdog), driven without MPI: a
"call" is the enter/leave bracket the fast path puts around MPI_Allreduce."""

import threading
import time
from contextlib import contextmanager

from bmlmpi.watchdog import Watchdog


@contextmanager
def running(timeout: float):
    """A started watchdog whose abort only sets an event and whose reports are collected."""
    fired = threading.Event()
    reports: list[str] = []
    dog = Watchdog(timeout, abort=fired.set, report=reports.append)
    dog.start()
    try:
        yield dog, fired, reports
    finally:
        dog.stop()


def test_a_call_blocked_past_the_timeout_is_reported_and_aborted():
    with running(0.2) as (dog, fired, reports):
        dog.enter("allreduce X of rank 3")
        assert fired.wait(30), "the watchdog never fired on a call blocked past its timeout"
        assert len(reports) == 1
        assert "allreduce X of rank 3" in reports[0] and "call 1" in reports[0]
        assert "BMLMPI_BLOCKING=polled" in reports[0]
        assert dog.fired == reports[0]


def test_calls_that_keep_completing_are_never_aborted():
    with running(1.0) as (dog, fired, reports):
        end = time.monotonic() + 3.0  # three timeouts of calls, each far shorter than one
        while time.monotonic() < end:
            dog.enter("short call")
            time.sleep(0.01)
            dog.leave()
        assert not fired.is_set() and reports == []
        assert dog.calls > 10


def test_idle_time_between_calls_does_not_count():
    with running(0.1) as (dog, fired, reports):
        dog.enter("a call")
        dog.leave()
        time.sleep(0.6)  # idle for six timeouts: no call is in progress
        assert not fired.is_set()
        dog.enter("the next call")  # its clock starts when the watchdog first sees it
        assert fired.wait(30)
        assert "the next call" in reports[0] and "call 2" in reports[0]


def test_stop_ends_the_thread():
    with running(0.05) as (dog, fired, _):
        thread = dog._thread
    assert thread is not None and not thread.is_alive()
    assert not fired.is_set()


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bmlmpi-watchdog" and t.is_alive()]


def test_one_thread_serves_every_watchdog():
    """One thread per process, whatever the number of communicators: each watchdog keeps its
    own timeout and fires alone; the thread ends with the last one."""
    with running(0.2) as (slow, slow_fired, slow_reports), \
            running(30.0) as (busy, busy_fired, _):
        assert len(watchdog_threads()) == 1
        busy.enter("a call that is not late")
        slow.enter("allreduce Y of rank 1")
        assert slow_fired.wait(30), "the watchdog of the blocked call never fired"
        assert "allreduce Y of rank 1" in slow_reports[0]
        assert not busy_fired.is_set()
        busy.leave()
        assert len(watchdog_threads()) == 1
    assert watchdog_threads() == []
