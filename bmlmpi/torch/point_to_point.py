"""Point-to-point of the bmlmpi backend: torch's ``send``, ``recv`` (from one rank or from any),
and through them ``isend``, ``irecv`` and ``batch_isend_irecv``.

MPI's non-blocking ``Isend``/``Irecv`` on a communicator of their own, duplicated from the
group's when the group is made (so that no message of torch's can match one of bmlmpi's own
collectives, whatever its tag), matched as MPI matches: by source, tag and order. A tag is
torch's ``tag`` (0 to ``MPI_TAG_UB``; others are refused). A CPU tensor is sent from and
received into its own memory (a non-contiguous one through a contiguous copy); a CUDA tensor
is staged through host memory; ``bfloat16`` travels as its bytes. A message must fill the
receiving tensor exactly: a longer one fails the receive with MPI's truncation error, a
shorter one with a ``ValueError`` naming both sizes.

torch's ``batch_isend_irecv`` calls ``isend``/``irecv`` one by one for a backend that is not
torch's own ``ProcessGroup`` class; MPI's non-blocking calls complete such a batch in any
order of its operations.

Deadlines, as for every collective of the backend (:mod:`.work`): a send or receive that does
not complete fails with :class:`bmlmpi.DeadlineExceeded` ``timeout`` seconds after
``Work.wait`` began waiting for it, and at most twice that after its start while only the
progress thread polls it (a receive posted long before its message, as pipeline schedules post
them, needs a timeout that long); a receive given up is cancelled, so that no later message
lands in it.
On the fault-tolerant backend point-to-point runs until a failure; the survivors' ranks are
renumbered then, so later calls are refused with :class:`~.tensors.UnsupportedCall`.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from ..execute import DeadlineExceeded, wait_for
from .tensors import UnsupportedCall, view
from .work import Driver, Started, Work, wait_mpi


def duplicate(comm: MPI.Comm, timeout: float) -> MPI.Comm:
    """The communicator point-to-point runs on: ``comm`` duplicated with ``MPI_Comm_idup``,
    waited for with the deadline (every rank of the group makes it together)."""
    dup, req = comm.Idup()
    wait_mpi(req, timeout, "bmlmpi point-to-point: duplicating the group's communicator")
    return dup


def tag_bound(comm: MPI.Comm) -> int:
    bound = comm.Get_attr(MPI.TAG_UB)
    return int(bound) if bound is not None else 32767


def _check(tensors: list[torch.Tensor], peer: int, tag: int, comm: MPI.Comm,
           what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise UnsupportedCall(f"{what} takes one tensor, not {len(tensors)}")
    if peer != MPI.ANY_SOURCE and not 0 <= peer < comm.Get_size():
        raise UnsupportedCall(f"{what}: rank {peer} is not in the group of "
                              f"{comm.Get_size()}")
    if not 0 <= tag <= tag_bound(comm):
        raise UnsupportedCall(f"{what}: tag {tag} is outside MPI's 0..{tag_bound(comm)}")
    t = tensors[0]
    if t.is_sparse:
        raise UnsupportedCall(f"{what} moves dense tensors; this one is sparse")
    return t


class ReceiveWork(Work):
    """A receive's work: ``_source_rank()`` is the rank the message came from (what torch's
    ``recv`` returns when it received from any rank)."""

    def __init__(self, driver: Driver, started: Started, status: MPI.Status):
        super().__init__(driver, started)
        self._status = status

    def _source_rank(self) -> int:
        self.wait()
        return self._status.Get_source()


def start_send(comm: MPI.Comm, tensors: list[torch.Tensor], dst: int, tag: int,
               rank: int, timeout: float) -> Started:
    """Start sending ``tensors[0]`` to ``dst`` (called under the group's lock)."""
    what = f"bmlmpi send to rank {dst}, tag {tag} (rank {rank})"
    t = _check(tensors, dst, tag, comm, what)
    v = view(t, copy_only=True, device_path=False)
    req = comm.Isend(v.array, dst, tag)
    return Started(what, req.Test, lambda: wait_mpi(req, timeout, what), None, [t], keep=v)


def start_recv(comm: MPI.Comm, tensors: list[torch.Tensor], src: int, tag: int,
               rank: int, timeout: float) -> tuple[Started, MPI.Status]:
    """Start receiving into ``tensors[0]`` from ``src`` (``MPI.ANY_SOURCE``: any rank)
    (called under the group's lock)."""
    peer = "any rank" if src == MPI.ANY_SOURCE else f"rank {src}"
    what = f"bmlmpi recv from {peer}, tag {tag} (rank {rank})"
    t = _check(tensors, src, tag, comm, what)
    v = view(t, copy_only=True, device_path=False)
    status = MPI.Status()
    req = comm.Irecv(v.array, src, tag)
    expected = v.array.nbytes

    def poll() -> bool:
        return req.Test(status)

    def block() -> None:
        try:
            wait_for(poll, timeout, lambda s: f"{what}: no message within {s:g} s")
        except DeadlineExceeded:
            # a receive given up is withdrawn, so that no later message lands in it
            req.Cancel()
            req.Wait(status)
            if not status.Is_cancelled():
                return
            raise

    def finish() -> None:
        got = status.Get_count(MPI.BYTE)
        if got != expected:
            raise ValueError(f"{what}: the message from rank {status.Get_source()} holds "
                             f"{got} bytes, the tensor {expected}")
        if v.finish is not None:
            v.finish()

    return Started(what, poll, block, finish, [t], keep=v), status


__all__ = ["ReceiveWork", "duplicate", "start_recv", "start_send", "tag_bound"]
