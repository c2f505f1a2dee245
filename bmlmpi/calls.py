"""The call record and a call's errors: what every collective call is after its arguments
were checked (:class:`CollectiveCall`: the allreduce and the rest of the family alike), what
the first-call agreement sees of a compressed allreduce (:class:`CompressedCall`), and the
errors that checking and agreeing raise on every rank (docs/contracts.md); how an
allreduce's arguments become its record (:func:`prepare_allreduce`; the family's prepare
steps are in :mod:`bmlmpi.family`). The record says how its call runs: natively
(:meth:`CollectiveCall.start_native`) or as its schedule's compiled plan
(:meth:`CollectiveCall.compiled`, :meth:`CollectiveCall.start_plan`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from . import buffers, kernels
from .agreement import RemoteArgumentError
from .buffers import BufferSpecError
from .execute import DeadlineExceeded
from .executors import start_allreduce, start_collective
from .handles import NativeRun
from .ops import check_dtype_op, mpi_op, op_name
from .recorder import Signature
from .schedules.algorithms import AUTO
from .schedules.algorithms import get as algorithm_record
from .schedules.collectives import COLLECTIVES
from .schedules.collectives import collective as collective_record
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


__all__ = ["ArgumentMismatch", "CollectiveCall", "CommunicatorRevoked", "CompressedCall",
           "IntercommunicatorError", "RemoteArgumentError", "earns_dump"]



def _method(comm: MPI.Comm, name: str, form: str) -> Any:
    if form == "I":
        return getattr(comm, "I" + name.lower())
    return getattr(comm, name + form)


def _digest(values: tuple[int, ...]) -> str:
    return hashlib.blake2b(repr(values).encode(), digest_size=8).hexdigest()


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, which numpy computes afresh each time (~10 us: more than the rest of
    a call's record)."""
    return dtype.name


def _bytes(a: np.ndarray) -> np.ndarray:
    """``a``'s memory as bytes (an empty one as no bytes)."""
    return a.view(np.uint8) if a.size else np.empty(0, np.uint8)


def then(first: Any, second: Any) -> Any:
    """``first()`` then ``second()`` (either may be None)."""
    if first is None or second is None:
        return second if first is None else first

    def both() -> None:
        first()
        second()
    return both


def offsets(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Where each rank's block starts when the blocks lie one after another in rank order."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return tuple(out)



@dataclass(slots=True, eq=False)
class CollectiveCall:
    """One collective call (allreduce, reduce-scatter, allgather, reduce, broadcast) after
    its arguments were checked: what the pipeline numbers, agrees, binds and starts.

    The exchange runs over one flat buffer of ``total`` elements (``total`` = the sum of
    ``counts``, in rank order, for reduce-scatter and allgather; the count for allreduce,
    reduce and broadcast): ``out`` holds the result and ``src`` this rank's input when it
    is not already in ``out`` (None: it is, and a fault-tolerant re-run restores ``out``
    first). An all-to-all's ``counts`` is the ``size × size`` pair matrix
    (:mod:`bmlmpi.schedules.collectives`): ``src`` holds this rank's row, ``out`` its
    column, each block at its displacement. (Not frozen: a frozen dataclass costs more per
    call to build.)
    """

    collective: str             # allreduce | reduce_scatter | allgather | reduce | bcast |
    #                             alltoall
    mpi_name: str               # the mpi4py method this call stands for
    algorithm: str              # resolved ("auto" already decided)
    requested: str              # as asked ("auto" stays "auto")
    op: str                     # bmlmpi op name; "sum" (unused) for allgather and bcast
    counts: tuple[int, ...]     # elements per rank (reduce_scatter, allgather); (count,) else
    root: int                   # reduce, bcast; 0 otherwise
    rank: int
    size: int
    src: np.ndarray | None      # the input when it is not in ``out``
    out: np.ndarray             # reduce_scatter in place: the whole input; see the methods
    result: np.ndarray | None   # reduce_scatter: this rank's block of recvbuf (else None)
    displs: tuple[int, ...] | None = None  # allgather, alltoall: slot starts in ``out``
    #                                        (None: packed)
    send_displs: tuple[int, ...] | None = None  # alltoall: block starts in ``src`` (None:
    #                                             packed; in place: ``displs``)
    staging: Any = None         # DeviceStaging of device buffers (copied back at finish)
    native_block: bool = False  # Reduce_scatter_block / Allgather (equal blocks) natively
    extra: dict = field(default_factory=dict)
    slot: Any = None            # the call in the flight recorder (bmlmpi.recorder)
    wire: Any = None            # its call format's carrier (bmlmpi.call_formats); None: the
    #                             values themselves are reduced

    # -- what the pipeline and the fault-tolerant ledger read ------------------------------
    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def dtype(self) -> np.dtype:
        return self.out.dtype

    def signature(self, shape: Any) -> tuple:
        """What every rank must agree on (its hash is checked across ranks). One count needs
        no digest of the counts: the total is it."""
        counts = self.counts
        # A size-free collective's call runs among a failure's survivors as it was prepared,
        # so a survivor that prepared it after the shrink (a lagging rank) must agree with
        # those that prepared it before: its signature leaves the size out. The others are
        # prepared again for the survivors (their counts are per member): their size stays.
        size = None if collective_record(self.collective).size_free else self.size
        # a carried call's op names its format: ranks that carry it differently disagree
        op = self.op if self.wire is None else f"{self.op} ({self.wire.name})"
        return (self.collective, size, len(counts), sum(counts),
                _digest(counts) if len(counts) > 1 else "", self.out.dtype.str, op, self.root,
                self.algorithm, tuple(shape), self.requested == AUTO)

    def traced(self) -> Signature:
        """The flight recorder's description of this call."""
        record = collective_record(self.collective)
        return Signature(self.collective, int(sum(self.counts)), _dtype_name(self.out.dtype),
                         self.op if record.reduces else None,
                         self.root if record.rooted else None,
                         self.requested, self.algorithm)

    def blocked_in_mpi(self, rank: int, size: int) -> str:
        """What the watchdog says of this call while it is inside mpi4py's blocking call on
        ``rank`` of ``size`` ranks."""
        op = f" {self.op}" if collective_record(self.collective).reduces else ""
        return (f"bmlmpi native {self.collective} (blocking MPI_{self.mpi_name} of "
                f"{self.total} x {self.dtype}{op}, rank {rank} of {size})")

    @staticmethod
    def describe_signature(sig: tuple | None) -> str:
        """A signature (:meth:`signature`, or a compressed allreduce's) in words."""
        if sig is not None and sig[0] == "compressed":
            return CompressedCall.describe_signature(sig)
        if sig is None or sig[0] not in COLLECTIVES:
            return repr(sig)
        what, size, nblocks, total, _, dtype, op, root, algorithm, shape, auto = sig
        asked = f"{algorithm} (auto)" if auto else algorithm
        if what == "allreduce":
            return (f"allreduce count={total} dtype={np.dtype(dtype)} op={op} "
                    f"algorithm={asked} bcube={shape}")
        return (f"{what} of {total} x {np.dtype(dtype)} ({nblocks} block(s)) op={op} "
                f"root={root} algorithm={asked} of {size} ranks bcube={shape}")

    @property
    def is_in_place(self) -> bool:
        return self.src is None

    @property
    def tag_kind(self) -> int:
        """The collective's block of the tag space
        (:attr:`~bmlmpi.schedules.collectives.Collective.tag_kind`)."""
        return collective_record(self.collective).tag_kind

    def plan_key(self) -> tuple:
        """What its compiled plan and its signature's number (in the tags) are kept by: an
        allreduce's ``(algorithm, count, dtype, op)``, as its blocking fast path keeps it
        (:mod:`bmlmpi.fast_path`); the collective, its blocks and root for the others."""
        if self.collective == "allreduce":
            return (self.algorithm, self.out.size, self.out.dtype, self.op)
        return (self.collective, self.algorithm, self.counts, self.root, self.dtype, self.op)

    def plan_again(self) -> Callable[[Any], Any] | None:
        """How the fast path compiles this call's plan again on a :class:`~bmlmpi.plans.
        PlanCache` whose communicator moved (a repair), holding none of its buffers: an
        allreduce's from its plan key; None for the others, whose entries close then (their
        next call takes the checked path, which compiles the plan and opens them again)."""
        if self.collective != "allreduce":
            return None
        algorithm, count, dtype, op = self.plan_key()
        return lambda plans: plans.plan(algorithm, count, dtype, op)

    def auto(self, plans: Any) -> str:
        """``auto``'s choice for this call on ``plans``' communicator
        (:class:`bmlmpi.plans.PlanCache`): a carried call's under its own key, priced for the
        words it carries."""
        if self.collective == "allreduce":
            return plans.auto_for(self.out.size, self.out.dtype, self.op, self.wire)
        return plans.family_auto(self)

    def outcome(self) -> Exception | None:
        """What the call raises on every survivor once committed after a failure (the
        fault-tolerant contracts, :mod:`bmlmpi.ft.family`), else None (an allreduce
        completes over the survivors)."""
        return self.extra.get("error")

    def finish(self, size: int) -> None:
        """What follows the exchange: AVG divides the reduced result by the ``size`` ranks
        that contributed (allreduce: the result; reduce-scatter: this rank's block; reduce:
        the root's result), and staged device buffers get the result."""
        if self.op == "avg":
            averaged = self.averaged()
            if averaged is not None:
                kernels.scale_avg(averaged, size)
        if self.staging is not None:
            self.staging.finish()

    def averaged(self) -> np.ndarray | None:
        """The result AVG divides on this rank (allreduce: the result; reduce-scatter: this
        rank's block; reduce: the root's result); None where this rank receives none."""
        if self.collective == "reduce_scatter":
            return self.result
        if self.collective == "allreduce" or (self.collective == "reduce"
                                              and self.rank == self.root):
            return self.out
        return None

    # -- the native launch: mpi4py's own call on the private communicator -------------------
    def native(self, comm: MPI.Comm, form: str = "") -> Any:
        """mpi4py's own call for this one on ``comm`` with the user's buffers (the blocking
        call, ``form`` ""; what the watchdog bounds). Reduce-scatter is
        ``Reduce_scatter_block`` or ``Reduce_scatter`` as called; an allgather is
        ``Allgather`` where its equal slots are packed, else ``Allgatherv``, over bytes (any
        datatype)."""
        name, args, _ = self.native_args(False)
        return _method(comm, name, form)(*args)

    def native_private(self, comm: MPI.Comm, form: str = "I") -> tuple[Any, Any]:
        """(request, deliver): mpi4py's non-blocking (``form`` "I") or persistent
        (``"_init"``) call for this one on ``comm``, writing into buffers of its own;
        ``deliver()`` copies them into the caller's once the request completed. A call given
        up at its deadline may still complete inside MPI when a late rank joins it: it then
        writes memory bmlmpi holds (the request's run keeps it), never the caller's
        (docs/contracts.md, "After a deadline"). ``deliver`` is None where MPI writes
        nothing on this rank (a broadcast's root, a reduce's other ranks)."""
        name, args, deliver = self.native_args(True)
        return _method(comm, name, form)(*args), deliver

    def native_args(self, private: bool) -> tuple[str, tuple, Any]:
        """(mpi4py method, its arguments, the copy from the private buffers or None)."""
        what = self.collective
        deliver = None
        if what == "allreduce":
            op = mpi_op(self.op)
            if not private:
                return "Allreduce", (MPI.IN_PLACE if self.src is None else self.src,
                                     self.out, op), None
            sbuf = self.out if self.src is None else self.src
            rbuf, dst = np.empty_like(self.out), self.out

            def deliver() -> None:
                np.copyto(dst, rbuf)
            return "Allreduce", (sbuf, rbuf, op), deliver
        if what == "reduce_scatter":
            op = mpi_op(self.op)
            if private and self.extra.get("owned", False):
                # buffers of bmlmpi's own (a carried call's words and block, held by its run)
                sbuf, rbuf = self.src, self.result
            elif private:
                # in place, MPI reads the whole input from ``out`` and writes this rank's
                # block to its start: the same call with the input as sendbuf
                sbuf = self.out if self.src is None else self.src
                rbuf = np.empty_like(self.result)
                dst = self.result

                def deliver() -> None:
                    np.copyto(dst, rbuf)
            else:
                sbuf = MPI.IN_PLACE if self.src is None else self.src
                rbuf = self.out if self.src is None else self.result
            if self.native_block:
                return "Reduce_scatter_block", (sbuf, rbuf, op), deliver
            return "Reduce_scatter", (sbuf, rbuf, list(self.counts), op), deliver
        if what == "allgather":
            displs = self.displs or offsets(self.counts)
            rbuf = np.empty_like(self.out) if private else self.out
            # equal blocks packed (an Allgather) go as MPI's Allgather, the call user code
            # makes: MPI libraries choose their algorithms for Allgatherv separately
            block = self.native_block and self.displs is None
            rspec = ([rbuf, MPI.BYTE] if block
                     else [rbuf, list(self.counts), list(displs), MPI.BYTE])
            if self.src is not None:
                sbuf = [self.src, MPI.BYTE]
            elif private:
                at, n = displs[self.rank], self.counts[self.rank]
                sbuf = [self.out[at:at + n], MPI.BYTE]
            else:
                sbuf = MPI.IN_PLACE
            if private:
                out, counts = self.out, self.counts

                def deliver() -> None:
                    if self.displs is None:
                        np.copyto(out[:self.total], rbuf[:self.total])
                        return
                    for at, n in zip(displs, counts, strict=True):
                        np.copyto(out[at:at + n], rbuf[at:at + n])
            return ("Allgather" if block else "Allgatherv"), (sbuf, rspec), deliver
        if what == "alltoall":
            return self._alltoall_args(private)
        if what == "reduce":
            op = mpi_op(self.op)
            if self.rank != self.root:
                return "Reduce", (self.src, None, op, self.root), None
            if private and self.extra.get("owned", False) and self.src is not None:
                sbuf, rbuf = self.src, self.out   # bmlmpi's own, as a reduce-scatter's above
            elif private:
                sbuf = self.out if self.src is None else self.src
                rbuf, dst = np.empty_like(self.out), self.out

                def deliver() -> None:
                    np.copyto(dst, rbuf)
            else:
                sbuf = MPI.IN_PLACE if self.src is None else self.src
                rbuf = self.out
            return "Reduce", (sbuf, rbuf, op, self.root), deliver
        if not private or self.rank == self.root:
            return "Bcast", ([self.out, MPI.BYTE], self.root), None
        rbuf, dst = np.empty_like(self.out), self.out

        def deliver() -> None:
            np.copyto(dst, rbuf)
        return "Bcast", ([rbuf, MPI.BYTE], self.root), deliver

    def _alltoall_args(self, private: bool) -> tuple[str, tuple, Any]:
        """An all-to-all's :meth:`native_args`: ``Alltoall`` of equal packed blocks, else
        ``Alltoallv`` with this rank's row and column of the pair matrix and the
        displacements, over bytes (any datatype travels unchanged). In place, the blocking
        call is MPI's ``MPI_IN_PLACE``; a private one reads the input from ``out`` and
        receives into its own buffer."""
        item = self.dtype.itemsize
        size, rank = self.size, self.rank
        sends = tuple(c * item for c in self.counts[rank * size:(rank + 1) * size])
        recvs = tuple(self.counts[j * size + rank] * item for j in range(size))
        rd = (offsets(recvs) if self.displs is None
              else tuple(d * item for d in self.displs))
        send_from = self.out if self.src is None else self.src
        if self.src is None:
            sd = rd
        elif self.send_displs is not None:
            sd = tuple(d * item for d in self.send_displs)
        else:
            sd = offsets(sends)
        out = _bytes(self.out)
        # a carried call's column is bmlmpi's own, held by its run: MPI writes it directly
        owned = private and self.extra.get("owned", False) and self.src is not None
        rbuf = np.empty_like(out) if private and not owned else out
        equal = self.native_block and self.displs is None and self.send_displs is None
        if private or self.src is not None:
            sbuf: Any = ([_bytes(send_from)[:sum(sends)], MPI.BYTE] if equal
                         else [_bytes(send_from), (list(sends), list(sd)), MPI.BYTE])
        else:
            sbuf = MPI.IN_PLACE
        rspec = ([rbuf[:sum(recvs)], MPI.BYTE] if equal
                 else [rbuf, (list(recvs), list(rd)), MPI.BYTE])
        deliver = None
        if private and not owned:
            def deliver() -> None:
                for at, n in zip(rd, recvs, strict=True):
                    np.copyto(out[at:at + n], rbuf[at:at + n])
        return ("Alltoall" if equal else "Alltoallv"), (sbuf, rspec), deliver

    # -- the scheduled launch: the schedule's input and output buffers ----------------------
    def schedule_buffers(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(this rank's input, its output) as a schedule of the collective names them
        (:mod:`bmlmpi.schedules.collectives`): the executor copies between them and its work
        buffer (:func:`bmlmpi.execute.collective_run`); an allreduce's input is None when it
        is in ``out`` already. An allgather with displacements of
        its own gathers into a packed buffer that :meth:`place` spreads out."""
        what = self.collective
        if what == "allreduce":
            return self.src, self.out
        if what == "reduce_scatter":
            return (self.out if self.src is None else self.src), self.result
        if what == "allgather":
            lo, n = offsets(self.counts)[self.rank], self.counts[self.rank]
            if self.displs is None:
                packed = self.out[:self.total]
                return (packed[lo:lo + n] if self.src is None else self.src), packed
            d = self.displs[self.rank]
            mine = self.out[d:d + n] if self.src is None else self.src
            return mine, np.empty(self.total, self.dtype)
        if what == "reduce":
            if self.rank == self.root:
                return (self.out if self.src is None else self.src), self.out
            return self.src, None
        if what == "bcast":
            return (self.out if self.rank == self.root else None), self.out
        if what == "alltoall":
            return self._alltoall_buffers()
        # a registered collective (bmlmpi.schedules.collectives.register): its input and its
        # output, the input read from the output where the call is in place
        return (self.out if self.src is None else self.src), self.out

    def _alltoall_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """An all-to-all's (packed row, packed column): the caller's own memory where the
        blocks lie packed, else copies (the row gathered from its displacements now, the
        column spread to them by :meth:`place`). In place the row is read from ``out``
        (a copy: the schedule's work buffer takes it before anything is received)."""
        size, rank = self.size, self.rank
        sends = self.counts[rank * size:(rank + 1) * size]
        recvs = tuple(self.counts[j * size + rank] for j in range(size))
        if self.src is None:
            source, at = self.out, self.displs
        else:
            source, at = self.src, self.send_displs
        if at is None:
            row = source[:sum(sends)]
        else:
            row = np.empty(sum(sends), self.dtype)
            for lo, d, n in zip(offsets(sends), at, sends, strict=True):
                np.copyto(row[lo:lo + n], source[d:d + n])
        if self.displs is None:
            return row, self.out[:sum(recvs)]
        return row, np.empty(sum(recvs), self.dtype)

    def place(self, output: np.ndarray | None) -> None:
        """After a scheduled allgather or all-to-all into a packed buffer: every slot to its
        displacement."""
        if self.displs is None:
            return
        if self.collective == "allgather":
            for c, lo, d in zip(self.counts, offsets(self.counts), self.displs, strict=True):
                np.copyto(self.out[d:d + c], output[lo:lo + c])
        elif self.collective == "alltoall":
            size = self.size
            recvs = tuple(self.counts[j * size + self.rank] for j in range(size))
            for c, lo, d in zip(recvs, offsets(recvs), self.displs, strict=True):
                np.copyto(self.out[d:d + c], output[lo:lo + c])

    def carried(self, words: np.ndarray, per_value: int, rank: int, size: int
                ) -> tuple[CollectiveCall, np.ndarray | None, np.ndarray | None, int]:
        """The plain call of the same collective over ``words`` (this rank's whole input as
        int64 words, ``per_value`` of them a value; :mod:`bmlmpi.call_formats`) on ``rank``
        of ``size`` ranks now: (the words' call, the words that hold this rank's result once
        it completed, or None where this rank receives none, the output they decode into,
        the position of that output's first value in the input)."""
        counts = tuple(c * per_value for c in self.counts)
        if self.collective == "reduce_scatter":
            block = np.empty(counts[rank], np.int64)
            call = CollectiveCall("reduce_scatter", self.mpi_name, self.algorithm,
                                  self.requested, "sum", counts, 0, rank, size, words, block,
                                  block, native_block=self.native_block,
                                  extra={"owned": True})
            return call, block, self.result, offsets(self.counts)[rank]
        if self.collective == "reduce":
            mine = rank == self.root
            out = np.empty(words.size if mine else 0, np.int64)
            call = CollectiveCall("reduce", "Reduce", self.algorithm, self.requested, "sum",
                                  counts, self.root, rank, size, words, out, None,
                                  extra={"owned": True})
            return call, (out if mine else None), (self.out if mine else None), 0
        # the words are the carrier's own, held by its run: MPI may sum them in place
        call = CollectiveCall(self.collective, self.mpi_name, self.algorithm, self.requested,
                              "sum", counts, 0, rank, size, None, words, None,
                              extra={"owned": True})
        return call, words, self.out, 0

    def alltoall_serves(self) -> bool:
        """Whether this call's algorithm serves the all-to-all (``shm``, ``hierarchical``,
        ``native``, ...)."""
        return algorithm_record(self.algorithm).serves("alltoall")

    def meet_serves(self) -> bool:
        """Whether the pipelined meet (:mod:`bmlmpi.schedules.meet`) carries this call: an
        allreduce into a contiguous one-dimensional result whose algorithm serves no
        all-to-all (its values would otherwise travel by ``pairwise``)."""
        return (self.collective == "allreduce" and self.out.flags.c_contiguous
                and self.out.ndim == 1 and not self.alltoall_serves())

    def halves_serve(self) -> bool:
        """Whether :meth:`halves` applies: an allreduce into a contiguous result whose
        algorithm serves the reduce-scatter and the allgather."""
        if self.collective != "allreduce" or not self.out.flags.c_contiguous:
            return False
        record = algorithm_record(self.algorithm)
        return record.serves("reduce_scatter") and record.serves("allgather")

    def meeting(self, counts: tuple[int, ...], rank: int, size: int,
                column: Callable[[tuple[int, int]], np.ndarray] | None = None
                ) -> tuple[CollectiveCall, np.ndarray]:
        """The all-to-all that brings the addends of a reduction in blocks of ``counts``
        values (block j of every rank's input to rank j, the blocks a reduce-scatter sums,
        each sent once, straight to its owner, as it is) to where they meet, on ``rank`` of
        ``size`` ranks now: (its call, the column it receives, of shape (``size``,
        ``counts[rank]``), one row a rank, from ``column(shape)``, default a new array). By
        this call's algorithm where it serves the all-to-all, else by ``pairwise``."""
        shape = (size, counts[rank])
        rows = np.empty(shape, self.dtype) if column is None else column(shape)
        record = algorithm_record(self.algorithm)
        algorithm = self.algorithm if record.serves("alltoall") else "pairwise"
        inp, _ = self.schedule_buffers()
        if inp is None:
            inp = self.out
        exchange = CollectiveCall("alltoall", "Alltoallv", algorithm, self.requested, "sum",
                                  counts * size, 0, rank, size, inp.reshape(-1),
                                  rows.reshape(-1), None,
                                  native_block=len(set(counts)) == 1,
                                  extra={"owned": True})
        return exchange, rows

    def halves(self, rank: int, size: int,
               column: Callable[[tuple[int, int]], np.ndarray] | None = None
               ) -> tuple[CollectiveCall, np.ndarray, int, CollectiveCall]:
        """An allreduce summed where its addends meet (:mod:`bmlmpi.call_formats`), on
        ``rank`` of ``size`` ranks now, in balanced blocks of whole values: the all-to-all
        of :meth:`meeting`, and the allgather of the summed values in place on ``out``'s
        bytes, by this call's algorithm: (the all-to-all's call, its column, the position of
        the block's first value, the allgather's call)."""
        n = self.out.size
        counts = tuple(n // size + (r < n % size) for r in range(size))
        exchange, rows = self.meeting(counts, rank, size, column)
        item = self.out.itemsize
        gather = CollectiveCall("allgather", "Allgather", self.algorithm, self.requested,
                                "sum", tuple(c * item for c in counts), 0, rank, size, None,
                                self.out.view(np.uint8), None)
        return exchange, rows, offsets(counts)[rank], gather

    def compiled(self, plans: Any) -> Any:
        """This call's schedule compiled for ``plans``' communicator (cached per signature,
        :class:`bmlmpi.plans.PlanCache`)."""
        if self.collective == "allreduce":
            return plans.plan(self.algorithm, self.out.size, self.out.dtype, self.op)
        return plans.family_plan(self)

    def start_plan(self, plan: Any, tag_base: int, label: str,
                   finish: Callable[[], None] | None) -> Any:
        """The run of ``plan`` (:meth:`compiled`) on this call's buffers, on the message or
        the shared-memory executor the plan was bound to; ``finish`` runs once it
        completed. An allreduce runs in place on ``out``, reading a separate input only
        where it must (:mod:`bmlmpi.deferred`); the others run on the buffers
        :meth:`schedule_buffers` names, the result placed (:meth:`place`) before
        ``finish``."""
        inp, output = self.schedule_buffers()
        if self.displs is not None:
            def placed() -> None:
                self.place(output)
                if finish is not None:
                    finish()
            return start_schedule(self.collective, plan, inp, output, self.op, tag_base,
                                  label, placed, self.dtype)
        return start_schedule(self.collective, plan, inp, output, self.op, tag_base, label,
                              finish, self.dtype)

    def launch(self, pipeline: Any, label: str, finish: Callable[[], None] | None) -> Any:
        """Start this call's exchange on ``pipeline`` (the
        :class:`~bmlmpi.api.Communicator` it is a call of: its ``comm``, ``rank``, ``plans``,
        ``call_numbers`` and ``policy``), the one launch of every checked call, blocking,
        ``I…`` and persistent: natively (:meth:`start_native`), or its schedule's plan
        (:meth:`compiled`: bound there, cached per signature) with the tags of its call and
        signature (calls of different signatures never match: a rank that switches to
        another signature it already ran meets no partner) (:meth:`start_plan`); ``finish``
        runs when the exchange completes. A call its call format carries is started by its
        carrier (:mod:`bmlmpi.call_formats`), which launches the carried words' call here."""
        if self.wire is not None:
            return self.wire.start(self, pipeline, label, finish)
        if self.algorithm == "native":
            return self.start_native(pipeline.comm, pipeline.rank, finish, label,
                                     pipeline.policy.is_failure)
        plans = pipeline.plans
        plan = self.compiled(plans)
        tag_base = pipeline.call_numbers.take_tags(self.tag_kind, plans.sig_id(self.plan_key()))
        return self.start_plan(plan, tag_base, label, finish)

    def start_native(self, comm: MPI.Comm, rank: int, finish: Callable[[], None] | None,
                     label: str, is_failure: Callable[[MPI.Exception], bool]) -> NativeRun:
        """This call started as mpi4py's own non-blocking call on ``comm`` (this process
        being ``rank`` of it now), into buffers of its own copied to the caller's on
        completion: a call given up at its deadline can still complete inside MPI when a
        late rank joins it, and must then write memory bmlmpi holds, not the caller's.
        ``is_failure``: whether an MPI error reports a failed process (raised as it is, for
        fault tolerance to handle)."""
        if self.collective == "allreduce":
            return _start_native_allreduce(self, comm, rank, finish, is_failure)
        try:
            req, deliver = self.native_private(comm)
        except (KeyError, ValueError, MPI.Exception) as exc:
            if isinstance(exc, MPI.Exception) and is_failure(exc):
                raise
            raise TypeError(f"native {self.mpi_name} refused this call: {exc}") from exc
        return NativeRun(req, then(deliver, finish), rank, label)


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


def start_schedule(collective: str, plan: Any, inp: np.ndarray | None,
                   out: np.ndarray | None, op: str, tag_base: int, label: Any,
                   finish: Callable[[], None] | None = None,
                   dtype: np.dtype | None = None) -> Any:
    """The run of ``collective``'s compiled ``plan`` on this rank's input and output (as
    :meth:`CollectiveCall.schedule_buffers` names them), on the message or the shared-memory
    executor the plan was bound to (:mod:`bmlmpi.executors`): an allreduce runs in place on
    ``out``, reading a separate input only where it must (:mod:`bmlmpi.deferred`); the others
    through the schedule's input and output copies. What the checked launch and the fast
    path start."""
    if collective == "allreduce":
        return start_allreduce(plan, out, op, tag_base, label, finish, inp)
    return start_collective(plan, inp, out, op, tag_base, label, finish, dtype)


def prepare_allreduce(rank: int, size: int, sendbuf: Any, recvbuf: Any, op: Any,
                      algorithm: str, auto: Callable[[int, np.dtype, str, Any], str],
                      carry: Any = None) -> CollectiveCall:
    """An allreduce's arguments checked on ``rank`` of ``size`` (mpi4py's buffer specs,
    device arrays staged through host memory) and resolved into its
    :class:`CollectiveCall`; ``auto(count, dtype, op, carrier)`` decides ``auto``
    (:meth:`bmlmpi.plans.PlanCache.auto_for`). ``carry``: a call format
    (:mod:`bmlmpi.call_formats`) asked for the call's carrier (it may refuse the call);
    ``auto`` then decides under the carried signature's key, for the words it carries."""
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
    wire = None if carry is None else carry.carrier(dtype, name)
    if algorithm == "auto":
        algorithm = auto(count, dtype, name, wire)
    out = recv.flat[:count]
    src = None if send is None else send.flat
    if src is not None and np.may_share_memory(src, out):
        if not (src.__array_interface__["data"][0] == out.__array_interface__["data"][0]):
            raise BufferSpecError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")
        src = None  # the same memory: an in-place call spelled with two names
    return CollectiveCall("allreduce", "Allreduce", algorithm, requested, name, (count,), 0,
                          rank, size, src, out, None, staging=staging, wire=wire)


def _start_native_allreduce(call: CollectiveCall, comm: MPI.Comm, rank: int,
                            finish: Callable[[], None] | None,
                            is_failure: Callable[[MPI.Exception], bool]) -> NativeRun:
    """An allreduce's :meth:`CollectiveCall.start_native`: ``MPI_Iallreduce`` into a private
    buffer (in place where the buffer is bmlmpi's own: ``extra["owned"]``, a carried call's
    words), with the errors of a count or dtype this MPI cannot take named."""
    out = call.out
    # buffers of bmlmpi's own (a carried call's words, which its run holds while MPI may use
    # them) are summed in place; the caller's through a private result
    owned = call.src is None and call.extra.get("owned", False)
    sbuf = MPI.IN_PLACE if owned else out if call.src is None else call.src
    private = None if owned else np.empty_like(out)
    try:
        req = comm.Iallreduce(sbuf, out if owned else private, mpi_op(call.op))
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
    return NativeRun(req, finish, rank, private=private, out=None if owned else out)
