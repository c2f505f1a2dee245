"""The rest of the collective family: reduce-scatter, allgather, reduce, broadcast and
all-to-all.

Each call is checked and resolved here into a :class:`~bmlmpi.calls.CollectiveCall`, the
record an allreduce is too, which the communicator's one launch path (argument agreement,
progress engine, fault-tolerant ledger) consumes.
:class:`FamilyEngine` runs them for the public methods of :class:`bmlmpi.Communicator`,
which hand it their call's builder (:func:`scatter_blocks`, :func:`scatter`, :func:`gather`,
:func:`reduce_to`, :func:`broadcast`).

Buffer conventions are mpi4py 4.1's (:mod:`bmlmpi.buffers` reads the specs):

* ``Reduce_scatter_block(sendbuf, recvbuf, op)``: ``sendbuf`` holds ``size`` blocks of
  ``recvbuf``'s count (an explicit count in its spec is one block's, as mpi4py reads it);
  rank r receives the reduction of block r. ``MPI.IN_PLACE``: the input is ``recvbuf``
  itself (``size`` blocks; its element count must divide by ``size``) and the block lands
  at its start.
* ``Reduce_scatter(sendbuf, recvbuf, recvcounts=None, op)``: block r holds ``recvcounts[r]``
  elements (zeros allowed), in rank order; ``recvbuf`` holds exactly ``recvcounts[rank]``.
  Without ``recvcounts`` they are every rank's ``recvbuf`` count, gathered first with the
  communicator's own ``Allgather`` (as mpi4py gathers them with ``MPI_Allgather``);
  ``MPI.IN_PLACE`` needs ``recvcounts`` (as in mpi4py, which raises TypeError without).
* ``Allgather(sendbuf, recvbuf)``: ``recvbuf`` holds ``size`` slots of ``sendbuf``'s count
  (an explicit count in its spec is one slot's, as mpi4py reads it).
  ``MPI.IN_PLACE``: this rank's slot of ``recvbuf`` is its contribution.
* ``Allgatherv(sendbuf, recvbuf)``: ``recvbuf`` is ``[buf, counts, displs, datatype]``,
  ``[buf, (counts, displs), datatype]``, ``[buf, counts, datatype]``, ``[buf, (counts,
  displs)]``, ``[buf, counts]``, ``[buf, datatype]`` or a plain buffer, read as mpi4py reads
  them (:func:`_split_vector_spec`): counts a sequence, one integer for every rank, or None
  (the buffer split in rank order, the first ``elements % size`` slots one longer);
  displacements a sequence, one integer (a stride) or None (the running sum of the counts);
  they may be in any order, but the slots must not overlap.
* ``Reduce(sendbuf, recvbuf, op, root)``: ``recvbuf`` is read at the root only (may be None
  elsewhere); ``MPI.IN_PLACE`` only at the root (Open MPI refuses it elsewhere).
* ``Bcast(buf, root)``.
* ``Alltoall(sendbuf, recvbuf)``: each buffer ``size`` blocks of one count (an explicit count
  in a spec is one block's); ``MPI.IN_PLACE``: the blocks are sent from ``recvbuf`` and
  replaced. ``Alltoallv(sendbuf, recvbuf)``: each side a vector spec read as
  ``Allgatherv``'s ``recvbuf``; every rank's counts are gathered first
  (:func:`alltoallv_counts`) into the pair matrix the schedules need, which also shows any
  pair whose two sides differ; ``MPI.IN_PLACE`` needs symmetric counts (MPI's rule).

Reductions take the dtypes and ops of ``Allreduce`` (``bmlmpi.AVG`` included: a sum divided
by the number of contributing ranks). Allgather, broadcast and all-to-all move bytes: any datatype
mpi4py accepts (``MPI.BYTE``, ``MPI.BOOL``, structured arrays) travels unchanged. Device
(GPU) buffers are staged through host memory as ``Allreduce``'s (:class:`DeviceStaging`);
the persistent forms refuse them.

Argument agreement: the first call of each signature — collective, every rank's block
count, dtype, op, root, algorithm — is checked across ranks as ``Allreduce``'s is, so ranks
that disagree raise :class:`~bmlmpi.api.ArgumentMismatch` (or
:class:`~bmlmpi.api.RemoteArgumentError` where another rank's arguments were refused) on
every rank instead of hanging. Messages of different collectives never match: a scheduled
call's tags lie in its collective's own block of the tag space (``TAG_KINDS``), and in its
signature's own part of that block, so a rank that switches to another signature it already
ran meets no partner either (docs/contracts.md). A native non-blocking or persistent call
gives MPI buffers of its own, copied to the caller's once it completed
(:meth:`CollectiveCall.native_private`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from . import buffers
from .agreement import RemoteArgumentError
from .buffers import BufferSpecError
from .call_agreement import ARGUMENT_ERRORS, CallAgreement
from .call_gate import CallGate
from .calls import ArgumentMismatch, CollectiveCall, offsets
from .fast_path import FastPath
from .ops import check_dtype_op, op_name

#: The collectives of this module, in the order of their tag blocks (allreduce is block 0).
COLLECTIVES = ("reduce_scatter", "allgather", "reduce", "bcast", "alltoall")
REDUCING = frozenset({"reduce_scatter", "reduce"})


# -- argument checks and buffer resolution, one function per mpi4py call --------------------
def _recv_spec(recvbuf: Any, what: str = "recvbuf", reducing: bool = True,
               blocks: int = 0) -> buffers.Spec:
    if recvbuf is None or recvbuf is MPI.IN_PLACE:
        raise BufferSpecError(f"{what} must be a buffer (sendbuf may be MPI.IN_PLACE)")
    if isinstance(recvbuf, (list, tuple)) and not recvbuf:
        raise BufferSpecError(f"{what}: an empty buffer spec")
    spec = (buffers.resolve_blocks(recvbuf, what, blocks, reducing) if blocks
            else buffers.resolve(recvbuf, what, reducing=reducing))
    if not spec.flat.flags.writeable:
        raise BufferSpecError(f"{what} is read-only")
    return spec


class DeviceStaging:
    """A family call's device (GPU) buffers staged through pinned host memory, as
    ``Allreduce`` stages its own (:func:`bmlmpi.kernels.gpu.to_host_staging`): each device
    buffer is copied to the host before the call (the receive buffer too: an in-place input,
    a slot or the part past an explicit count must survive) and the receive buffer back when
    the call finishes (:meth:`CollectiveCall.finish`). A call refused after staging never copies
    back, so the device buffers stay as they were."""

    def __init__(self) -> None:
        self.finishers: list[Any] = []

    def host(self, spec: Any, *, copy_out: bool = True) -> Any:
        """``spec`` with its device buffer replaced by a host copy; anything else as given."""
        obj = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
        if not buffers.is_device_array(obj):
            return spec
        from .kernels import gpu
        host, finish = gpu.to_host_staging(obj, copy_in=True, copy_out=copy_out)
        self.finishers.append(finish)
        return host if obj is spec else [host, *spec[1:]]

    def attach(self, call: CollectiveCall) -> CollectiveCall:
        if self.finishers:
            call.staging = self
        return call

    def finish(self) -> None:
        for f in self.finishers:
            f()
        self.finishers.clear()


def _send_spec(sendbuf: Any, dtype: np.dtype, reducing: bool = True,
               blocks: int = 0) -> buffers.Spec:
    send = (buffers.resolve_blocks(sendbuf, "sendbuf", blocks, reducing) if blocks
            else buffers.resolve(sendbuf, "sendbuf", reducing=reducing))
    if send.flat.dtype != dtype:
        raise BufferSpecError(f"sendbuf dtype {send.flat.dtype} differs from recvbuf dtype "
                              f"{dtype}")
    return send


def _apart(src: np.ndarray | None, out: np.ndarray) -> np.ndarray | None:
    """``src``, or None when it is ``out``'s own memory (an in-place call spelled with two
    names); any other overlap is refused."""
    if src is None or not np.may_share_memory(src, out):
        return src
    if (src.__array_interface__["data"][0] == out.__array_interface__["data"][0]
            and src.size == out.size):
        return None
    raise BufferSpecError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")


def _check_reduction(dtype: np.dtype, op: Any) -> str:
    name = op_name(op)
    check_dtype_op(dtype, name)
    return name


def _check_root(root: Any, size: int) -> int:
    try:
        r = int(root)
    except (TypeError, ValueError):
        raise TypeError(f"root must be an integer rank, got {root!r}") from None
    if r != root or not 0 <= r < size:
        raise ValueError(f"root {root!r} is not a rank of this communicator (size {size})")
    return r


def _check_counts(counts: Any, size: int) -> tuple[int, ...]:
    try:
        seq = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise TypeError(f"recvcounts must be a sequence of {size} integers, got "
                        f"{counts!r}") from None
    if len(seq) != size:
        raise ValueError(f"recvcounts has {len(seq)} entries; the communicator has {size} "
                         f"ranks")
    if any(c < 0 for c in seq):
        raise ValueError(f"recvcounts must not be negative: {seq}")
    return tuple(seq)


def _as_bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8) if a.size else np.empty(0, np.uint8)


def prepare_reduce_scatter(rank: int, size: int, sendbuf: Any, recvbuf: Any, recvcounts: Any,
                           op: Any, block: bool, algorithm: str) -> CollectiveCall:
    """``Reduce_scatter_block`` (``block``) or ``Reduce_scatter``."""
    staged = DeviceStaging()
    return staged.attach(_reduce_scatter(rank, size, staged.host(sendbuf, copy_out=False),
                                         staged.host(recvbuf), recvcounts, op, block,
                                         algorithm))


def _reduce_scatter(rank: int, size: int, sendbuf: Any, recvbuf: Any, recvcounts: Any,
                    op: Any, block: bool, algorithm: str) -> CollectiveCall:
    name = "Reduce_scatter_block" if block else "Reduce_scatter"
    # mpi4py reads an explicit count of a block reduce-scatter's whole buffer (the send
    # buffer, or the receive buffer in place) as the count of one block
    in_place = sendbuf is MPI.IN_PLACE or sendbuf is None
    recv = _recv_spec(recvbuf, blocks=size if block and in_place else 0)
    dtype = recv.flat.dtype
    opname = _check_reduction(dtype, op)
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        if block:
            if recv.count % size:
                raise BufferSpecError(f"{name} in place: recvbuf holds {recv.count} "
                                      f"elements, not a multiple of the {size} ranks")
            counts = (recv.count // size,) * size
        else:
            if recvcounts is None:
                raise TypeError(f"{name} with MPI.IN_PLACE needs recvcounts (as mpi4py)")
            counts = _check_counts(recvcounts, size)
        total = sum(counts)
        if recv.count < total:
            raise BufferSpecError(f"{name} in place: recvbuf holds {recv.count} elements, "
                                  f"fewer than the {total} of all blocks")
        out = recv.flat[:total]
        return CollectiveCall("reduce_scatter", name, algorithm, algorithm, opname, counts, 0,
                          rank, size, None, out, out[:counts[rank]], native_block=block)
    send = _send_spec(sendbuf, dtype, blocks=size if block else 0)
    if block:
        if send.count != size * recv.count:
            raise BufferSpecError(f"{name}: sendbuf holds {send.count} elements; {size} "
                                  f"blocks of recvbuf's {recv.count} are needed")
        counts = (recv.count,) * size
    else:
        counts = _counts_or_equal(recvcounts, send.count, size,
                                  f"{name}: sendbuf", "pass recvcounts")
        if recv.count != counts[rank]:
            raise BufferSpecError(f"{name}: recvbuf holds {recv.count} elements but "
                                  f"recvcounts[{rank}] is {counts[rank]}")
        if send.count != sum(counts):
            raise BufferSpecError(f"{name}: sendbuf holds {send.count} elements but the "
                                  f"recvcounts add up to {sum(counts)}")
    result = recv.flat[:counts[rank]]
    src = _apart(send.flat, result)
    if src is None:
        raise BufferSpecError(f"{name}: sendbuf and recvbuf overlap; use MPI.IN_PLACE")
    return CollectiveCall("reduce_scatter", name, algorithm, algorithm, opname, counts, 0, rank,
                      size, src, result, result, native_block=block)


def _counts_or_equal(counts: Any, elements: int, size: int, what: str,
                     hint: str) -> tuple[int, ...]:
    """The checked ``counts``, else ``elements`` cut into ``size`` equal blocks (an error
    naming ``what`` when they do not divide)."""
    if counts is not None:
        return _check_counts(counts, size)
    if elements % size:
        raise BufferSpecError(f"{what} holds {elements} elements, not a multiple of the "
                              f"{size} ranks ({hint})")
    return (elements // size,) * size


def _is_datatype(item: Any) -> bool:
    return isinstance(item, (MPI.Datatype, str))


def _split_vector_spec(recvbuf: Any) -> tuple[Any, Any, Any, Any]:
    """(buf, counts, displs, datatype) of an Allgatherv receive spec, read as mpi4py reads
    it: ``[buf, datatype]``, ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf, counts,
    datatype]``, ``[buf, (counts, displs), datatype]``, ``[buf, counts, displs, datatype]``
    or a buffer; a tuple in the counts' place is always ``(counts, displs)``."""
    if not isinstance(recvbuf, (list, tuple)):
        return recvbuf, None, None, None
    if len(recvbuf) == 2:
        buf, counts = recvbuf
        if _is_datatype(counts):
            return buf, None, None, counts
        if isinstance(counts, tuple):
            return buf, *_pair(counts), None
        return buf, counts, None, None
    if len(recvbuf) == 3:
        buf, counts, datatype = recvbuf
        if isinstance(counts, tuple):
            return buf, *_pair(counts), datatype
        return buf, counts, None, datatype
    if len(recvbuf) == 4:
        return tuple(recvbuf)
    raise BufferSpecError("Allgatherv recvbuf: [buf, counts, displs, datatype], "
                          "[buf, (counts, displs), datatype], [buf, counts, datatype], "
                          "[buf, counts], [buf, datatype] or a buffer")


def _pair(counts_displs: tuple) -> tuple[Any, Any]:
    if len(counts_displs) != 2:
        raise BufferSpecError(f"Allgatherv recvbuf: a tuple in the counts' place is (counts, "
                              f"displs), got {len(counts_displs)} items")
    return counts_displs[0], counts_displs[1]


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _vector_counts(counts: Any, elements: int, size: int) -> tuple[int, ...]:
    """An Allgatherv's counts as mpi4py reads them: a sequence of ``size``; one integer for
    every rank; None: ``recvbuf``'s elements split in rank order, the first
    ``elements % size`` slots one element longer."""
    if counts is None:
        return tuple(elements // size + (i < elements % size) for i in range(size))
    if _is_integer(counts):
        if counts < 0:
            raise ValueError(f"Allgatherv: the count must not be negative, got {counts}")
        return (int(counts),) * size
    return _check_counts(counts, size)


def _vector_displs(displs: Any, counts: tuple[int, ...]) -> tuple[int, ...]:
    """Displacements as mpi4py reads them: a sequence of ``size``; one integer: a stride
    (slot i at ``i * stride``); None: packed in rank order."""
    size = len(counts)
    if displs is None:
        return offsets(counts)
    if _is_integer(displs):
        if displs < 0:
            raise ValueError(f"Allgatherv: the stride must not be negative, got {displs}")
        return tuple(int(displs) * i for i in range(size))
    try:
        d = tuple(int(x) for x in displs)
    except (TypeError, ValueError):
        raise TypeError(f"displs must be a sequence of {size} integers, one integer (a "
                        f"stride) or None") from None
    if len(d) != size or any(x < 0 for x in d):
        raise ValueError(f"displs must be {size} non-negative integers, got {list(d)}")
    return d


def _vector_slots(counts: Any, displs: Any, flat_size: int, size: int,
                  where: str) -> tuple[list[int], list[int], list[int]]:
    """A v-call's per-rank counts, displacements and block ends in a buffer of ``flat_size``
    elements (mpi4py's defaults filled in); a block past the end is refused, ``where``
    naming the call and the buffer."""
    counts = _vector_counts(counts, flat_size, size)
    d = _vector_displs(displs, counts)
    ends = [x + c for x, c in zip(d, counts, strict=True)]
    if max(ends, default=0) > flat_size:
        raise BufferSpecError(f"{where}: a block ends at element {max(ends)}, past the "
                              f"buffer's {flat_size}")
    return counts, d, ends


def _allgatherv_recv(recvbuf: Any, size: int) -> tuple[np.ndarray, tuple[int, ...],
                                                       tuple[int, ...] | None]:
    """(the flat receive buffer, counts, displacements or None when packed) of an
    Allgatherv receive spec (module docstring)."""
    if isinstance(recvbuf, (list, tuple)) and not recvbuf:
        raise BufferSpecError("recvbuf: an empty buffer spec")
    buf, counts, displs, datatype = _split_vector_spec(recvbuf)
    spec = _recv_spec(buf if datatype is None else [buf, datatype], reducing=False)
    flat = spec.flat
    counts, d, ends = _vector_slots(counts, displs, flat.size, size, "Allgatherv recvbuf")
    slots = sorted((x, e) for x, e in zip(d, ends, strict=True) if e > x)
    if any(a[1] > b[0] for a, b in zip(slots, slots[1:], strict=False)):
        raise BufferSpecError("Allgatherv: the slots of recvbuf overlap (the result would "
                              "depend on the order of arrival)")
    return flat, counts, (None if d == offsets(counts) else d)


def prepare_allgather(rank: int, size: int, sendbuf: Any, recvbuf: Any, vector: bool,
                      algorithm: str) -> CollectiveCall:
    """``Allgather`` or (``vector``) ``Allgatherv``; the exchange moves bytes."""
    staged = DeviceStaging()
    return staged.attach(_allgather(rank, size, staged.host(sendbuf, copy_out=False),
                                    staged.host(recvbuf), vector, algorithm))


def _allgather(rank: int, size: int, sendbuf: Any, recvbuf: Any, vector: bool,
               algorithm: str) -> CollectiveCall:
    name = "Allgatherv" if vector else "Allgather"
    if vector:
        flat, counts, displs = _allgatherv_recv(recvbuf, size)
    else:
        spec = _recv_spec(recvbuf, reducing=False, blocks=size)
        flat = spec.flat
        if flat.size % size:
            raise BufferSpecError(f"Allgather: recvbuf holds {flat.size} elements, not a "
                                  f"multiple of the {size} ranks")
        counts, displs = (flat.size // size,) * size, None
    item = flat.dtype.itemsize
    mine = counts[rank]
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        src = None
    else:
        send = _send_spec(sendbuf, flat.dtype, reducing=False)
        if send.count != mine:
            raise BufferSpecError(f"{name}: sendbuf holds {send.count} elements; this rank's "
                                  f"slot holds {mine}")
        start = (displs or offsets(counts))[rank]
        src = _apart(send.flat, flat[start:start + mine])
    bcounts = tuple(c * item for c in counts)
    bdispls = None if displs is None else tuple(x * item for x in displs)
    out = _as_bytes(flat[:sum(counts)] if displs is None else flat)
    return CollectiveCall("allgather", name, algorithm, algorithm, "sum", bcounts, 0, rank, size,
                      None if src is None else _as_bytes(src), out, None, bdispls,
                      native_block=not vector)


def prepare_reduce(rank: int, size: int, sendbuf: Any, recvbuf: Any, op: Any, root: Any,
                   algorithm: str) -> CollectiveCall:
    """``Reduce``: the root's ``recvbuf`` alone is read (and staged, when on a device)."""
    root = _check_root(root, size)
    staged = DeviceStaging()
    return staged.attach(_reduce(rank, size, staged.host(sendbuf, copy_out=False),
                                 staged.host(recvbuf) if rank == root else recvbuf, op, root,
                                 algorithm))


def _reduce(rank: int, size: int, sendbuf: Any, recvbuf: Any, op: Any, root: int,
            algorithm: str) -> CollectiveCall:
    if rank == root:
        recv = _recv_spec(recvbuf)
        dtype = recv.flat.dtype
        opname = _check_reduction(dtype, op)
        if sendbuf is MPI.IN_PLACE or sendbuf is None:
            return CollectiveCall("reduce", "Reduce", algorithm, algorithm, opname, (recv.count,),
                              root, rank, size, None, recv.flat, None)
        send = _send_spec(sendbuf, dtype)
        if recv.count < send.count:
            raise BufferSpecError(f"Reduce: the root's recvbuf holds {recv.count} elements, "
                                  f"fewer than the {send.count} sent")
        out = recv.flat[:send.count]
        return CollectiveCall("reduce", "Reduce", algorithm, algorithm, opname, (send.count,),
                          root, rank, size, _apart(send.flat, out), out, None)
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        raise BufferSpecError("Reduce: MPI.IN_PLACE is the root's alone (MPI); pass the "
                              "input as sendbuf on the other ranks")
    send = buffers.resolve(sendbuf, "sendbuf")
    opname = _check_reduction(send.flat.dtype, op)
    return CollectiveCall("reduce", "Reduce", algorithm, algorithm, opname, (send.count,), root,
                      rank, size, send.flat, np.empty(0, send.flat.dtype), None)


def prepare_bcast(rank: int, size: int, buf: Any, root: Any, algorithm: str) -> CollectiveCall:
    """``Bcast``: a device ``buf`` is staged, copied back on the receiving ranks."""
    root = _check_root(root, size)
    if buf is None or buf is MPI.IN_PLACE:
        raise BufferSpecError("Bcast: buf must be a buffer")
    staged = DeviceStaging()
    return staged.attach(_bcast(rank, size, staged.host(buf, copy_out=rank != root), root,
                                algorithm))


def _bcast(rank: int, size: int, buf: Any, root: int, algorithm: str) -> CollectiveCall:
    spec = buffers.resolve(buf, "buf", reducing=False)
    if rank != root and not spec.flat.flags.writeable:
        raise BufferSpecError("Bcast: buf is read-only on a receiving rank")
    out = _as_bytes(spec.flat)
    return CollectiveCall("bcast", "Bcast", algorithm, algorithm, "sum", (out.size,), root, rank,
                      size, None, out, None)


def family_algorithms(collective: str) -> tuple[str, ...]:
    """The algorithms implemented for ``collective``: ``auto`` first, ``native`` last."""
    from . import selection
    return tuple(selection.algorithms(collective))


class FamilyEngine:
    """The family's checked calls on one communicator (``owner``, the
    :class:`~bmlmpi.api.Communicator`: its services, ``policy`` and ``persistent_calls``):
    each prepared (its arguments checked, an error raised on every rank), numbered and agreed
    (``agreement``: :class:`~bmlmpi.call_agreement.CallAgreement`) and launched through the
    communicator's one launch path; a blocking signature's first call opens its entry in the
    communicator's fast path (``fast``: :class:`~bmlmpi.fast_path.FastPath`), which runs its
    later calls, and runs a native call of an agreed signature as MPI's blocking call on
    every rank (:meth:`~bmlmpi.fast_path.FastPath.blocking_native`)."""

    def __init__(self, owner: Any, agreement: CallAgreement, gate: CallGate, fast: FastPath):
        self.owner = owner
        self.agreement = agreement
        self.gate = gate            # the owner's CallGate (the thread inside a call)
        self.fast = fast

    def algorithm_for(self, collective: str, algorithm: str | None) -> str:
        """The algorithm a call asks for (None: the communicator's own when that one serves
        ``collective``, else ``auto``); one that does not implement it is refused."""
        implemented = family_algorithms(collective)
        if algorithm is None:
            own = self.owner.algorithm
            return own if own in implemented else "auto"
        name = algorithm.lower() if isinstance(algorithm, str) else algorithm
        if name not in implemented:
            raise ValueError(f"algorithm {algorithm!r} does not implement {collective}; "
                             f"implemented: {', '.join(implemented)}")
        return name

    def prepare(self, collective: str, algorithm: str | None, build: Any) -> CollectiveCall:
        """The checked call, or its error raised on every rank (as ``Allreduce``'s)."""
        owner, agreement = self.owner, self.agreement
        agreement.begin_call()
        try:
            call = build(self.algorithm_for(collective, algorithm))
            if call.algorithm == "auto":
                call.algorithm = owner.plans.family_auto(call)
            return call
        except ARGUMENT_ERRORS as exc:
            owner.call_log.refused(collective, algorithm or owner.algorithm, None, exc)
            agreement.announce_refusal(exc)
            raise

    def start(self, collective: str, algorithm: str | None, build: Any,
              frame: tuple[int, ...] | None = None) -> Any:
        """A non-blocking call: its :class:`~bmlmpi.handles.Request`. ``frame``: the members
        its arguments were given for where it gathered them first (an ``Alltoallv``'s counts,
        :func:`alltoallv_counts`); None: the current ones (the policy's
        :meth:`~bmlmpi.call_policy.CallPolicy.prepare_family`)."""
        gate = self.gate
        mine = gate.claim(self.owner.rank)  # one call at a time: a second thread raises here
        try:
            owner = self.owner
            policy = owner.policy
            policy.check_usable()
            return policy.submit(policy.prepare_family(collective, algorithm, build, self,
                                                       frame))
        finally:
            gate.release(mine)

    def init(self, collective: str, algorithm: str | None, build: Any,
             frame: tuple[int, ...] | None = None) -> Any:
        """A persistent call (host buffers only); ``frame`` as :meth:`start`'s."""
        gate = self.gate
        mine = gate.claim(self.owner.rank)
        try:
            return self.make_persistent(collective, algorithm, build, frame)
        finally:
            gate.release(mine)

    def make_persistent(self, collective: str, algorithm: str | None, build: Any,
                        frame: tuple[int, ...] | None = None) -> Any:
        """:meth:`init`, the communicator claimed."""
        owner = self.owner
        policy = owner.policy
        policy.check_usable()

        def host_only(alg: str) -> CollectiveCall:
            call = build(alg)
            if call.staging is not None:  # refused: nothing is copied back to the device
                raise BufferSpecError(f"{call.mpi_name}_init takes host buffers (a "
                                      f"persistent request cannot stage device memory at "
                                      f"every start)")
            return call
        return owner.persistent_calls.make(policy.prepare_family(collective, algorithm,
                                                                 host_only, self, frame))

    def blocking(self, collective: str, algorithm: str | None, build: Any,
                 key: tuple | None = None, args: tuple = (),
                 frame: tuple[int, ...] | None = None) -> None:
        """A blocking call, checked (its signature's later calls take the fast path:
        :meth:`bmlmpi.fast_path.FastPath.family`). Once its signature has been agreed on, a
        native call on the plain communicator is mpi4py's blocking call itself on every rank
        (:meth:`bmlmpi.fast_path.FastPath.blocking_native`), bounded by the watchdog as
        ``Allreduce``'s fast path is
        (``BMLMPI_BLOCKING=watchdog``, the default: past ``timeout`` seconds it reports the
        call and aborts the job); otherwise the call is started and waited on under the
        deadline. Either way it opens the signature's entry in the fast path (``key``:
        :func:`bmlmpi.fast_path.fast_key`; ``args``: the public method's arguments;
        ``frame`` as :meth:`start`'s)."""
        gate = self.gate
        mine = gate.claim(self.owner.rank)  # one call at a time: a second thread raises here
        try:
            self.checked(collective, algorithm, build, key, args, frame)
        finally:
            gate.release(mine)

    def checked(self, collective: str, algorithm: str | None, build: Any,
                key: tuple | None, args: tuple,
                frame: tuple[int, ...] | None = None) -> None:
        """:meth:`blocking`, the communicator claimed."""
        owner = self.owner
        owner.policy.check_usable()
        if not owner.policy.keeps_calls:
            # the agreement of the checked path polls no other call: this rank's outstanding
            # runs of schedules (started before this call on every rank) complete first
            owner.calls_in_flight.settle()
        tuning = owner.tuning
        # an exploring auto signature's call: its candidate's entry, timed
        if key is not None and tuning.explore_fast(key, args, self.fast):
            return
        call = owner.policy.prepare_family(collective, algorithm, build, self, frame)
        timing = tuning.explore(call, key)
        # an exploring call opens its candidate's entry
        opened = key if timing.opens else tuning.candidate_sig(key, timing)
        if self.fast.blocking_native(call, opened, args):
            tuning.after_call(call, timing)
            return
        owner.policy.submit(call).Wait()
        if ((tuning.after_call(call, timing) or opened is not key)
                and call.algorithm != "native"):
            self.fast.open(opened, call, args)

    def reduce_scatter_counts(self, sendbuf: Any, recvbuf: Any, recvcounts: Any) -> Any:
        """``recvcounts`` as mpi4py takes them: as given, or, omitted on a call that is not in
        place, every rank's ``recvbuf`` count, gathered with the communicator's own
        ``Allgather`` of one int64 per rank (mpi4py gathers them with ``MPI_Allgather``). A
        rank whose ``recvbuf`` cannot be read sends -1 and gets None back (its own check
        then raises its error); the others get :class:`_RefusedCounts` naming it."""
        if recvcounts is not None or sendbuf is None or sendbuf is MPI.IN_PLACE:
            return recvcounts
        try:
            mine = _recv_spec(DeviceStaging().host(recvbuf, copy_out=False)).count
        except Exception:  # noqa: BLE001 - this rank's own check raises it at the call
            mine = -1
        owner = self.owner
        counts = np.empty(owner.size, dtype=np.int64)
        owner.Allgather(np.array([mine], dtype=np.int64), counts)
        if mine < 0:
            return None
        refused = [r for r, c in enumerate(counts) if c < 0]
        if refused:
            return _RefusedCounts(refused)
        return tuple(int(c) for c in counts)


@dataclass(frozen=True)
class _RefusedCounts:
    """Gathered ``recvcounts`` in which these ranks sent -1: their ``recvbuf`` was refused."""

    ranks: list[int]

    def refuse(self, _algorithm: str) -> CollectiveCall:
        raise RemoteArgumentError(f"Reduce_scatter: rank(s) {self.ranks} refused their "
                                  f"recvbuf while the recvcounts were gathered")


# -- how each public method's call prepares, given the algorithm (the facade's builders) ------
# The communicator's rank and size are read when the call is prepared, not when the builder
# is made: a fault-tolerant communicator prepares a call for its frame (bmlmpi.ft.family).
def carried(call: CollectiveCall, carry: Any) -> CollectiveCall:
    """A reducing family call carried in the call format ``carry`` (the reproducible one,
    :mod:`bmlmpi.call_formats`: PROD on floating-point values refused), or as it is where
    ``carry`` is None."""
    if carry is not None:
        call.wire = carry.carrier(call.dtype, call.op)
    return call


def scatter_blocks(comm: Any, sendbuf: Any, recvbuf: Any, op: Any,
                   carry: Any = None) -> Callable[[str], Any]:
    """How ``Reduce_scatter_block`` prepares on ``comm`` (``carry``: its call format, or
    None; the reducing builders below take it too)."""
    return lambda alg: carried(prepare_reduce_scatter(comm.rank, comm.size, sendbuf, recvbuf,
                                                      None, op, True, alg), carry)


def scatter(comm: Any, sendbuf: Any, recvbuf: Any, recvcounts: Any,
            op: Any, carry: Any = None) -> Callable[[str], Any]:
    """How ``Reduce_scatter`` prepares on ``comm``, ``recvcounts`` as
    :meth:`FamilyEngine.reduce_scatter_counts` gave them."""
    if isinstance(recvcounts, _RefusedCounts):
        return recvcounts.refuse
    return lambda alg: carried(prepare_reduce_scatter(comm.rank, comm.size, sendbuf, recvbuf,
                                                      recvcounts, op, False, alg), carry)


def gather(comm: Any, sendbuf: Any, recvbuf: Any, vector: bool) -> Callable[[str], Any]:
    """How ``Allgather`` (``vector``: ``Allgatherv``, counts and displacements in ``recvbuf``
    as mpi4py's) prepares on ``comm``."""
    return lambda alg: prepare_allgather(comm.rank, comm.size, sendbuf, recvbuf, vector, alg)


def reduce_to(comm: Any, sendbuf: Any, recvbuf: Any, op: Any, root: Any,
              carry: Any = None) -> Callable[[str], Any]:
    """How ``Reduce`` prepares on ``comm``."""
    return lambda alg: carried(prepare_reduce(comm.rank, comm.size, sendbuf, recvbuf, op,
                                              root, alg), carry)


def broadcast(comm: Any, buf: Any, root: Any) -> Callable[[str], Any]:
    """How ``Bcast`` prepares on ``comm``."""
    return lambda alg: prepare_bcast(comm.rank, comm.size, buf, root, alg)


# -- all-to-all ---------------------------------------------------------------------------------
def _alltoallv_spec(spec: Any, size: int, what: str, writable: bool
                    ) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...] | None]:
    """(the flat buffer, counts, displacements or None when packed) of one side of an
    ``Alltoallv``, read as mpi4py reads a vector spec (the forms of ``Allgatherv``'s
    ``recvbuf``). A receive side's blocks must not overlap; a send side's may (they are
    only read)."""
    if isinstance(spec, (list, tuple)) and not spec:
        raise BufferSpecError(f"Alltoallv {what}: an empty buffer spec")
    buf, counts, displs, datatype = _split_vector_spec(spec)
    resolved = (_recv_spec(buf if datatype is None else [buf, datatype], what, reducing=False)
                if writable else
                buffers.resolve(buf if datatype is None else [buf, datatype], what,
                                reducing=False))
    flat = resolved.flat
    counts, d, ends = _vector_slots(counts, displs, flat.size, size, f"Alltoallv {what}")
    if writable:
        slots = sorted((x, e) for x, e in zip(d, ends, strict=True) if e > x)
        if any(a[1] > b[0] for a, b in zip(slots, slots[1:], strict=False)):
            raise BufferSpecError(f"Alltoallv {what}: the blocks overlap (the result would "
                                  f"depend on the order of arrival)")
    return flat, counts, (None if d == offsets(counts) else d)


def alltoallv_counts(comm: Any, sendbuf: Any, recvbuf: Any,
                     vector: tuple[tuple, tuple] | None = None
                     ) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """Every rank's row and column of an ``Alltoallv``, gathered by the communicator's policy
    (:meth:`bmlmpi.call_policy.CallPolicy.pair_counts`: the communicator's own ``Allgather``
    of ``2·size`` int64 per rank), and the members they were given for (None: the current
    ones): the pair matrix a schedule needs and the check that every pair agrees (rank i's
    send count for j is rank j's receive count from i). A rank whose buffer specs cannot be
    read sends -1s and gets its own error at the call; its row holds -1s, which the others'
    calls refuse naming it. ``vector``: the specs' :func:`alltoallv_key`, by which (with the
    buffers' shapes, dtypes and memory orders) a row and column read before is taken again
    (:attr:`bmlmpi.pair_tables.PairTables.rows`) instead of reading the specs anew."""
    rows = comm.policy.pair_tables.rows if vector is not None else None
    if rows is not None:
        bufs, rest = vector
        known = (rest, tuple(b if type(b) is not np.ndarray else
                             (b.shape, b.dtype, b.flags.c_contiguous, b.flags.f_contiguous)
                             for b in bufs))

    def row_and_column(size: int) -> np.ndarray:
        if rows is not None:
            mine = rows.get((known, size))
            if mine is not None:
                return mine
        mine = np.full(2 * size, -1, dtype=np.int64)
        try:
            staged = DeviceStaging()
            _, recvs, _ = _alltoallv_spec(staged.host(recvbuf, copy_out=False), size,
                                          "recvbuf", False)
            sends = recvs if sendbuf is MPI.IN_PLACE or sendbuf is None else _alltoallv_spec(
                staged.host(sendbuf, copy_out=False), size, "sendbuf", False)[1]
            mine[:size], mine[size:] = sends, recvs
        except Exception:  # noqa: BLE001 - this rank's own check raises it at the call
            return mine
        if rows is not None:
            comm.policy.pair_tables.keep_row((known, size), mine)
        return mine
    return comm.policy.pair_counts(row_and_column)


