"""The deadline of a blocking call that MPI itself waits in: a watchdog thread.

bmlmpi's fast path for a blocking native allreduce (``Communicator.Allreduce`` or
``bmlmpi.Allreduce`` once ``native`` was chosen for a signature and that signature passed
the first-call argument check) calls ``MPI_Allreduce`` itself, so that MPI waits in its own
loop instead of bmlmpi polling ``MPI_Iallreduce`` from Python (3.5 µs a call at 8 B, 2× the
time at 64 KiB). A blocking MPI call cannot be given a deadline from inside, so the promise
"nothing hangs" is kept from outside, as NCCL's watchdog keeps it for its collectives: one
daemon thread per process, serving every communicator's :class:`Watchdog`, wakes every
``min(1 s, timeout / 10)`` (the smallest of theirs); when the same blocking call of a
communicator has been in progress for more than its ``timeout`` seconds (``BMLMPI_TIMEOUT``)
it writes
which call hung (rank, communicator size, signature, call number, seconds) to stderr, has
the communicator's flight recorder dumped (:mod:`bmlmpi.recorder`) and
aborts the job (``MPI_Abort``, since the other ranks of a hung collective cannot be told to
stop any other way). A slow call that completes within the timeout is never touched.

Cost on the calling thread: one counter increment and two attribute stores per call (about
0.1 µs); the thread exists only while some communicator's fast path has been taken and that
communicator is neither freed nor collected, and sleeps between checks.
Users who prefer an exception they can catch to an abort set ``BMLMPI_BLOCKING=polled``
(every call then takes the polled path with its per-wait deadline and DeadlineExceeded).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from mpi4py import MPI

#: Exit code of a job the watchdog aborted (EX_SOFTWARE).
ABORT_CODE = 70

#: The watchdogs the process's one thread serves (started; a stopped one is dropped by the
#: next look under _lock: :func:`_live`), under _lock.
_watched: set[Watchdog] = set()
_lock = threading.Lock()
_wake = threading.Event()     # set: the thread looks at the set of watchdogs at once
_thread: threading.Thread | None = None


def _live() -> list[Watchdog]:
    """The watchdogs not stopped, the stopped ones dropped (called under _lock)."""
    _watched.difference_update([d for d in _watched if d._stop.is_set()])
    return list(_watched)


def _serve() -> None:
    """The process's watchdog thread: checks every started watchdog, at the smallest of
    their periods, and ends when none is left."""
    global _thread
    while True:
        with _lock:
            dogs = _live()
            if not dogs:
                _thread = None
                return
        _wake.wait(min(d.period for d in dogs))
        _wake.clear()
        for dog in dogs:
            if not dog._stop.is_set() and dog._check():
                dog._stop.set()   # it fired: its abort has run


def mpi_abort(comm: MPI.Comm) -> Callable[[], None]:
    """The default action: ``MPI_Abort`` on ``comm`` when MPI allows calls from a second
    thread (mpi4py asks for MPI_THREAD_MULTIPLE), else end this process, which makes the
    launcher end the job."""
    def abort() -> None:
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            comm.Abort(ABORT_CODE)
        os._exit(ABORT_CODE)
    return abort


class Watchdog:
    """Aborts the job when one blocking call outlives ``timeout`` seconds.

    The caller brackets each blocking call with :meth:`enter` and :meth:`leave` (or, on the hot
    path, their three statements inlined: ``w.calls += 1; w.current = what; ...; w.current =
    None``). ``abort`` runs once, from the watchdog thread, after the report is written.
    """

    def __init__(self, timeout: float, abort: Callable[[], None],
                 report: Callable[[str], None] | None = None, source: str = "BMLMPI_TIMEOUT=",
                 alarm: Callable[[], str | None] | None = None,
                 before_abort: Callable[[str], None] | None = None,
                 number: Callable[[], int | None] | None = None):
        """``source``: how the report names where the timeout came from (``timeout=`` for a
        constructor argument). ``alarm``: polled while a call is in progress; a text it
        returns (another rank announced that it will not join the call) ends the job at
        once, since a blocking MPI call cannot be interrupted. ``before_abort``: given the
        report before the job is aborted (the flight recorder's dump). ``number``: the number
        of the call in progress on its communicator (the one exceptions and the flight
        recorder give it), for the report (it returns None where that is not known); without
        it, the report counts the calls this watchdog watched."""
        self.timeout = float(timeout)
        self.source = source
        self._alarm = alarm
        self.current: str | None = None   # what the call in progress is, None between calls
        self.calls = 0                    # blocking calls entered so far
        self.fired: str | None = None     # the report, once the watchdog fired
        self._abort = abort
        self._report = report or _to_stderr
        self._before_abort = before_abort  # given the report (the flight recorder's dump)
        self._number = number
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None   # the process's thread, once started
        self._seen, self._since = -1, 0.0   # the call the thread last saw, and since when

    @property
    def period(self) -> float:
        return min(1.0, max(0.005, self.timeout / 10))

    def start(self) -> None:
        """Have the process's watchdog thread watch this one (the thread is started when
        none runs); the fast path calls this when it is first taken."""
        global _thread
        if self._thread is not None or self._stop.is_set():
            return
        with _lock:
            _watched.add(self)
            if _thread is None:
                _thread = threading.Thread(target=_serve, name="bmlmpi-watchdog",
                                           daemon=True)
                _thread.start()
            self._thread = _thread
        _wake.set()

    def close(self) -> None:
        """Stop watching, without waiting for the thread (what a Communicator's finalizer
        calls when it is dropped without ``Free()``); the thread ends at its next wake-up
        when no watchdog is left. Takes no lock: a finalizer runs inside the garbage
        collector, which may run while this thread holds one."""
        self._stop.set()
        _wake.set()

    def stop(self) -> None:
        """Stop watching; when this was the last watchdog, wait (bounded) for the thread
        to end."""
        self.close()
        with _lock:
            last = _thread if not _live() else None
        if last is not None and last is not threading.current_thread():
            # it wakes at once; the bound only matters when this process gets no CPU (a
            # heavily loaded node) or another communicator starts watching meanwhile
            last.join(timeout=10.0)
        self._thread = None

    def enter(self, what: str) -> None:
        self.calls += 1
        self.current = what

    def leave(self) -> None:
        self.current = None

    def _last_words(self) -> None:
        """``before_abort`` with the report (the flight recorder's dump); the abort follows
        whatever it does."""
        if self._before_abort is not None:
            try:
                self._before_abort(self.fired)
            except Exception as exc:  # noqa: BLE001 - the abort must happen
                _to_stderr(f"bmlmpi watchdog: the flight recorder's dump failed: {exc}")

    def _check(self) -> bool:
        """One look at the call in progress (the thread's); True once it fired (the report
        written, the abort run)."""
        what = self.current
        if what is None:
            return False
        if self._alarm is not None:
            try:
                news = self._alarm()
            except Exception:  # noqa: BLE001 - MPI refused the test: keep the deadline
                news = None
                self._alarm = None
            if news is not None and self.current is not None:
                return self._fire(f"bmlmpi watchdog: {what}{self._which()}, is "
                                  f"blocked inside MPI, which cannot be interrupted, "
                                  f"and {news}: that call can never complete; aborting the job")
        n, now = self.calls, time.monotonic()
        if n != self._seen:
            # a call the watchdog has not seen yet: its clock starts
            self._seen, self._since = n, now
            return False
        since = self._since
        if now - since > self.timeout:
            return self._fire(f"bmlmpi watchdog: {what}{self._which()}, has been blocked in MPI "
                              f"for {now - since:.1f} s ({self.source}{self.timeout:g}); "
                              f"another rank never joined it; aborting the job (set "
                              f"BMLMPI_BLOCKING=polled for a DeadlineExceeded instead)")
        return False

    def _which(self) -> str:
        """``, call N`` for the report: the number ``number`` gives (nothing where it gives
        None), else this watchdog's count of the calls it watched."""
        if self._number is None:
            return f", call {self.calls}"
        try:
            n = self._number()
        except Exception:  # noqa: BLE001 - the report goes out without the number
            n = None
        return "" if n is None else f", call {n}"

    def _fire(self, report: str) -> bool:
        """Write ``report``, have the flight recorder dumped, abort; True (it fired)."""
        self.fired = report
        self._report(report)
        self._last_words()
        self._abort()
        return True


def _to_stderr(message: str) -> None:
    # os.write: the main thread may hold sys.stderr's lock (it is blocked inside MPI)
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass
