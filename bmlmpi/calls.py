"""A call's records and its errors: what an allreduce is after its arguments were checked
(:class:`PreparedCall`), what the first-call agreement sees of a compressed one
(:class:`CompressedCall`), and the errors that checking and agreeing raise on every rank
(docs/contracts.md). The family's calls have their own record (:class:`bmlmpi.family.FamilyCall`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kernels
from .execute import DeadlineExceeded
from .family import FamilyCall
from .recorder import Signature, Slot
from .topology.bcube import Shape


class ArgumentMismatch(ValueError):
    """Ranks called the same allreduce with different counts, dtypes, ops or algorithms."""


class RemoteArgumentError(ValueError):
    """Another rank rejected its arguments; this rank's call fails with it instead of hanging."""


class CommunicatorRevoked(DeadlineExceeded):
    """A call on a communicator that a deadline ended: this rank or another gave up a call
    at its deadline, so the ranks no longer agree on which calls completed. Every later call
    on it raises this; ``Free()`` it and build another (docs/contracts.md). A
    :class:`~bmlmpi.execute.DeadlineExceeded`: code that handles a deadline handles it."""


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
           "PreparedCall", "RemoteArgumentError"]