def _pair_matrix(table: np.ndarray, name: str) -> tuple[int, ...]:
    """The pair matrix of the gathered rows and columns (:func:`alltoallv_counts`);
    :class:`~bmlmpi.calls.ArgumentMismatch` (on every rank alike: every rank holds the same
    table) where a pair's two sides differ."""
    size = table.shape[0]
    rows, columns = table[:, :size], table[:, size:]
    wrong = [(i, j) for i in range(size) for j in range(size) if rows[i, j] != columns[j, i]]
    if wrong:
        i, j = wrong[0]
        raise ArgumentMismatch(
            f"{name}: rank {i} sends {rows[i, j]} elements to rank {j}, which expects "
            f"{columns[j, i]} from it ({len(wrong)} pair(s) differ); every rank's send count "
            f"for j must be rank j's receive count from it")
    return tuple(int(c) for c in rows.reshape(-1))


def _spec_part(item: Any) -> Any:
    """An item of an ``Alltoallv`` spec after its buffer, as a signature holds it: None, an
    int, a typecode, a predefined datatype's handle, a sequence of ints (its kind kept: a
    tuple in the counts' place is ``(counts, displs)``); :data:`_UNKEYED` for anything else
    (a derived datatype, which may be freed and its handle reused)."""
    kind = type(item)
    if item is None or kind is int or kind is str:
        return item
    if kind is list:
        # (the types of its items, one as a rule, rather than each item tested)
        kinds = set(map(type, item))
        if kinds <= _INT or all(issubclass(t, (int, np.integer)) for t in kinds):
            return ("list", tuple(map(int, item)))
        return _UNKEYED
    if kind is tuple:
        parts = tuple(map(_spec_part, item))
        return _UNKEYED if _UNKEYED in parts else ("tuple", parts)
    if isinstance(item, MPI.Datatype):
        return ("datatype", item.handle) if item.is_predefined else _UNKEYED
    if kind is np.ndarray and item.dtype.kind in "iu" and item.ndim == 1:
        return ("array", tuple(item.tolist()))
    return _UNKEYED


