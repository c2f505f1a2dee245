"""A non-blocking request driven by a generator: the compressed collectives' progress engine.

A compressed allreduce is a short sequence of stages (agree on a scale and a density, then
exchange); each stage posts MPI requests and yields them. :class:`StagedRequest` advances the
generator inside ``Test``/``Wait`` only, like bmlmpi's own requests, so GradientBuckets'
progress thread drives it unchanged. Every wait has the communicator's deadline: a peer that
never posts its half raises :class:`bmlmpi.DeadlineExceeded` instead of hanging.

Also here: the private duplicate communicator compressed calls send on (so their tags never
meet bmlmpi's own schedules) and the per-communicator call counter that separates the tags of
calls in flight at once (every rank starts compressed calls in the same order, as it must for
bmlmpi's allreduces).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from mpi4py import MPI

from ..execute import wait_for, wait_request

#: distinct tag blocks for compressed calls in flight at once, and tags per block
TAG_CALLS = 32
TAG_SPAN = 1000


def _done(item: Any) -> bool:
    return item.Test()


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
        while not self._finished and (not self._started or
                                      all(_done(r) for r in self._pending)):
            self._started = True
            try:
                self._pending = next(self._gen)
                self._stage += 1
            except StopIteration:
                self._finished = True
                self._pending = ()
            except BaseException as exc:   # raised by this request's own Test/Wait
                self._finished = True
                self._pending = ()
                self._error = exc

    def Test(self) -> bool:
        _drive(self._queue)
        if self._finished and self._error is not None:
            err, self._error = self._error, None
            raise err
        return self._finished

    def Wait(self) -> None:
        wait_for(self.Test, self.timeout,
                 lambda t: f"{self.what}: stage {self._stage} made no progress in {t:g} s",
                 progress=lambda: self._stage)


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
    (made on the first compressed call, which every rank makes in the same order)."""
    dup = getattr(comm, "_compression_comm", None)
    if dup is None:
        dup, req = comm.comm.Idup()
        wait_request(req, comm.timeout, "bmlmpi.compression: not every rank made its first "
                                        "compressed call")
        dup.Set_errhandler(MPI.ERRORS_RETURN)
        comm._compression_comm = dup
        comm._compression_calls = 0
    return dup


def next_tag_base(comm: Any) -> int:
    """The tag block of the next compressed call on ``comm``."""
    n = getattr(comm, "_compression_calls", 0)
    comm._compression_calls = n + 1
    return (n % TAG_CALLS) * TAG_SPAN


__all__ = ["StagedRequest", "TAG_CALLS", "TAG_SPAN", "next_tag_base", "private_comm"]
