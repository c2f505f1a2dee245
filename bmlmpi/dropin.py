"""The module-level drop-ins for mpi4py's calls: ``bmlmpi.Allreduce(a, b, op, comm=comm)``
and ``bmlmpi.Iallreduce``, each on the :class:`~bmlmpi.api.Communicator` kept for the user's
communicator (:func:`communicator_for`: made on first use, attached to that communicator as
an MPI attribute so that it lives and dies with it).
"""

from __future__ import annotations

import contextlib
from typing import Any

from mpi4py import MPI

from .api import Communicator
from .handles import Request

#: The module-level calls' last (user communicator, Communicator): a repeated call skips
#: ``Get_attr``. Forgotten when MPI deletes the attribute (the user's communicator is freed),
#: so a freed communicator fails in ``Get_attr`` as before.
_last: tuple[MPI.Comm | None, Communicator | None] = (None, None)


def _forget(comm: MPI.Comm, keyval: int, ctx: Communicator) -> None:
    """MPI deletes the attribute: the user freed ``comm`` (or MPI is finalizing). The
    Communicator made for it is freed with it (its duplicates, its watchdog thread), unless
    MPI is finalizing (freeing communicators then is not allowed everywhere) or it still has
    calls outstanding (Free refuses; they keep what they need)."""
    global _last
    if _last[1] is ctx:
        _last = (None, None)
    if not MPI.Is_finalized() and comm not in (MPI.COMM_WORLD, MPI.COMM_SELF):
        with contextlib.suppress(Exception):
            ctx.Free()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_forget)


def communicator_for(comm: MPI.Comm) -> Communicator:
    """The Communicator the module-level calls use for the user's ``comm`` (made on first
    use, kept as an attribute of ``comm``)."""
    global _last
    if comm is _last[0]:
        return _last[1]
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = Communicator(comm)
        comm.Set_attr(_KEYVAL, ctx)
    _last = (comm, ctx)
    return ctx


def Allreduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, comm: MPI.Comm = MPI.COMM_WORLD,
              algorithm: str = "auto") -> None:
    """Drop-in ``comm.Allreduce(sendbuf, recvbuf, op)`` running a bmlmpi algorithm.

    Costs what ``comm.Allreduce`` costs (plus about 1 µs) where the signature runs native,
    after its first call; the deadline is then the watchdog's (see :class:`Communicator`:
    a call blocked past ``BMLMPI_TIMEOUT`` aborts the job; ``BMLMPI_BLOCKING=polled`` raises
    DeadlineExceeded instead)."""
    last_comm, ctx = _last
    if comm is not last_comm:
        ctx = communicator_for(comm)
    ctx.Allreduce(sendbuf, recvbuf, op, algorithm=algorithm)


def Iallreduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, comm: MPI.Comm = MPI.COMM_WORLD,
               algorithm: str = "auto") -> Request:
    """Non-blocking :func:`Allreduce`; progresses inside the request's ``Test``/``Wait``."""
    return communicator_for(comm).Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm)
