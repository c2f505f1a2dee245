"""A call's records and its errors: what an allreduce is after its arguments were checked
(:class:`PreparedCall`), what the first-call agreement sees of a compressed one
(:class:`CompressedCall`), and the errors that checking and agreeing raise on every rank
(docs/contracts.md); how an allreduce's arguments become its record
(:func:`prepare_allreduce`) and how a native one starts (:func:`start_native`). The family's
calls have their own record (:class:`bmlmpi.family.FamilyCall`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from . import buffers, kernels
from .agreement import RemoteArgumentError
from .buffers import BufferSpecError
from .execute import DeadlineExceeded
from .family import FamilyCall
from .handles import NativeRun
from .ops import check_dtype_op, mpi_op, op_name
from .recorder import Signature, Slot
from .topology.bcube import Shape


class ArgumentMismatch(ValueError):
    """Ranks called the same allreduce with different counts, dtypes, ops or algorithms."""


class CommunicatorRevoked(DeadlineExceeded):
    """A call on a communicator that a deadline ended: this rank or another gave up a call
    at its deadline, so the ranks no longer agree on which calls completed. Every later call
    on it raises this; ``Free()`` it and build another (docs/contracts.md). A
    :class:`~bmlmpi.execute.DeadlineExceeded`: code that handles a deadline handles it."""


def earns_dump(exc: BaseException) -> bool:
    """Whether a failed call's exception makes the flight recorder write its dump
    (docs/tracing.md): a call that hung or failed between ranks -- a deadline
    (:class:`~bmlmpi.execute.DeadlineExceeded`, :class:`CommunicatorRevoked`, any
    ``TimeoutError``), an MPI error, ranks that disagree on the call
    (:class:`ArgumentMismatch`). A call refused for its arguments, this rank's or another's
    (:class:`RemoteArgumentError`), is reported on every rank at once and nothing waits:
    no dump."""
    return isinstance(exc, (TimeoutError, MPI.Exception, ArgumentMismatch))


class IntercommunicatorError(ValueError):
    """bmlmpi reduces over intracommunicators only; an intercommunicator is refused.

    Raised by ``Communicator(intercomm)`` and by ``Allreduce``/``Iallreduce`` with
    ``comm=intercomm`` on every rank, decided locally (``comm.Is_inter()``) before any
    communication, so no rank waits on another. ``intercomm.Allreduce`` (mpi4py) gives each
    group the reduction of the other group's data; call it directly for that.
    """


@dataclass(slots=True)
class PreparedCall:
    """One allreduce call after its arguments were checked: what every launch consumes.
    (Not frozen: a frozen dataclass costs half a microsecond more per call to build.)"""

    algorithm: str               # resolved for this call ("auto" already decided)
    op: str                      # bmlmpi's op name (sum, prod, min, max, avg)
    src: np.ndarray | None       # the input, or None for in place (it is already in ``out``)
    out: np.ndarray              # the result, ``count`` elements (a host view when staged)
    staging: Any                 # device buffers staged through host memory, else None
    requested: str               # the algorithm asked for ("auto" stays "auto")
    slot: Slot | None = None     # the call in the flight recorder

    def traced(self) -> Signature:
        """The flight recorder's description of this call."""
        return Signature("allreduce", int(self.out.size), self.out.dtype.name, self.op, None,
                         self.requested, self.algorithm)

    collective = "allreduce"     # the family's calls are FamilyCall (bmlmpi.family)

    def signature(self, shape: Shape) -> tuple:
        """What every rank must agree on (its hash is checked across ranks)."""
        return (self.out.size, self.out.dtype.str, self.op, self.algorithm, shape)

    @staticmethod
    def describe_signature(sig: tuple | None) -> str:
        if sig is not None and sig[0] == "compressed":
            return CompressedCall.describe_signature(sig)
        if sig is None or len(sig) != 5:
            return FamilyCall.describe_signature(sig)
        return (f"allreduce count={sig[0]} dtype={np.dtype(sig[1])} op={sig[2]} "
                f"algorithm={sig[3]}")

    def outcome(self) -> Exception | None:
        """What a committed call raises on every survivor of a failure (never, for an
        allreduce: it completes over the survivors)."""
        return None

    def finish(self, size: int) -> None:
        """What follows the exchange: AVG divides by the ``size`` ranks that contributed,
        and a staged device result is copied back."""
        if self.op == "avg":
            kernels.scale_avg(self.out, size)
        if self.staging is not None:
            self.staging.finish()


