"""Work objects of the bmlmpi backend and the thread that completes them.

Every collective the process group starts is a :class:`Started`: its requests (bmlmpi's or
MPI's), what to do once they complete (copy a staged result back, divide an average) and the
``torch.futures.Future`` that DDP and ``Work.get_future()`` hand out. bmlmpi has no progress
thread of its own (its requests advance inside ``Test``/``Wait``) and DDP waits on the future
from C++ without calling ``Work.wait``, so a :class:`Driver` thread polls the started
collectives, oldest first, and completes their futures. ``Work.wait()`` drives its own
collective in the calling thread instead of waiting for the poll. Every call into bmlmpi or MPI
is made under the process group's lock (a bmlmpi Communicator is not thread-safe); futures are
completed outside it, since their callbacks (DDP's, a comm hook's ``then``) may start
collectives.

Deadlines: a collective whose requests make no progress for the process group's ``timeout``
seconds fails with :class:`bmlmpi.DeadlineExceeded` (bmlmpi's own wait names the step and the
peers), whether it is waited on by ``Work.wait`` or only polled by the thread: the future
then holds the error and DDP raises it, instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from ..execute import DeadlineExceeded, Pacer, wait_for


class Started:
    """One started collective: ``poll()`` advances it, ``block()`` waits for it with the
    deadline, ``finish()`` runs once it completed, ``result`` is the future's value."""

    __slots__ = ("what", "poll_fn", "block_fn", "mark_fn", "finish_fn", "result", "future",
                 "done", "error", "claimed", "last_mark", "last_change", "keep")

    def __init__(self, what: str, poll: Callable[[], bool], block: Callable[[], None],
                 finish: Callable[[], None] | None, result: Any,
                 mark: Callable[[], Any] = lambda: None, keep: Any = None):
        self.what = what
        # the buffers MPI reads and writes until completion (mpi4py's non-blocking
        # collectives do not hold them): a temporary input must outlive the call
        self.keep = keep
        self.poll_fn = poll
        self.block_fn = block
        self.mark_fn = mark
        self.finish_fn = finish
        self.result = result
        self.future: Future = Future()
        self.done = False
        self.error: BaseException | None = None
        self.claimed = False
        self.last_mark = mark()
        self.last_change = time.monotonic()

    def _complete(self) -> None:
        if self.finish_fn is not None:
            self.finish_fn()
        self.done = True

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done = True

    def poll(self, timeout: float) -> None:
        """One non-blocking look (under the lock); a collective that made no progress for
        ``timeout`` s is waited on with the deadline, which raises into its future."""
        if self.done:
            return
        try:
            if self.poll_fn():
                self._complete()
                return
            mark = self.mark_fn()
            now = time.monotonic()
            if mark != self.last_mark:
                self.last_mark, self.last_change = mark, now
            elif now - self.last_change > timeout:
                self.block_fn()
                self._complete()
        except BaseException as exc:  # noqa: BLE001 - it belongs to the future
            self._fail(exc)
        if self.done:
            self.keep = None

    def block(self) -> None:
        """Wait for it with the deadline (under the lock)."""
        if self.done:
            return
        try:
            self.block_fn()
            self._complete()
        except BaseException as exc:  # noqa: BLE001 - raised again by Work.wait
            self._fail(exc)
        self.keep = None

    def settle(self) -> None:
        """Complete the future (outside the lock: callbacks run here)."""
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


class Driver:
    """The started collectives of one process group and the thread that polls them."""

    def __init__(self, lock: threading.RLock, timeout: float, name: str):
        self._lock = lock
        self._timeout = timeout
        self._name = name
        self._pending: list[Started] = []
        self._wake = threading.Condition(lock)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def add(self, started: Started) -> None:
        """Track a started collective (called under the lock); one that is already complete
        has its future completed now (nothing can have attached a callback to it yet)."""
        if started.done:
            if not started.claimed:
                started.claimed = True
                started.settle()
            return
        self._pending.append(started)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self._name} progress",
                                            daemon=True)
            self._thread.start()
        self._wake.notify()

    def _claim(self) -> list[Started]:
        """Done collectives not yet settled, removed from the pending list (under the lock)."""
        done = [s for s in self._pending if s.done and not s.claimed]
        for s in done:
            s.claimed = True
        self._pending = [s for s in self._pending if not s.done]
        return done

    def complete(self, started: Started) -> None:
        """Drive ``started`` to completion in the calling thread (``Work.wait``)."""
        with self._lock:
            for s in self._pending:   # older collectives first: ranks may wait in any order
                if s is started:
                    break
                s.poll(self._timeout)
            started.block()
            ready = self._claim()
        for s in ready:
            s.settle()
        # claimed by the progress thread, which completes its future right after
        deadline = time.monotonic() + self._timeout
        while not started.future.done():
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"{started.what}: completed, but its future was not "
                                       f"set within {self._timeout:g} s")
            time.sleep(1e-5)

    def _run(self) -> None:
        # yield the core while work is pending, sleeping longer (up to 1 ms) the longer
        # nothing completes, so a waiting thread costs the computing one little
        pacer = Pacer(2e-5, 1e-3)
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                for s in self._pending:
                    s.poll(self._timeout)
                ready = self._claim()
            for s in ready:
                s.settle()
            pacer.pause(bool(ready))

    def close(self, timeout: float) -> None:
        """Stop the thread once the pending collectives are done or ``timeout`` has passed."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(1e-3)
        with self._lock:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)


class Work(dist.Work):
    """The handle torch hands back for one collective of the bmlmpi backend.

    ``wait()`` returns True once the collective completed (its output tensors hold the
    result) and raises its error otherwise (:class:`bmlmpi.DeadlineExceeded`, an MPI error,
    a fault-tolerance error); ``get_future()`` is completed with the output tensors (a list)
    by the progress thread or by ``wait``, with the error set where the collective failed.
    """

    def __init__(self, driver: Driver, started: Started):
        super().__init__()
        self._driver = driver
        self._started = started

    def wait(self, timeout: Any = None) -> bool:
        s = self._started
        if not (s.done and s.claimed and s.future.done()):
            self._driver.complete(s)
        if s.error is not None:
            raise s.error
        return True

    def is_completed(self) -> bool:
        return self._started.done

    def is_success(self) -> bool:
        return self._started.done and self._started.error is None

    def exception(self) -> BaseException | None:
        return self._started.error

    def get_future(self) -> Future:
        return self._started.future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._started.result

    def synchronize(self) -> None:
        self.wait()


def wait_mpi(req: Any, timeout: float, what: str) -> None:
    """One MPI request waited on with the deadline (raises DeadlineExceeded)."""
    wait_for(req.Test, timeout, lambda t: f"{what}: no completion within {t:g} s")


__all__ = ["DeadlineExceeded", "Driver", "Started", "Work", "wait_mpi"]