#: A spec item no signature holds (:func:`_spec_part`).
_UNKEYED = ("unkeyed",)
_INT = frozenset((int,))


def alltoallv_key(sendbuf: Any, recvbuf: Any) -> tuple[tuple, tuple] | None:
    """The parts of a blocking ``Alltoallv``'s fast-path signature its specs give (each
    side a numpy array, ``[array, ...]`` or ``sendbuf`` ``MPI.IN_PLACE``): (the two buffers,
    each spec's form and the items after its buffer: counts, displacements, datatype); None
    where a spec holds anything else. Equal parts resolve to the same blocks of buffers of
    the same shapes and dtypes; the pair counts of the other ranks are not in them (the call
    agrees on those first: :attr:`bmlmpi.pair_tables.PairTables.digest`)."""
    bufs, rest = [], []
    for spec in (sendbuf, recvbuf):
        if spec is MPI.IN_PLACE or type(spec) is np.ndarray:
            bufs.append(spec)
            rest.append(None)
            continue
        if type(spec) not in (list, tuple) or not spec or type(spec[0]) is not np.ndarray:
            return None
        parts = tuple(map(_spec_part, spec[1:]))
        if _UNKEYED in parts:
            return None
        bufs.append(spec[0])
        rest.append((type(spec) is list, parts))
    return tuple(bufs), tuple(rest)