@dataclass(slots=True)
class CompressedCall:
    """What the first-call agreement sees of a compressed allreduce (:mod:`bmlmpi.
    compression`): its signature carries the compressor's settings, so a rank that
    compresses (or compresses otherwise) where the others do not fails the agreement."""

    count: int | None
    dtype: str | None
    op: str | None
    algorithm: str
    compression: str
    collective = "allreduce"

    def signature(self, shape: Shape) -> tuple:
        return ("compressed", self.count, self.dtype, self.op, self.algorithm,
                self.compression, shape)

    @staticmethod
    def describe_signature(sig: tuple) -> str:
        _, count, dtype, op, algorithm, compression, _ = sig
        return (f"allreduce count={count} dtype={dtype} op={op} algorithm={algorithm} "
                f"compressed ({compression})")


__all__ = ["ArgumentMismatch", "CommunicatorRevoked", "CompressedCall", "IntercommunicatorError",
           "earns_dump",
           "PreparedCall", "RemoteArgumentError"]


def prepare_allreduce(sendbuf: Any, recvbuf: Any, op: Any, algorithm: str,
                      auto: Callable[[int, np.dtype, str], str]) -> PreparedCall:
    """An allreduce's arguments checked on this rank (mpi4py's buffer specs, device arrays
    staged through host memory) and resolved into its :class:`PreparedCall`; ``auto(count,
    dtype, op)`` decides ``auto``."""
    requested = algorithm
    name = op_name(op)
    if recvbuf is None or recvbuf is MPI.IN_PLACE:
        raise BufferSpecError("recvbuf must be a buffer (sendbuf may be MPI.IN_PLACE)")
    if isinstance(recvbuf, (list, tuple)) and not recvbuf:
        raise BufferSpecError("recvbuf: an empty buffer spec (need buf, [buf, datatype] or "
                              "[buf, count, datatype])")
    device = buffers.is_device_array(recvbuf if not isinstance(recvbuf, (list, tuple))
                                     else recvbuf[0])
    staging = None
    if device:
        from .kernels import gpu
        staging = gpu.stage(sendbuf, recvbuf)
        sendbuf, recvbuf = staging.host_send, staging.host_recv
    recv = buffers.resolve(recvbuf, "recvbuf")
    if not recv.flat.flags.writeable:
        raise BufferSpecError("recvbuf is read-only")
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        send = None
        count = recv.count
    else:
        send = buffers.resolve(sendbuf, "sendbuf")
        count = send.count
        if send.flat.dtype != recv.flat.dtype:
            raise BufferSpecError(f"sendbuf dtype {send.flat.dtype} differs from recvbuf "
                                  f"dtype {recv.flat.dtype}")
        if recv.count < count:
            raise BufferSpecError(f"recvbuf holds {recv.count} elements, fewer than the "
                                  f"{count} sent")
    dtype = recv.flat.dtype
    check_dtype_op(dtype, name)
    if algorithm == "auto":
        algorithm = auto(count, dtype, name)
    out = recv.flat[:count]
    src = None if send is None else send.flat
    if src is not None and np.may_share_memory(src, out):
        if not (src.__array_interface__["data"][0] == out.__array_interface__["data"][0]):
            raise BufferSpecError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")
        src = None  # the same memory: an in-place call spelled with two names
    return PreparedCall(algorithm, name, src, out, staging, requested)


def start_native(call: PreparedCall, comm: MPI.Comm, finish: Callable[[], None] | None,
                 rank: int, is_failure: Callable[[MPI.Exception], bool]) -> NativeRun:
    """``call`` started as ``MPI_Iallreduce`` on ``comm`` into a private buffer, copied to
    the caller's on completion: a call given up at its deadline can still complete inside
    MPI when a late rank joins it, and must then write memory bmlmpi holds, not the
    caller's. ``is_failure``: whether an MPI error reports a failed process (raised as it
    is, for fault tolerance to handle)."""
    out = call.out
    sbuf = out if call.src is None else call.src
    private = np.empty_like(out)
    try:
        req = comm.Iallreduce(sbuf, private, mpi_op(call.op))
    except (KeyError, ValueError, MPI.Exception) as exc:
        if isinstance(exc, MPI.Exception) and is_failure(exc):
            raise
        if out.size > np.iinfo(np.int32).max:
            raise ValueError(
                f"native MPI_Allreduce of {out.size} elements: the count exceeds what "
                f"this MPI's int-count call takes (2**31 - 1); use a bmlmpi algorithm "
                f"(ring, bml) for it: {exc}") from exc
        raise TypeError(f"native MPI_Allreduce cannot reduce dtype {call.out.dtype} "
                        f"with this MPI: {exc}") from exc
    return NativeRun(req, finish, rank, private=private, out=out)
