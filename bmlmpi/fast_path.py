"""The blocking fast path of every collective, keyed by (collective, signature).

A blocking call whose signature (:func:`fast_key`: the mpi4py method, the algorithm asked
for, the op, the counts or root where the method has them, and the shapes and dtypes of
its numpy arrays) ran the checked path once, argument agreement included, gets an entry
(:class:`FastEntry`, made by :meth:`FastPath.open`). Its later calls skip the checked path:
mpi4py's own blocking call on the private communicator under the watchdog (native,
:meth:`FastPath.native`), or the cached plan's run driven in the calling thread under the
executor's deadline (a schedule, :meth:`FastPath.scheduled`). An entry holds no reference to
the caller's arrays: it says where the call's buffers lie in its arguments (:func:`locate`),
and each later call carves them out of its own (:func:`carve`).

Two entries into it: :meth:`FastPath.allreduce` (the blocking allreduce, which remembers
its last signature, :class:`Repeat`, and does not poll the control channel: docs/contracts.md,
"One exception") and :meth:`FastPath.family` (the other collectives, which remember theirs,
:class:`Recent`, and look at the notices first). Either hands the call to the checked path
where it must take it, which then opens the signature's entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import kernels
from .call_agreement import CallAgreement
from .call_gate import CallGate
from .call_numbers import CallNumbers
from .calls import CollectiveCall, CommunicatorRevoked, RemoteArgumentError, start_schedule
from .execute import DeadlineExceeded, Run
from .ops import AVG
from .recorder import FlightRecorder, Signature
from .recorder import now as _now
from .shm import ShmRun
from .watchdog import Watchdog

#: The MPI ops a native fast call hands MPI as they are, by identity (an ``MPI.Op`` is
#: unhashable; these live as long as the module, so their ids are never reused).
FAST_OPS = {id(op): op for op in (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX)}
#: The ops a signature may have: MPI's own and AVG (a scheduled run divides afterwards).
_KEY_OPS = frozenset((*FAST_OPS, id(AVG)))
_IN_PLACE = MPI.IN_PLACE
#: numpy's overlap test without its ``__array_function__`` dispatch (the C function the
#: public one wraps): the fast paths call it only on exact ``np.ndarray`` s, for which the
#: dispatch finds nothing to do, and it is half of the public call's cost
_may_share = getattr(np.may_share_memory, "__wrapped__", np.may_share_memory)
#: The last part of a carried call's signature key before its buffers (:meth:`FastPath.
#: carried`): a reproducible call and a plain one of the same arrays are two signatures.
CARRIED = "reproducible"


def fast_key(method: str, algorithm: str | None, bufs: tuple, op: Any = MPI.SUM,
             *rest: Any) -> tuple | None:
    """The signature of a blocking call with numpy arrays (or IN_PLACE, or None) and an op
    of :data:`_KEY_OPS`: ``method`` (the mpi4py call: the collective and its form), the
    algorithm asked for, the op, ``rest`` (counts, a root) and each buffer's shape and
    dtype; None for any other call. Memory order and flags are not in it: MPI takes an
    array's memory order, and a path that carves buffers checks the flags of every call."""
    if id(op) not in _KEY_OPS:
        return None
    key: list = [method, algorithm, id(op), *rest]
    for b in bufs:
        if b is _IN_PLACE or b is None:
            key.append(b is None)
            continue
        if type(b) is not np.ndarray:
            return None
        key.append((b.shape, b.dtype))
    return tuple(key)


