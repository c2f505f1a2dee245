"""The deadline of a blocking call that MPI itself waits in: a watchdog thread.

bmlmpi's fast path for a blocking native allreduce (``Communicator.Allreduce`` or
``bmlmpi.Allreduce`` once ``native`` was chosen for a signature and that signature passed
the first-call argument check) calls ``MPI_Allreduce`` itself, so that MPI waits in its own
loop instead of bmlmpi polling ``MPI_Iallreduce`` from Python (3.5 µs a call at 8 B, 2× the
time at 64 KiB). A blocking MPI call cannot be given a deadline from inside, so the promise
"nothing hangs" is kept from outside, as NCCL's watchdog keeps it for its collectives: a
daemon thread per communicator wakes every ``min(1 s, timeout / 10)``; when the same blocking
call has been in progress for more than ``timeout`` seconds (``BMLMPI_TIMEOUT``) it writes
which call hung (rank, communicator size, signature, call number, seconds) to stderr, has
the communicator's flight recorder dumped (:mod:`bmlmpi.recorder`) and
aborts the job (``MPI_Abort``, since the other ranks of a hung collective cannot be told to
stop any other way). A slow call that completes within the timeout is never touched.

Cost on the calling thread: one counter increment and two attribute stores per call (about
0.1 µs); the thread exists only once a fast-path call was made and sleeps between checks.
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
                 before_abort: Callable[[str], None] | None = None):
        """``source``: how the report names where the timeout came from (``timeout=`` for a
        constructor argument). ``alarm``: polled while a call is in progress; a text it
        returns (another rank announced that it will not join the call) ends the job at
        once, since a blocking MPI call cannot be interrupted. ``before_abort``: given the
        report before the job is aborted (the flight recorder's dump)."""
        self.timeout = float(timeout)
        self.source = source
        self._alarm = alarm
        self.current: str | None = None   # what the call in progress is, None between calls
        self.calls = 0                    # blocking calls entered so far
        self.fired: str | None = None     # the report, once the watchdog fired
        self._abort = abort
        self._report = report or _to_stderr
        self._before_abort = before_abort  # given the report (the flight recorder's dump)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def period(self) -> float:
        return min(1.0, max(0.005, self.timeout / 10))

    def start(self) -> None:
        """Start the thread (once); the fast path calls this when it is first taken."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="bmlmpi-watchdog",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Let the thread end at its next wake-up, without waiting for it (what a
        Communicator's finalizer calls when it is dropped without ``Free()``)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            # it wakes at once when the event is set; the bound only matters when this
            # process gets no CPU (a heavily loaded node)
            self._thread.join(timeout=10.0)
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

    def _watch(self) -> None:
        seen, since = -1, 0.0
        while not self._stop.wait(self.period):
            what = self.current
            if what is None:
                continue
            if self._alarm is not None:
                try:
                    news = self._alarm()
                except Exception:  # noqa: BLE001 - MPI refused the test: keep the deadline
                    news = None
                    self._alarm = None
                if news is not None and self.current is not None:
                    self.fired = (f"bmlmpi watchdog: {what}, fast-path call {self.calls}, is "
                                  f"blocked in MPI_Allreduce, which cannot be interrupted, and "
                                  f"{news}: that call can never complete; aborting the job")
                    self._report(self.fired)
                    self._last_words()
                    self._abort()
                    return
            n, now = self.calls, time.monotonic()
            if n != seen:
                seen, since = n, now  # a call the watchdog has not seen yet: its clock starts
                continue
            if now - since > self.timeout:
                self.fired = (f"bmlmpi watchdog: {what}, call {n}, has been blocked in MPI for "
                              f"{now - since:.1f} s ({self.source}{self.timeout:g}); another "
                              f"rank never joined it; aborting the job (set "
                              f"BMLMPI_BLOCKING=polled for a DeadlineExceeded instead)")
                self._report(self.fired)
                self._last_words()
                self._abort()
                return


def _to_stderr(message: str) -> None:
    # os.write: the main thread may hold sys.stderr's lock (it is blocked inside MPI)
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass
