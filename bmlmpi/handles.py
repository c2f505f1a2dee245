"""The handles a communicator's calls return and run: :class:`Request` (a non-blocking call's
``Test``/``Wait``), :class:`NativeRun` (the MPI library's own non-blocking call seen as a
schedule's :class:`~bmlmpi.execute.Run`) and :class:`NativePersistent` (its persistent
request, on buffers of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from .execute import Run


class CallRecord(Protocol):
    """What a communicator keeps of one started call, behind its :class:`Request`: the plain
    communicator's record (:mod:`bmlmpi.api`), the fault-tolerant ledger's call
    (:class:`bmlmpi.ft.ledger.Call`) and a compressed call's staged request
    (:class:`bmlmpi.compression.engine.StagedRequest`). ``test()`` advances it (and the
    communicator's other calls) and says whether it is complete; ``wait()`` returns once it
    is, raising :class:`~bmlmpi.execute.DeadlineExceeded` after the deadline without
    progress (naming what it waits for); ``run``: the exchange running now, or None."""

    @property
    def run(self) -> Any: ...

    def test(self) -> bool: ...

    def wait(self) -> None: ...


class Request:
    """The handle of a non-blocking allreduce (``Test``/``Wait``, as an ``MPI.Request``).

    bmlmpi has no progress thread: an allreduce advances while the caller is inside ``Test``
    or ``Wait`` of any of its communicator's requests. Each of those calls advances every
    outstanding allreduce of the communicator, oldest first, so ranks may wait on their
    requests in any order without deadlocking each other. The handle holds only its
    communicator's record of this allreduce (``test()``, ``wait()``, ``run``).
    """

    __slots__ = ("_call",)

    def __init__(self, call: CallRecord):
        self._call = call

    @property
    def run(self) -> Run | NativeRun | None:
        """The exchange this allreduce runs now (a schedule :class:`~bmlmpi.execute.Run`, or
        the native ``MPI_Iallreduce``), for instrumentation; after a fault-tolerant recovery,
        the latest attempt's; None while no attempt is running."""
        return self._call.run

    def Test(self) -> bool:
        """Advance the communicator's allreduces; True once this one is complete."""
        return self._call.test()

    def Wait(self) -> None:
        """Return once this allreduce is complete; DeadlineExceeded after ``timeout`` s
        without progress (the allreduce is then abandoned)."""
        self._call.wait()

    # mpi4py spells these in lower case for the pickle-based API; accept both.
    test = Test
    wait = Wait


class NativeRun:
    """A native ``MPI_Iallreduce`` seen through the same interface as a schedule Run.

    ``private``: the buffer MPI writes the result into, copied to ``out`` only once the
    request completed. A call given up at its deadline leaves MPI holding ``private`` (kept
    alive by this object, which the communicator keeps), never the caller's buffer."""

    def __init__(self, req: MPI.Request, finish: Callable[[], None] | None, rank: int,
                 what: str = "", private: np.ndarray | None = None,
                 out: np.ndarray | None = None):
        self.req = req
        self.finish = finish
        self.rank = rank
        self.step = 0
        self.what = what or f"native MPI_Iallreduce (rank {rank})"
        self.private = private
        self.out = out

    def cancel(self, bound: float = 0.0) -> list[MPI.Request]:
        """A collective cannot be cancelled: the request stays with MPI (and ``private``
        with it)."""
        return [self.req]

    def test(self) -> bool:
        if self.step == 0 and self.req.Test():
            if self.private is not None:
                np.copyto(self.out, self.private)
            if self.finish is not None:
                self.finish()
            self.step = 1
        return self.step == 1

    @property
    def progress(self) -> int:
        return self.step

    @property
    def reqs(self) -> list[MPI.Request]:
        return [self.req]

    def describe_timeout(self, timeout: float) -> str:
        return f"{self.what} made no progress in {timeout:g} s"


class NativePersistent:
    """The MPI library's persistent request of a native ``…_init`` call, bound to buffers of
    its own: ``deliver()`` copies them into the caller's after each completed start, so a
    start given up at its deadline never writes the caller's buffer later."""

    __slots__ = ("req", "deliver")

    def __init__(self, req: MPI.Prequest, deliver: Callable[[], None] | None):
        self.req = req
        self.deliver = deliver

    def Free(self) -> None:
        """Free the MPI request unless a start of it is still in MPI's hands (a start given
        up at its deadline: freeing an active persistent collective is erroneous; the
        communicator holds it)."""
        try:
            if self.req.Test():
                self.req.Free()
        except MPI.Exception:
            pass


__all__ = ["CallRecord", "NativePersistent", "NativeRun", "Request"]
