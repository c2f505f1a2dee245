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

Also here: the private duplicate communicator compressed calls send on (so their tags never
meet bmlmpi's own schedules) and the per-communicator call counter that gives each compressed
call its own block of :data:`TAG_SPAN` tags (a Run uses tags ``base + [0, TAG_STEPS)``; the
sparse exchanges fold theirs into the same span), :data:`TAG_CALLS` blocks in turn, as many as
the MPI's tag upper bound holds (at most 32): two calls in flight never share a tag as long as
fewer than that many are outstanding, which :class:`StagedRequest` guarantees by running one
communicator's compressed calls one after another (every rank starts compressed calls in the
same order, as it must for bmlmpi's allreduces).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from mpi4py import MPI

from ..execute import TAG_STEPS, Run, wait_for, wait_request

#: tags per compressed call: what one Run uses (execute folds its step tags into this many)
TAG_SPAN = TAG_STEPS
#: distinct tag blocks, at most (fewer where the MPI's tag upper bound is lower)
TAG_CALLS = 32


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


class StagedRequest:
    """Wraps a generator that yields lists of requests (MPI or bmlmpi) and returns when done.

    Requests of one communicator (``owner``) run one after another, oldest first: a request
    posts its first stage only when every older one has finished. Stages post collectives
    and tagged messages whose order must be the same on every rank; a progress thread testing
    several calls in flight in any order cannot reorder them this way. The price: compressed
    calls on one communicator do not overlap each other.
    """

    def __init__(self, stages: Generator[Sequence[Any], None, None], timeout: float, what: str,
                 owner: Any = None):
        self._gen = stages
        self._pending: Sequence[Any] = ()
        self._started = False
        self._finished = False
        self._error: BaseException | None = None
        self._stage = 0
        self.timeout = timeout
        self.what = what
        self._queue: list[StagedRequest] = ([] if owner is None else
                                            owner.__dict__.setdefault("_compression_queue", []))
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

    def _progress(self) -> tuple:
        return (self._stage, tuple(getattr(r, "progress", 0) for r in self._pending))

    def _describe(self, timeout: float) -> str:
        runs = [r.pending() for r in self._pending if isinstance(r, RunRequest)]
        for r in self._pending:
            if isinstance(r, RunRequest):
                r.cancel()
        detail = f"; its run waits for: {'; '.join(runs)}" if runs else ""
        return f"{self.what}: stage {self._stage} made no progress in {timeout:g} s{detail}"

    def Test(self) -> bool:
        _drive(self._queue)
        if self._finished and self._error is not None:
            err, self._error = self._error, None
            raise err
        return self._finished

    def Wait(self) -> None:
        wait_for(self.Test, self.timeout, self._describe, progress=self._progress)


def _drive(queue: list[StagedRequest]) -> None:
    """Advance the oldest unfinished request; start the next one as each finishes."""
    while queue:
        head = queue[0]
        head._step()
        if not head._finished:
            return
        queue.pop(0)


def private_comm(comm: Any) -> MPI.Comm:
    """The duplicate of a bmlmpi Communicator's communicator that compressed calls use
    (made on the first compressed call, which every rank makes in the same order, and again
    after the communicator's own MPI communicator changed), with its plan cache and tag
    blocks."""
    dup = getattr(comm, "_compression_comm", None)
    if dup is not None and getattr(comm, "_compression_base", None) is not comm.comm:
        # a fault-tolerant communicator shrank: its old duplicate holds failed ranks
        comm._compression_comm = dup = None
    if dup is None:
        dup, req = comm.comm.Idup()
        wait_request(req, comm.timeout, "bmlmpi.compression: not every rank made its first "
                                        "compressed call")
        dup.Set_errhandler(MPI.ERRORS_RETURN)
        comm._compression_comm = dup
        comm._compression_base = comm.comm
        comm._compression_calls = 0
        comm._compression_plans = {}
        tag_ub = int(dup.Get_attr(MPI.TAG_UB) or 32767)
        comm._compression_blocks = max(1, min(TAG_CALLS, (tag_ub + 1) // TAG_SPAN))
    return dup


def drop_private_comm(comm: Any) -> None:
    """Forget the private duplicate (after a failure made it unusable); the next compressed
    call makes a new one."""
    dup = getattr(comm, "_compression_comm", None)
    comm._compression_comm = None
    comm._compression_plans = {}
    comm._compression_levels = None
    if dup is not None:
        try:
            dup.Free()
        except MPI.Exception:
            pass


def next_tag_base(comm: Any) -> int:
    """The tag block of the next compressed call on ``comm`` (after :func:`private_comm`)."""
    n = getattr(comm, "_compression_calls", 0)
    comm._compression_calls = n + 1
    return (n % getattr(comm, "_compression_blocks", 1)) * TAG_SPAN


__all__ = ["RunRequest", "StagedRequest", "TAG_CALLS", "TAG_SPAN", "drop_private_comm",
           "next_tag_base", "private_comm"]