def locate(buf: np.ndarray | None, args: tuple) -> int | tuple | None:
    """Where ``buf`` (a buffer a call's arguments resolved to) lies in ``args``: the
    argument's index when it is that whole argument, (argument index, element offset,
    count, None) when it is a slice of that argument's elements,
    (argument index, byte offset, byte count, dtype) for another view of its bytes,
    (-1, 0, 0, dtype) when empty; None when there is no buffer. ValueError when no argument
    holds it."""
    if buf is None:
        return None
    if not buf.size:
        return (-1, 0, 0, buf.dtype)
    at = buf.__array_interface__["data"][0]
    for i, a in enumerate(args):
        if (type(a) is np.ndarray and a.size == buf.size and a.dtype == buf.dtype
                and a.__array_interface__["data"][0] == at):
            return i  # the whole argument (the commonest: a call's own arrays)
    for i, a in enumerate(args):
        if type(a) is not np.ndarray:
            continue
        lo = a.__array_interface__["data"][0]
        off = at - lo
        if 0 <= off and off + buf.nbytes <= a.nbytes:
            if buf.dtype == a.dtype and off % a.itemsize == 0:
                return (i, off // a.itemsize, buf.size, None)
            return (i, off, buf.nbytes, buf.dtype)
    raise ValueError("a call's buffer outside its arguments")


def bytes_of(buf: np.ndarray, args: tuple) -> int | tuple | None:
    """Where ``buf``, which MPI reads as bytes alone (in a ``[buf, ..., MPI.BYTE]`` spec),
    lies in ``args``: ``(i,)`` when it is every byte of the C-contiguous argument i, which
    MPI then reads as it is, else :func:`locate`'s answer."""
    if buf is not None and buf.size:
        at = buf.__array_interface__["data"][0]
        for i, a in enumerate(args):
            if (type(a) is np.ndarray and a.nbytes == buf.nbytes and a.flags.c_contiguous
                    and a.__array_interface__["data"][0] == at):
                return (i,)
    return locate(buf, args)


def carve(where: int | tuple | None, args: tuple) -> np.ndarray | None:
    """The buffer :func:`locate` described, in this call's ``args`` (arrays of the same
    shapes and dtypes, C-contiguous: the caller checked their flags)."""
    if type(where) is int:
        a = args[where]
        return a if a.ndim == 1 else a.reshape(-1)
    if where is None:
        return None
    if len(where) == 1:
        return args[where[0]]  # the argument as it is (:func:`bytes_of`)
    i, lo, n, dtype = where
    if i < 0:
        return np.empty(0, dtype)
    flat = args[i].reshape(-1)
    if dtype is None:
        return flat[lo:lo + n]
    return flat.view(np.uint8)[lo:lo + n].view(dtype)


def needs_every_rank(method: str, args: tuple, key: tuple, rank: int) -> bool:
    """Whether a rank's blocking call of ``method`` (mpi4py's; ``args``: the public method's
    arguments, its send and receive buffers first; ``key``: its :func:`fast_key`) cannot
    complete before every rank has joined it: its result holds data from every rank. An
    allreduce's non-empty result, a reduce-scatter's non-empty block (every rank's values
    are summed into it), an allgather's or all-to-all's non-empty equal blocks (one from
    each rank); not a reduce or broadcast (a root or a sender may finish its part alone),
    nor a call whose blocks from some rank may be empty (the v forms)."""
    recv = args[1]
    if method in ("Allreduce", "Reduce_scatter_block", "Allgather", "Alltoall"):
        return type(recv) is np.ndarray and recv.size > 0
    if method == "Reduce_scatter":
        return type(key[3]) is tuple and rank < len(key[3]) and key[3][rank] > 0
    return False


class NativeArgs:
    """mpi4py's blocking call of a checked native call (:meth:`CollectiveCall.native_args`'s
    method and arguments), with every array in it replaced by where it lies in the call's
    arguments (:func:`locate`): a later call of the signature hands MPI the same views of
    its own arrays (the agreed count's part of a larger receive buffer, the bytes of a
    structured array), never the caller's arrays as they are, which mpi4py may read
    otherwise or refuse on one rank alone. ``direct``: MPI's arguments are the call's own,
    in their places and whole (a later call hands them over as they are). ValueError when
    an array of the call lies outside the arguments."""

    __slots__ = ("method", "fixed", "holes", "direct")

    def __init__(self, method: str, native: tuple, args: tuple):
        self.method = method
        self.fixed = list(native)
        # (argument, item of a buffer spec or -1 for the argument itself, where it lies)
        self.holes: list[tuple[int, int, int | tuple]] = []
        for i, a in enumerate(native):
            if type(a) is np.ndarray:
                self.holes.append((i, -1, locate(a, args)))
            elif type(a) is list:
                where = bytes_of if a[-1] is MPI.BYTE else locate
                self.holes.extend((i, j, where(b, args)) for j, b in enumerate(a)
                                  if type(b) is np.ndarray)
        self.direct = (len(native) == len(args)
                       and all(j < 0 and where == i for i, j, where in self.holes)
                       and all(type(a) is np.ndarray or a is args[i]
                               for i, a in enumerate(native)))
        for i, j, _ in self.holes:  # no reference to the caller's arrays (resizable)
            if j < 0:
                self.fixed[i] = None
            else:
                self.fixed[i] = [None if k == j or type(b) is np.ndarray else b
                                 for k, b in enumerate(self.fixed[i])]

    def of(self, args: tuple) -> tuple | list:
        """The native call's arguments carved out of a later call's ``args`` (arrays of the
        same shapes and dtypes, C-contiguous: the signature says so)."""
        if self.direct:
            return args
        out = list(self.fixed)
        for i, j, where in self.holes:
            # (a whole argument, the commonest, without carve's call frame: one MPI reads
            # as it is, :func:`bytes_of`, or a flat one)
            if type(where) is tuple and len(where) == 1:
                buf = args[where[0]]
            elif type(where) is int and args[where].ndim == 1:
                buf = args[where]
            else:
                buf = carve(where, args)
            if j < 0:
                out[i] = buf
            else:
                spec = out[i] = list(out[i])
                spec[j] = buf
        return out


class FastEntry:
    """A blocking signature whose first call ran the checked path, argument agreement
    included: what its later calls need to skip it. Native (``plan`` None): mpi4py's
    blocking call (``native``) under the watchdog. A schedule: the cached plan, the
    collective (how its run starts: :func:`bmlmpi.calls.start_schedule`), its tag block
    and signature number, and where the schedule's input, output and (AVG) the part to
    divide lie in the call's arguments (:func:`locate`)."""

    __slots__ = ("what", "traced", "plan", "plan_again", "collective", "kind", "sig", "op",
                 "dtype", "inp", "output", "averaged", "calls", "native", "wire", "algorithm",
                 "requested", "polls", "mpi_call")

    def __init__(self, what: str, traced: Signature, *, native: NativeArgs | None = None,
                 plan: Any = None, plan_again: Any = None, collective: str = "",
                 kind: int = 0, sig: int = 0,
                 op: str = "sum", dtype: np.dtype | None = None, inp: Any = None,
                 output: Any = None, averaged: Any = None, wire: Any = None,
                 algorithm: str = "", requested: str = ""):
        self.what = what        # native: the watchdog's description; schedule: the Run's label
        self.traced = traced    # the flight recorder's signature of these calls
        self.native = native
        self.plan = plan
        self.plan_again = plan_again  # the plan compiled again after a repair (None: closed)
        self.collective = collective
        self.kind = kind        # the collective's block of the tag space (its tag_kind)
        self.sig = sig          # the signature's number (PlanCache.sig_id)
        self.op = op            # bmlmpi's op name
        self.dtype = dtype
        self.inp = inp
        self.output = output
        self.averaged = averaged  # AVG: the result a scheduled run divides afterwards
        self.calls = 0          # schedules and carried calls: later calls that took this path
        self.wire = wire        # a carried call's carrier (its buffer kept), else None
        self.algorithm = algorithm  # a carried call's: the algorithm that sums its words
        self.requested = requested  # ... and as asked ("auto" stays "auto")
        #: whether a later call looks at the notices first (:meth:`FastPath.run`): False
        #: where the rank needs every rank's data (:func:`needs_every_rank`)
        self.polls = True
        #: native: mpi4py's bound method on the data communicator (:meth:`FastPath.rebind`
        #: binds it again)
        self.mpi_call: Any = None


class Repeat:
    """The signature of the last blocking allreduce that took the fast path: its entry, op, the
    algorithm and ``reproducible`` as the call gave them (``asked``, ``plain``: None for the
    communicator's own, whose change forgets this record) and the arrays' dtype objects and
    sizes (no reference to the arrays themselves, which must stay resizable). A later call with
    numpy arrays of the same dtype objects and sizes, the same op and the same ``asked`` and
    ``plain`` objects is the same signature: a dtype object is immutable (a reassigned
    ``.dtype``, another byte order: another object, so no match), and equal sizes of
    C-contiguous arrays of one itemsize span as many bytes (a reshaped array is the same
    allreduce; the flags and the overlap are checked on every call)."""

    __slots__ = ("entry", "op", "asked", "plain", "send_dtype", "recv_dtype", "send_size",
                 "recv_size")

    def __init__(self, entry: FastEntry, op: Any, asked: str | None, plain: bool | None,
                 send: Any, recv: np.ndarray):
        self.entry = entry
        self.op = op
        self.asked = asked
        self.plain = plain  # the call's ``reproducible`` as it gave it: None or False
        self.recv_dtype = recv.dtype
        self.recv_size = recv.size
        if send is MPI.IN_PLACE:
            self.send_dtype = None
            self.send_size = -1
        else:
            self.send_dtype = send.dtype
            self.send_size = send.size


class Recent:
    """The last blocking call of the family (every collective but the allreduce) that found
    its signature's entry: the method, algorithm and op objects and the rest of its
    signature (``rest``: counts, a root, the call format's mark), each of its one or two
    buffers' dtype object and shape (IN_PLACE or None as it is), its signature key and its
    entry; no reference to the arrays (they must stay resizable, which a weak reference
    forbids too). A later call of the same method with the same objects and buffers of the
    same dtype objects and shapes has the same key (:func:`fast_key` is made of nothing
    else): it skips the key's tuple and hash. The overlap is checked on every call, and the
    flags wherever MPI does not check them itself (:meth:`FastPath.family`)."""

    __slots__ = ("method", "algorithm", "op", "rest", "one", "marker0", "shape0", "dtype0",
                 "marker1", "shape1", "dtype1", "key", "entry")

    def __init__(self, method: str, algorithm: Any, op: Any, rest: tuple, bufs: tuple,
                 key: tuple, entry: FastEntry):
        self.method, self.algorithm, self.op, self.rest = method, algorithm, op, rest
        self.one = len(bufs) == 1
        # (the marker itself, or None, the shape and the dtype object of an array)
        self.marker0, self.shape0, self.dtype0 = self._described(bufs[0])
        self.marker1, self.shape1, self.dtype1 = (None, None, None) if self.one else \
            self._described(bufs[1])
        self.key, self.entry = key, entry

    @staticmethod
    def _described(b: Any) -> tuple:
        return (b, None, None) if b is _IN_PLACE or b is None else (None, b.shape, b.dtype)

    @staticmethod
    def holds(bufs: tuple) -> bool:
        """Whether a call's ``bufs`` fit a record (one or two)."""
        return 1 <= len(bufs) <= 2


#: What :meth:`FastPath.family` returns when its fast path ran the call.
DONE = object()


class FastPath:
    """The blocking fast path of one communicator (``pipeline``: its ``rank``, ``size``,
    ``timeout`` and its ``call_log``, :class:`~bmlmpi.call_log.CallLog`) on ``comm``: the
    entries of its signatures, by :func:`fast_key`. ``agreement``: its calls' agreement
    (whether a fast path may be taken now, the notices, what a call given up leaves behind);
    ``numbers``: its call numbers and tag slots; ``gate``: the thread inside a call;
    ``active``: its outstanding calls. ``enabled`` only for the plain communicator (a
    policy that tracks every call itself takes the checked path for all of them);
    ``native``: a native signature may be MPI's blocking call under the watchdog
    (``BMLMPI_BLOCKING=watchdog``)."""

    def __init__(self, pipeline: Any, comm: MPI.Comm, agreement: CallAgreement,
                 numbers: CallNumbers, gate: CallGate, plans: Any, active: list,
                 recorder: FlightRecorder | None, watchdog: Watchdog, *, enabled: bool,
                 native: bool):
        self.pipeline = pipeline
        self.comm = comm            # the communicator's data duplicate (rebind() after repair)
        self.agreement = agreement
        self.numbers = numbers
        self.gate = gate
        self.plans = plans          # the communicator's PlanCache
        self.active = active
        self.recorder = recorder
        self.watchdog = watchdog
        self.enabled = enabled
        self.allow_native = native
        #: The entries, by :func:`fast_key`. Only the plain communicator opens them; its rank
        #: never changes and its data communicator only at a repair (:meth:`rebind`).
        self.entries: dict[tuple, FastEntry] = {}
        self.last: Repeat | None = None     # the allreduce's last signature
        self.recent: Recent | None = None   # the family's
        #: Calls :meth:`blocking_native` made (the watchdog counts them with the entries').
        self.checked_blocking = 0
        self.rank, self.size, self.timeout = pipeline.rank, pipeline.size, pipeline.timeout
        # (one attribute each on the path of every repeated call)
        self.fast_open = agreement.fast_open

    # -- the two entries: the allreduce, the other collectives -------------------------------
    def repeat(self, sendbuf: Any, recvbuf: Any, op: Any, asked: Any, plain: Any) -> bool:
        """A blocking plain allreduce of the last signature that took the fast path (numpy
        arrays of the same dtype objects and sizes, the same op, the algorithm asked for and
        ``reproducible`` as the same objects or None both times: :class:`Repeat`), run here,
        the gate claimed and released here; False: :meth:`allreduce` or the checked path
        decide (a new signature, calls outstanding, another thread inside a call,
        overlapping buffers, or mpi4py refusing the buffers).

        This is the path of every repeated call of a training loop, so nothing on it is
        asked twice: it takes no key, no lookup and no call frame but its own, and skips
        what cannot have changed since the record was made. A repair due, a revoked
        communicator, calls abandoned or a freed one forget the record first
        (:meth:`forget_last`), as a change of the communicator's algorithm or mode does.
        It does not poll the control channel (docs/contracts.md, "One exception"): an
        allreduce needs every rank's data, so none completes it without the others."""
        rep = self.last
        if (rep is None or rep.op is not op or rep.asked is not asked or rep.plain is not plain
                or type(recvbuf) is not np.ndarray or recvbuf.dtype is not rep.recv_dtype
                or recvbuf.size != rep.recv_size or self.active):
            return False
        if rep.send_dtype is None:
            if sendbuf is not _IN_PLACE:
                return False
        elif (type(sendbuf) is not np.ndarray or sendbuf.dtype is not rep.send_dtype
              or sendbuf.size != rep.send_size or _may_share(sendbuf, recvbuf)):
            return False  # (overlapping: the checked path says what is wrong)
        # this thread's call, or a call inside its own call (the pair counts' digest of an
        # all-to-all); another thread's call: the checked path's claim says so
        gate = self.gate
        mine = gate.enter()
        if mine is None:
            return False
        entry = rep.entry
        if entry.plan is not None:
            try:
                flags = recvbuf.flags
                if not (flags.c_contiguous and flags.writeable
                        and (sendbuf is _IN_PLACE or sendbuf.flags.c_contiguous)):
                    return False  # the checked path says what is wrong with the buffers
                self.scheduled(entry, (sendbuf, recvbuf, op))
            finally:
                if mine:
                    gate.owner = None
            return True
        # :meth:`native`'s body for MPI_Allreduce, inline (each call frame, bound method and
        # tuple is a tenth of this path)
        rec = self.recorder
        if rec is not None:
            n = rec.next
            rec.next = n + 1
            s = rec.slots[n % rec.capacity]
            s.seq = n
            s.sig = entry.traced
            s.t1 = 0.0
            s.t0 = _now()
        watch = self.watchdog
        numbers = self.numbers
        numbers.take()  # a native call takes no tag slot
        watch.calls += 1
        watch.current = entry.what
        try:
            self.comm.Allreduce(sendbuf, recvbuf, op)
        except MPI.Exception as exc:
            self.pipeline.call_log.failed(s if rec is not None else None, exc)
            raise
        except Exception:
            numbers.give_back()
            if rec is not None:
                rec.withdraw(s)
            return False
        except BaseException as exc:
            self.pipeline.call_log.failed(s if rec is not None else None, exc)
            raise
        finally:
            watch.current = None
            if mine:
                gate.owner = None
        if rec is not None:
            s.t1 = _now()
            if rec.timeline is not None:
                rec.timeline.call(rec, s)
        return True

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str,
                  asked: str | None, plain: bool | None) -> bool:
        """A blocking plain allreduce (the communicator claimed; ``algorithm`` resolved,
        ``asked`` and ``plain``, its ``reproducible``, as the call gave them) through its
        signature's entry, looked up by :func:`fast_key`; False: the checked path. A call
        that takes it becomes the record :meth:`repeat` serves the next calls from."""
        if not self.enabled:
            return False
        entry = self.entries.get(fast_key("Allreduce", algorithm, (sendbuf, recvbuf), op))
        if (entry is None or not self.fast_open()
                or entry.native is not None and not entry.native.direct
                or sendbuf is not MPI.IN_PLACE and _may_share(sendbuf, recvbuf)):
            return False
        args = (sendbuf, recvbuf, op)
        if entry.plan is not None:
            flags = recvbuf.flags
            if not (flags.c_contiguous and flags.writeable
                    and (sendbuf is MPI.IN_PLACE or sendbuf.flags.c_contiguous)):
                return False  # the checked path says what is wrong with the buffers
            self.scheduled(entry, args)
        elif not self.native(entry, self.comm.Allreduce, args):
            return False
        self.last = Repeat(entry, op, asked, plain, sendbuf, recvbuf)
        return True

    def carried(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> bool:
        """A blocking allreduce carried in the reproducible call format (the communicator
        claimed) through its signature's entry; False: the checked path.

        The call's record is built from the entry (no argument resolution, no request, no
        progress engine) and its carrier starts it exactly as the checked launch does, with
        the same MPI calls in the same order (the block exponents' ``MPI_Iallreduce``, the
        special bytes' where a block is flagged, the run of the entry's algorithm: the
        words', or the values' all-to-all then their allgather where the addends meet), so
        ranks that take different paths for one call still match; the run is driven here
        under the communicator's deadline. The carrier reuses one buffer (the words, or the
        column) from call to call, forgotten when a call fails. Like :meth:`allreduce`, it
        does not poll the control channel (an allreduce needs every rank's data)."""
        if not self.enabled or type(recvbuf) is not np.ndarray:
            return False
        entry = self.entries.get(fast_key("Allreduce", algorithm, (sendbuf, recvbuf), op,
                                          CARRIED))
        if entry is None or not self.fast_open():
            return False
        flags = recvbuf.flags
        if not (flags.c_contiguous and flags.writeable) or (
                sendbuf is not _IN_PLACE and (not sendbuf.flags.c_contiguous
                                              or _may_share(sendbuf, recvbuf))):
            return False  # the checked path says what is wrong with the buffers
        args = (sendbuf, recvbuf, op)
        out = carve(entry.output, args)
        call = CollectiveCall("allreduce", "Allreduce", entry.algorithm, entry.requested,
                              entry.op, (out.size,), 0, self.rank, self.size,
                              carve(entry.inp, args), out, None, wire=entry.wire)
        n = self.numbers.take()
        entry.calls += 1
        size = self.size
        finish = (lambda: call.finish(size)) if entry.op == "avg" else None
        wire = entry.wire
        try:
            run = wire.start(call, self.pipeline, f"{entry.what}, call {n})", finish)
            self.drive(run, n, entry.traced)
        except BaseException:
            wire.release()
            raise
        return True

    def family(self, method: str, algorithm: Any, bufs: tuple, op: Any, rest: tuple,
               args: tuple) -> Any:
        """A blocking call of another collective (``method``: mpi4py's; ``bufs``, ``op`` and
        ``rest`` as :func:`fast_key` takes them; ``args``: the public method's arguments,
        its buffers first) through its signature's entry: :data:`DONE` when the fast path
        ran it, else its signature key (None: none) for the checked path, which opens the
        entry.

        The last call's signature is remembered (:class:`Recent`): the same method on the
        same objects and buffers of the same dtypes and shapes skips the key, and what
        cannot have changed since the record was made (a repair due, a revoked
        communicator, calls abandoned, a change of the communicator's defaults forget the
        record first, :meth:`forget_last`). A native signature whose arguments MPI takes as
        they are leaves their flags to mpi4py, which refuses a buffer it cannot use before
        anything is sent (the checked path then says what is wrong)."""
        rec = self.recent
        if (rec is not None and rec.method is method and rec.algorithm is algorithm
                and rec.op is op and (rest is rec.rest or rest == rec.rest)
                and not self.active):
            b = bufs[0]
            if rec.dtype0 is None:
                hit = b is rec.marker0
            else:
                hit = type(b) is np.ndarray and b.dtype is rec.dtype0 and b.shape == rec.shape0
            if hit and not rec.one:
                b = bufs[1]
                if rec.dtype1 is None:
                    hit = b is rec.marker1
                else:
                    hit = (type(b) is np.ndarray and b.dtype is rec.dtype1
                           and b.shape == rec.shape1)
            else:
                hit = hit and len(bufs) == 1
        else:
            hit = False
        if hit:
            key, entry = rec.key, rec.entry
        else:
            key = fast_key(method, algorithm, bufs, op, *rest)
            entry = self.entries.get(key) if key is not None else None
            if entry is None or not self.fast_open():
                return key
            if Recent.holds(bufs):
                self.recent = Recent(method, algorithm, op, rest, bufs, key, entry)
        return DONE if self.run(entry, args) else key

    def run_key(self, key: tuple, args: tuple) -> bool:
        """Run the entry of signature ``key`` (:func:`fast_key`) on ``args`` as :meth:`family`
        runs a call's (an exploring ``auto`` call's candidate, :meth:`bmlmpi.auto_tuning.
        AutoTuning.explore_fast`), keeping no record of it; False where there is none or a
        fast path may not be taken now (the checked path then runs the call)."""
        entry = self.entries.get(key)
        return entry is not None and self.fast_open() and self.run(entry, args)

    def run(self, entry: FastEntry, args: tuple) -> bool:
        """A blocking call of ``entry`` 's signature on ``args`` (the public method's
        arguments, its buffers first): False where the checked path must take it (the
        buffers overlap, another thread is inside a call, a notice waits, flags that cannot
        be carved, mpi4py refusing them)."""
        a, b = args[0], args[1]
        if type(a) is np.ndarray and type(b) is np.ndarray and _may_share(a, b):
            return False  # the checked path says what is wrong
        # one call at a time, as Allreduce's (another thread's call: the checked path's
        # claim raises before anything moves); a call inside this thread's own call goes on
        gate = self.gate
        mine = gate.enter()
        if mine is None:
            return False
        try:
            # A rank's part of a reduce or broadcast may complete without the rank that
            # rejected its arguments: it must look at the notices before its next call moves
            # data, as the checked path's numbering does (docs/contracts.md), or that call
            # pairs with the others' repaired next one; a notice about this very call (the
            # other rank went ahead) means a call that rank will never join. Either way the
            # checked path handles it. One poll of the control channel's posted receive. A
            # call whose rank needs every rank's data (FastEntry.polls) cannot complete
            # without the refusing rank and polls nothing, as the allreduce.
            if entry.polls and self.agreement.notice_waiting(self.numbers.callno + 1):
                return False
            native = entry.native
            if entry.plan is not None or not native.direct:
                for x in args:  # buffers are carved out of C-contiguous writeable arrays only
                    if type(x) is np.ndarray:
                        flags = x.flags
                        if not (flags.c_contiguous and flags.writeable):
                            return False
                if entry.plan is not None:
                    self.scheduled(entry, args)
                    return True
                args = native.of(args)
            return self.native(entry, entry.mpi_call, args)
        finally:
            if mine:
                gate.owner = None

    def blocking_native(self, call: CollectiveCall, key: tuple | None, args: tuple) -> bool:
        """A blocking native call of an agreed signature on the checked path (prepared and
        numbered; ``key`` and ``args`` as for :meth:`open`): mpi4py's blocking call under the
        watchdog, as every other rank's fast path makes it, then its entry opened; False
        where the checked launch runs it instead (MPI's blocking call not allowed, the
        signature not agreed yet, a notice about this call already here: the launch raises
        it before any data moves).

        Whether a rank can take its entry is its own affair (buffers spelled as
        ``[array, MPI.DOUBLE]``, calls outstanding, an entry not opened), but MPI never
        matches a blocking collective with a non-blocking one: a rank that cannot take its
        entry still makes the same MPI call. Calls outstanding that only this process's
        polling advances (schedules' runs) were completed before the call was prepared (the
        checked path of every blocking call does that first,
        :meth:`~bmlmpi.progress.Progress.settle`); MPI's own non-blocking calls progress
        inside the blocking one."""
        pipeline, agreement = self.pipeline, self.agreement
        # a carried call (its call format's words) is started by its carrier, never here
        if (call.algorithm != "native" or call.wire is not None
                or not (self.enabled and self.allow_native)
                or not agreement.agreed(call)
                or agreement.notice_waiting(self.numbers.callno)):
            return False
        slot = pipeline.call_log.record(call)  # (numbered in prepare; a native call takes no tags)
        self.checked_blocking += 1
        watch = self.watchdog
        watch.start()
        watch.calls += 1
        watch.current = call.blocked_in_mpi(self.rank, self.size)
        try:
            call.native(self.comm, "")
        except Exception as exc:
            pipeline.call_log.failed(slot, exc)
            if isinstance(exc, MPI.Exception):
                raise
            # mpi4py refused the agreed call before anything was sent: the others, in the
            # call already, learn of it from the notice (the watchdog's alarm, or their next
            # call), as of any argument error
            with pipeline.policy.failure_noted():
                agreement.validate(None, exc)
            raise
        except BaseException as exc:
            pipeline.call_log.failed(slot, exc)
            raise
        finally:
            watch.current = None
        call.finish(self.size)
        self.open(key, call, args)
        pipeline.call_log.done(slot)
        return True

    # -- the two ways a later call runs ---------------------------------------------------------
    def native(self, entry: FastEntry, mpi_call: Any, args: tuple | list) -> bool:
        """A native signature's later call: ``mpi_call`` (mpi4py's blocking call on the
        private communicator) on ``args``, under the watchdog. It takes its number before it
        enters MPI (the watchdog compares another rank's notice with it); False when mpi4py
        refused the arguments before anything was sent (a buffer whose flags changed since):
        the number is given back and the checked path, which numbers and records the call
        itself and, where it refuses them too, tells the other ranks, takes over."""
        # the flight recorder's begin, inline (bmlmpi.recorder): the path of every repeated
        # native call
        rec = self.recorder
        if rec is not None:
            n = rec.next
            rec.next = n + 1
            s = rec.slots[n % rec.capacity]
            s.seq = n
            s.sig = entry.traced
            s.t1 = 0.0
            s.t0 = _now()
        watch = self.watchdog
        numbers = self.numbers
        numbers.take()  # a native call takes no tag slot
        watch.calls += 1
        watch.current = entry.what
        try:
            mpi_call(*args)
        except MPI.Exception as exc:
            self.pipeline.call_log.failed(s if rec is not None else None, exc)
            raise
        except Exception:
            numbers.give_back()
            if rec is not None:
                rec.withdraw(s)
            return False
        except BaseException as exc:
            self.pipeline.call_log.failed(s if rec is not None else None, exc)
            raise
        finally:
            watch.current = None
        if rec is not None:
            s.t1 = _now()
            if rec.timeline is not None:
                rec.timeline.call(rec, s)
        return True

    def scheduled(self, entry: FastEntry, args: tuple) -> None:
        """A scheduled signature's later call: its run built from the cached plan on the
        buffers carved out of ``args`` and driven here (no CollectiveCall, Request or
        resolve). Tags and call numbers advance as on the checked path, so ranks that take
        different paths for the same call still match."""
        n, tag_base = self.numbers.take_scheduled(entry.kind, entry.sig)
        entry.calls += 1
        what = entry.what
        finish = None
        if entry.averaged is not None:
            result, size = carve(entry.averaged, args), self.size

            def finish() -> None:
                kernels.scale_avg(result, size)
        run = start_schedule(entry.collective, entry.plan, carve(entry.inp, args),
                             carve(entry.output, args), entry.op, tag_base,
                             lambda: f"{what}, call {n})", finish, entry.dtype)
        self.drive(run, n, entry.traced)

    def drive(self, run: Run | ShmRun, seq: int, traced: Signature) -> None:
        """Drive a fast path's ``run`` (call ``seq``, numbered already) to completion in the
        calling thread under the executor's deadline, entered in the flight recorder. A
        deadline revokes the communicator as on the checked path."""
        rec = self.recorder
        agreement = self.agreement
        # (a schedule's run costs tens of microseconds: the call frame of begin is noise here)
        s = rec.begin(traced, run) if rec is not None else None
        try:
            run.drive(self.timeout, agreement.interrupt(seq))
        except DeadlineExceeded as exc:
            self.pipeline.call_log.failed(s, exc, run)
            agreement.held.append(run)  # MPI may still use it: kept, not cancelled
            agreement.gave_up(seq, exc)
            raise
        except (RemoteArgumentError, CommunicatorRevoked) as exc:
            self.pipeline.call_log.failed(s, exc, run)
            agreement.hold(run)
            raise
        except BaseException as exc:
            self.pipeline.call_log.failed(s, exc, run)
            raise
        if s is not None:
            s.run = None
            s.t1 = _now()
            if rec.timeline is not None:
                rec.timeline.call(rec, s)

    # -- opening and closing entries ------------------------------------------------------------
    def open(self, key: tuple | None, call: CollectiveCall, args: tuple, *,
             carried: bool = False) -> None:
        """After the checked first call of a blocking signature (``key``; ``args``: the
        public method's arguments, its buffers first): open its entry where one applies:
        the plain communicator, numpy arrays (a key), no device staging, input and output
        not spelled as two names of one memory (the entry would read the input from the
        output on every later call); a native call only where MPI's blocking call is allowed
        and its op is MPI's (AVG divides afterwards), its displacements in mpi4py's
        arguments; a schedule whose plan is cached and whose blocks lie packed (no
        allgather or all-to-all displacements to place). A carried allreduce (``carried``, its
        ``key`` made with :data:`CARRIED`) opens one for :meth:`carried`, whose carrier
        keeps its buffer; the other carried calls open none (their carrier starts each
        call through the checked path, :mod:`bmlmpi.call_formats`)."""
        if (key is None or not self.enabled or key in self.entries
                or call.staging is not None
                or call.algorithm != "native" and (call.displs is not None
                                                   or call.send_displs is not None)):
            return
        a, b = args[0], args[1]
        if type(a) is np.ndarray and type(b) is np.ndarray and _may_share(a, b):
            return
        traced = call.slot.sig if call.slot is not None else call.traced()
        try:
            if call.wire is not None:
                if carried:
                    self.entries[key] = FastEntry(
                        f"bmlmpi reproducible {call.algorithm} allreduce (rank {self.rank}",
                        traced, collective=call.collective, op=call.op, dtype=call.dtype,
                        inp=locate(call.src, args), output=locate(call.out, args),
                        wire=call.wire.keep(), algorithm=call.algorithm,
                        requested=call.requested)
                return
            if call.algorithm == "native":
                if not self.allow_native or call.op == "avg":
                    return
                method, native_args, _ = call.native_args(False)
                entry = self.entries[key] = FastEntry(
                    call.blocked_in_mpi(self.rank, self.size), traced,
                    native=NativeArgs(method, native_args, args))
                entry.mpi_call = getattr(self.comm, method)
                self.watchdog.start()
                return
            plan_key = call.plan_key()
            plan = self.plans.get(plan_key)
            if plan is None:
                return
            inp, output = call.schedule_buffers()
            averaged = call.averaged() if call.op == "avg" else None
            self.entries[key] = FastEntry(
                f"bmlmpi {call.algorithm} {call.collective} (rank {self.rank}", traced,
                plan=plan, plan_again=call.plan_again(), collective=call.collective,
                kind=call.tag_kind,
                sig=self.plans.sig_id(plan_key), op=call.op, dtype=call.dtype,
                inp=locate(inp, args), output=locate(output, args),
                averaged=locate(averaged, args))
        except ValueError:
            return  # a buffer outside the arguments: the checked path, every call
        finally:
            opened = self.entries.get(key)
            if opened is not None:
                opened.polls = not needs_every_rank(key[0], args, key, self.rank)

    def rebind(self, comm: MPI.Comm) -> None:
        """The communicator moved to ``comm`` (a repair): native calls go there; a scheduled
        entry's plan is compiled again for it (:meth:`CollectiveCall.plan_again`), or the
        entry closes."""
        self.comm = comm
        self.last = self.recent = None
        entries = self.entries
        for key, entry in list(entries.items()):
            if entry.native is not None:
                entry.mpi_call = getattr(comm, entry.native.method)
            if entry.plan is None:
                continue
            if entry.plan_again is None:
                del entries[key]
            else:
                entry.plan = entry.plan_again(self.plans)

    def forget_defaults(self) -> None:
        """The communicator's own algorithm or mode changed: forget the last signatures and
        close the entries of calls that named no algorithm (a key holds the algorithm as the
        call gave it: None for the communicator's own; an exploring ``auto`` call's
        candidate, (None, the candidate))."""
        self.last = self.recent = None
        for key in [k for k in self.entries
                    if k[1] is None or type(k[1]) is tuple and k[1][0] is None]:
            del self.entries[key]

    def forget_last(self) -> None:
        """Forget the last allreduce's signature (calls were abandoned: the next one looks
        its entry up, which asks whether a fast path may be taken)."""
        self.last = self.recent = None

    def close(self) -> None:
        """Close every entry (the communicator is freed)."""
        self.entries.clear()
        self.last = self.recent = None
