"""The collective family as module-level calls, mpi4py's method signatures plus keyword-only
``comm=`` and ``algorithm=``: ``comm.Reduce_scatter_block(a, b)`` becomes
``bmlmpi.Reduce_scatter_block(a, b, comm=comm)``. Each call runs on the
:class:`bmlmpi.Communicator` kept for ``comm`` (the one ``bmlmpi.Allreduce`` uses); the
conventions, checks and failure behaviour are those of its methods (:mod:`bmlmpi.family`,
:mod:`bmlmpi.persistent`).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from .dropin import communicator_for
from .handles import Request
from .persistent import PersistentRequest

_WORLD = MPI.COMM_WORLD


def Reduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                         comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> None:
    """Drop-in ``comm.Reduce_scatter_block(sendbuf, recvbuf, op)``."""
    communicator_for(comm).Reduce_scatter_block(sendbuf, recvbuf, op, algorithm=algorithm)


def Ireduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                          comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> Request:
    return communicator_for(comm).Ireduce_scatter_block(sendbuf, recvbuf, op,
                                                        algorithm=algorithm)


def Reduce_scatter_block_init(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                              comm: MPI.Comm = _WORLD,
                              algorithm: str = "auto") -> PersistentRequest:
    return communicator_for(comm).Reduce_scatter_block_init(sendbuf, recvbuf, op,
                                                            algorithm=algorithm)


def Reduce_scatter(sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                   comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> None:
    """Drop-in ``comm.Reduce_scatter(sendbuf, recvbuf, recvcounts, op)``."""
    communicator_for(comm).Reduce_scatter(sendbuf, recvbuf, recvcounts, op,
                                          algorithm=algorithm)


def Ireduce_scatter(sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                    comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> Request:
    return communicator_for(comm).Ireduce_scatter(sendbuf, recvbuf, recvcounts, op,
                                                  algorithm=algorithm)


def Reduce_scatter_init(sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                        op: Any = MPI.SUM, *, comm: MPI.Comm = _WORLD,
                        algorithm: str = "auto") -> PersistentRequest:
    return communicator_for(comm).Reduce_scatter_init(sendbuf, recvbuf, recvcounts, op,
                                                      algorithm=algorithm)


def _buffer_pair(method: str, doc: str) -> Any:
    """The module-level ``method`` of a call with mpi4py's signature ``(sendbuf, recvbuf)``
    (the allgather and all-to-all calls, six each): it runs ``method`` of the Communicator
    kept for ``comm``."""
    def call(sendbuf: Any, recvbuf: Any, *, comm: MPI.Comm = _WORLD,
             algorithm: str = "auto") -> Any:
        return getattr(communicator_for(comm), method)(sendbuf, recvbuf, algorithm=algorithm)
    call.__name__ = call.__qualname__ = method
    call.__doc__ = doc
    return call


Allgather = _buffer_pair("Allgather", "Drop-in ``comm.Allgather(sendbuf, recvbuf)``.")
Iallgather = _buffer_pair("Iallgather", "Drop-in ``comm.Iallgather(sendbuf, recvbuf)``: a "
                          "Request.")
Allgather_init = _buffer_pair("Allgather_init", "Drop-in ``comm.Allgather_init(sendbuf, "
                              "recvbuf)``: a PersistentRequest.")
Allgatherv = _buffer_pair("Allgatherv", "Drop-in ``comm.Allgatherv(sendbuf, [buf, counts, "
                          "displs, datatype])``.")
Iallgatherv = _buffer_pair("Iallgatherv", "Drop-in ``comm.Iallgatherv``: a Request.")
Allgatherv_init = _buffer_pair("Allgatherv_init", "Drop-in ``comm.Allgatherv_init``: a "
                               "PersistentRequest.")


def Reduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
           comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> None:
    """Drop-in ``comm.Reduce(sendbuf, recvbuf, op, root)``."""
    communicator_for(comm).Reduce(sendbuf, recvbuf, op, root, algorithm=algorithm)


def Ireduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
            comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> Request:
    return communicator_for(comm).Ireduce(sendbuf, recvbuf, op, root, algorithm=algorithm)


def Reduce_init(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
                comm: MPI.Comm = _WORLD, algorithm: str = "auto") -> PersistentRequest:
    return communicator_for(comm).Reduce_init(sendbuf, recvbuf, op, root, algorithm=algorithm)


def Bcast(buf: Any, root: int = 0, *, comm: MPI.Comm = _WORLD,
          algorithm: str = "auto") -> None:
    """Drop-in ``comm.Bcast(buf, root)``."""
    communicator_for(comm).Bcast(buf, root, algorithm=algorithm)


def Ibcast(buf: Any, root: int = 0, *, comm: MPI.Comm = _WORLD,
           algorithm: str = "auto") -> Request:
    return communicator_for(comm).Ibcast(buf, root, algorithm=algorithm)


def Bcast_init(buf: Any, root: int = 0, *, comm: MPI.Comm = _WORLD,
               algorithm: str = "auto") -> PersistentRequest:
    return communicator_for(comm).Bcast_init(buf, root, algorithm=algorithm)


def Allreduce_init(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, comm: MPI.Comm = _WORLD,
                   algorithm: str = "auto") -> PersistentRequest:
    """Drop-in ``comm.Allreduce_init(sendbuf, recvbuf, op)`` (MPI 4 persistent)."""
    ctx = communicator_for(comm)
    return ctx.Allreduce_init(sendbuf, recvbuf, op, algorithm=algorithm)


Alltoall = _buffer_pair("Alltoall", "Drop-in ``comm.Alltoall(sendbuf, recvbuf)``.")
Ialltoall = _buffer_pair("Ialltoall", "Drop-in ``comm.Ialltoall(sendbuf, recvbuf)``: a Request.")
Alltoall_init = _buffer_pair("Alltoall_init", "Drop-in ``comm.Alltoall_init(sendbuf, "
                             "recvbuf)``: a PersistentRequest.")
Alltoallv = _buffer_pair("Alltoallv", "Drop-in ``comm.Alltoallv([sbuf, counts, displs, type], "
                         "[rbuf, counts, displs, type])``.")
Ialltoallv = _buffer_pair("Ialltoallv", "Drop-in ``comm.Ialltoallv``: a Request.")
Alltoallv_init = _buffer_pair("Alltoallv_init", "Drop-in ``comm.Alltoallv_init``: a "
                              "PersistentRequest.")