def prepare_alltoall(rank: int, size: int, sendbuf: Any, recvbuf: Any, table: Any,
                     algorithm: str) -> CollectiveCall:
    """``Alltoall`` (``table`` None: equal blocks, each buffer cut into ``size``) or
    ``Alltoallv`` (``table``: every rank's row and column, :func:`alltoallv_counts`)."""
    staged = DeviceStaging()
    return staged.attach(_alltoall(rank, size, staged.host(sendbuf, copy_out=False),
                                   staged.host(recvbuf), table, algorithm))


def _alltoall(rank: int, size: int, sendbuf: Any, recvbuf: Any, table: Any,
              algorithm: str) -> CollectiveCall:
    in_place = sendbuf is MPI.IN_PLACE or sendbuf is None
    if table is None:
        name = "Alltoall"
        flat = _recv_spec(recvbuf, reducing=False, blocks=size).flat
        if flat.size % size:
            raise BufferSpecError(f"Alltoall: recvbuf holds {flat.size} elements, not a "
                                  f"multiple of the {size} ranks")
        block = flat.size // size
        src = None
        if not in_place:
            send = _send_spec(sendbuf, flat.dtype, reducing=False, blocks=size)
            if send.count != flat.size:
                raise BufferSpecError(f"Alltoall: sendbuf holds {send.count} elements, "
                                      f"recvbuf {flat.size}: each must hold {size} blocks of "
                                      f"the same count")
            src = _apart(send.flat, flat)
            if src is None:
                raise BufferSpecError("Alltoall: sendbuf and recvbuf are one buffer; use "
                                      "MPI.IN_PLACE")
        return CollectiveCall("alltoall", name, algorithm, algorithm, "sum",
                              (block,) * (size * size), 0, rank, size, src, flat, None,
                              native_block=True)
    name = "Alltoallv"
    flat, recvs, rdispls = _alltoallv_spec(recvbuf, size, "recvbuf", True)
    src, sdispls = None, None
    if not in_place:
        send, _, sdispls = _alltoallv_spec(sendbuf, size, "sendbuf", False)
        if send.dtype != flat.dtype:
            raise BufferSpecError(f"{name}: sendbuf dtype {send.dtype} differs from recvbuf "
                                  f"dtype {flat.dtype}")
        if np.may_share_memory(send, flat):
            raise BufferSpecError(f"{name}: sendbuf and recvbuf overlap; use MPI.IN_PLACE")
        src = send
    refused = [r for r in range(size) if table[r, 0] < 0]
    if refused:
        raise RemoteArgumentError(f"{name}: rank(s) {refused} refused their buffer specs "
                                  f"while the counts were gathered")
    counts = _pair_matrix(table, name)
    if in_place and any(counts[rank * size + j] != counts[j * size + rank]
                        for j in range(size)):
        raise ArgumentMismatch(f"{name} in place: every rank must send each rank as many "
                               f"elements as it receives from it (MPI: the receive counts "
                               f"are the send counts); the pair counts are not symmetric")
    return CollectiveCall("alltoall", name, algorithm, algorithm, "sum", counts, 0, rank, size,
                          src, flat, None, rdispls, send_displs=sdispls)


def exchange(comm: Any, sendbuf: Any, recvbuf: Any, table: Any = None) -> Callable[[str], Any]:
    """How ``Alltoall`` (``table`` None) or ``Alltoallv`` (``table``: as
    :func:`alltoallv_counts` gave it) prepares on ``comm``."""
    return lambda alg: prepare_alltoall(comm.rank, comm.size, sendbuf, recvbuf, table, alg)
