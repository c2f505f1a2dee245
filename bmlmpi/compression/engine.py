"""A non-blocking request driven by a generator: the compressed collectives' progress engine.

A compressed allreduce is a short sequence of stages (agree on a scale and a density, then
exchange); each stage posts MPI requests, or starts a :class:`bmlmpi.execute.Run` of the
algorithm's schedule (wrapped in :class:`RunRequest`), and yields them. :class:`StagedRequest`
advances the generator inside ``Test``/``Wait`` only, like bmlmpi's own requests, so
GradientBuckets' progress thread drives it unchanged. An exception raised while testing a
stage's requests (an MPI error) is thrown into the generator at its ``yield``, so a stage can
clean up or turn it into its own error. Every wait has the communicator's deadline, restarted
whenever a stage or a step of its run completes: a peer that never posts its half raises
:class:`bmlmpi.DeadlineExceeded` instead of hanging.

Tags: each compressed call runs on its own block of :data:`TAG_SPAN` tags (a Run uses tags
``base + [0, TAG_STEPS)``; the sparse exchanges fold theirs into the same span), handed out by
its communicator's :class:`.channel.CompressionChannel`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from ..execute import TAG_STEPS, Run, wait_for

#: tags per compressed call: what one Run uses (execute folds its step tags into this many)
TAG_SPAN = TAG_STEPS


def _done(item: Any) -> bool:
    return item.Test()


class RunRequest:
    """A :class:`bmlmpi.execute.Run` as a stage request: ``Test`` advances the run."""

    __slots__ = ("run",)

    def __init__(self, run: Run):
        self.run = run

    def Test(self) -> bool:
        return self.run.test()

    @property
    def progress(self) -> int:
        return self.run.progress

    def pending(self) -> str:
        return self.run.pending()

    def cancel(self) -> None:
        self.run.cancel()


class CallQueue(list):
    """One channel's staged requests, oldest first; ``unsettled`` once one of them ended in an
    error (its stage's other requests may still be posted, so MPI may still use the channel's
    communicator)."""

    def __init__(self) -> None:
        super().__init__()
        self.unsettled = False


class StagedRequest:
    """Wraps a generator that yields lists of requests (MPI or bmlmpi) and returns when done:
    the record behind a compressed call's :class:`bmlmpi.handles.Request` (``test``,
    ``wait``, ``run``: :class:`bmlmpi.handles.CallRecord`).

    Requests of one ``queue`` (a communicator's compression channel's) run one after
    another, oldest first: a request
    posts its first stage only when every older one has finished. Stages post collectives
    and tagged messages whose order must be the same on every rank; a progress thread testing
    several calls in flight in any order cannot reorder them this way. The price: compressed
    calls on one communicator do not overlap each other.
    """

    def __init__(self, stages: Generator[Sequence[Any], None, None], timeout: float, what: str,
                 queue: CallQueue | None = None):
        self._gen = stages
        self._pending: Sequence[Any] = ()
        self._started = False
        self._finished = False
        self._error: BaseException | None = None
        self._stage = 0
        self.timeout = timeout
        self.what = what
        self._queue = CallQueue() if queue is None else queue
        self._queue.append(self)
        _drive(self._queue)

    def _step(self) -> None:
        """Advance this request as far as its posted requests allow."""
        while not self._finished:
            failure = None
            if self._started:
                try:
                    if not all(_done(r) for r in self._pending):
                        return
                except Exception as exc:   # an MPI error: the stage may handle it
                    failure = exc
            self._started = True
            try:
                self._pending = (next(self._gen) if failure is None
                                 else self._gen.throw(failure))
                self._stage += 1
            except StopIteration:
                self._finished = True
                self._pending = ()
            except BaseException as exc:   # raised by this request's own Test/Wait
                self._finished = True
                self._pending = ()
                self._error = exc
                self._queue.unsettled = True

    def _progress(self) -> tuple:
        return (self._stage, tuple(getattr(r, "progress", 0) for r in self._pending))

    def _describe(self, timeout: float) -> str:
        runs = [r.pending() for r in self._pending if isinstance(r, RunRequest)]
        for r in self._pending:
            if isinstance(r, RunRequest):
                r.cancel()
        detail = f"; its run waits for: {'; '.join(runs)}" if runs else ""
        return f"{self.what}: stage {self._stage} made no progress in {timeout:g} s{detail}"

    @property
    def run(self) -> Run | None:
        """The schedule run the current stage waits on, None when it waits on none."""
        for r in self._pending:
            if isinstance(r, RunRequest):
                return r.run
        return None

    def test(self) -> bool:
        _drive(self._queue)
        if self._finished and self._error is not None:
            err, self._error = self._error, None
            raise err
        return self._finished

    def wait(self) -> None:
        wait_for(self.test, self.timeout, self._describe, progress=self._progress)


def _drive(queue: CallQueue) -> None:
    """Advance the oldest unfinished request; start the next one as each finishes."""
    while queue:
        head = queue[0]
        head._step()
        if not head._finished:
            return
        queue.pop(0)


__all__ = ["CallQueue", "RunRequest", "StagedRequest", "TAG_SPAN"]
