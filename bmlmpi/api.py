"""The public allreduce: ``Allreduce``, ``Iallreduce`` and ``Communicator``.

Drop-in for mpi4py: ``comm.Allreduce(a, b, op=MPI.SUM)`` becomes
``bmlmpi.Allreduce(a, b, op=MPI.SUM, comm=comm)`` or ``bmlmpi.Communicator(comm).Allreduce(a, b)``.

A :class:`Communicator` owns a private duplicate of the user's communicator (so bmlmpi's
messages never match the user's), the BCube level communicators (``Split`` per digit, made on
first use), and a cache of compiled plans per signature. The module-level functions keep one
Communicator per user communicator, attached to it as an MPI attribute so it lives and dies
with that communicator.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import secrets
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from mpi4py import MPI

from . import binding, buffers, config, kernels, selection
from .agreement import (
    DEADLINE,
    ERROR,
    MESSAGE_BYTES,
    TAG_ALARM,
    Mailbox,
    Message,
    decode,
    drain,
)
from .buffers import BufferSpecError
from .calls import (
    ArgumentMismatch,
    CommunicatorRevoked,
    CompressedCall,
    IntercommunicatorError,
    PreparedCall,
    RemoteArgumentError,
)
from .compression.channel import CompressionChannel
from .execute import (
    TAG_STEPS,
    DeadlineExceeded,
    Plan,
    Run,
    tag_upper_bound,
    timeout_from_env,
    wait_for,
    wait_request,
)
from .family import COLLECTIVES, REDUCING, FamilyCall, FamilyCalls, then
from .fast_path import FastCall, Repeat
from .handles import NativePersistent, NativeRun, Request
from .ops import check_dtype_op, kernel_op, mpi_op, op_name
from .persistent import PersistentRequest
from .recorder import FlightRecorder, Signature, Slot, recorder_capacity
from .recorder import now as _now
from .schedules import algorithms, catalog
from .schedules.types import Schedule
from .shm import NodeTier, ShmPlan, ShmRun
from .topology.bcube import BCube, Shape, format_shape, resolve_shape
from .watchdog import Watchdog, mpi_abort

_log = logging.getLogger("bmlmpi")

#: The ops the fast path hands MPI as they are, by identity (an ``MPI.Op`` is unhashable).
_FAST_OPS = {id(op): op for op in (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX)}
#: Algorithm names already checked, so a module-level call does not check its string again.
_CHECKED: dict[str, str] = {}
#: Blocks of the tag space: one per collective (:data:`bmlmpi.family.TAG_KIND`), so that
#: messages of different collectives never match.
TAG_KINDS = 8


class _Outstanding:
    """A started allreduce of the plain communicator, polled until its run completes: the
    communicator's record behind a :class:`Request`."""

    __slots__ = ("owner", "run", "done", "seq", "failed", "slot")

    def __init__(self, owner: Communicator, run: Run | NativeRun, seq: int,
                 slot: Slot | None = None):
        self.owner = owner
        self.run = run
        self.done = False
        self.seq = seq                          # the call's number on its communicator
        self.failed: BaseException | None = None  # why it was abandoned, raised when waited
        self.slot = slot                        # the call in the flight recorder
        if slot is not None:
            slot.run = run

    def poll(self) -> bool:
        if not self.done:
            try:
                self.done = self.run.test()
            except BaseException as exc:
                self.owner._call_failed(self.slot, exc, self.run)
                raise
            if self.done:
                self.owner._call_done(self.slot)
        return self.done

    def test(self) -> bool:
        return self.owner._test(self)

    def wait(self) -> None:
        self.owner._wait(self)


def _run_of(plan: Plan | ShmPlan) -> type[Run] | type[ShmRun]:
    """The executor of a compiled plan: messages, or shared-memory steps."""
    return ShmRun if isinstance(plan, ShmPlan) else Run


def _signature_hash(parts: tuple) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # non-negative int64


def _validation_enabled(value: bool | None) -> bool:
    if value is not None:
        return value
    return config.get("BMLMPI_VALIDATE")


def _check_mode(value: str | None) -> str:
    if value is None:
        return config.get("BMLMPI_CHECK")
    if value not in config.CHECK_MODES:
        raise ValueError(f"check must be one of {', '.join(config.CHECK_MODES)}, got {value!r}")
    return value


def _weakly(method: Callable[[str], None]) -> Callable[[str], None]:
    """``method`` called through a weak reference to its object (a watchdog thread must not
    keep a dropped Communicator alive)."""
    ref = weakref.WeakMethod(method)

    def call(report: str) -> None:
        bound = ref()
        if bound is not None:
            bound(report)
    return call


def _still_posted(run: Any) -> bool:
    """Whether MPI may still use a held run's buffers (a request not complete)."""
    for r in run.reqs:
        try:
            if r != MPI.REQUEST_NULL and not r.Test():
                return True
        except MPI.Exception:
            pass
    return False


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


#: Tag slots (of TAG_STEPS tags each) a signature's calls cycle through; the rest of the tag
#: space tells signatures apart (see Communicator._tag_base).
_CALL_SLOTS = 64


class Communicator(FamilyCalls):
    """bmlmpi's collectives over an MPI communicator: the allreduce here, the rest of the
    family (reduce-scatter, allgather, reduce, broadcast) from :class:`bmlmpi.family.
    FamilyCalls`, persistent forms (``…_init``) from :mod:`bmlmpi.persistent`.

    ``algorithm``: one of :func:`bmlmpi.algorithms` (``auto`` by default; ``BMLMPI_ALGORITHM``
    overrides auto). ``topology``: the BCube shape for bml (``"3x3"``, ``(2, 2, 3)``); default
    ``BMLMPI_BCUBE`` or the prime factorisation of the size. ``timeout``: seconds a wait may go
    without progress before it raises (``BMLMPI_TIMEOUT``, default 120). ``validate``: check on
    the first call of each signature that all ranks agree (``BMLMPI_VALIDATE``, default on).

    Blocking calls and deadlines: the first ``Allreduce`` of each signature (count, dtype,
    op, algorithm) is started non-blocking and waited on with the deadline, argument check
    included. When that signature runs ``native`` (chosen, or picked by ``auto``) and
    ``BMLMPI_BLOCKING`` is ``watchdog`` (the default), later blocking calls with numpy arrays
    call ``MPI_Allreduce`` itself, as ``comm.Allreduce`` does (mpi4py's cost plus about
    1 µs); a watchdog thread (:mod:`bmlmpi.watchdog`) bounds them: past ``timeout`` seconds in
    one call it reports the call on stderr and aborts the job with ``MPI_Abort``.
    ``BMLMPI_BLOCKING=polled`` keeps every call on the polled path, where a missing rank
    raises :class:`~bmlmpi.execute.DeadlineExceeded` instead (about 8 µs more a call at 8 B
    between two ranks). A signature that runs a schedule (bml, ring, tree, ...) takes, after
    its first call and whatever ``BMLMPI_BLOCKING`` says, a lean blocking path: the
    :class:`~bmlmpi.execute.Run` built straight from the cached plan and driven in the calling
    thread under the executor's own deadline (``timeout`` seconds without a step completing
    raises DeadlineExceeded naming the step and peers; no watchdog). ``Iallreduce``, device
    arrays, other buffer types and calls made while an ``Iallreduce`` is outstanding take the
    checked path.
    """

    #: Whether calls survive the death of ranks (:mod:`bmlmpi.ft`'s communicator says True).
    fault_tolerant: bool = False
    #: The original ranks lost so far: none here (the fault-tolerant communicator's grow).
    failed: tuple[int, ...] = ()
    #: The flight recorder, made late in construction (None until then, and when disabled).
    _recorder: FlightRecorder | None = None

    #: The variants, by name: a subclass registers itself when its module is imported
    #: (``class FaultTolerantCommunicator(Communicator, variant="fault_tolerant")``), and
    #: ``fault_tolerant=True`` builds the one named ``fault_tolerant``. This module names no
    #: variant's module: :mod:`bmlmpi.variants` (``bmlmpi.Communicator``) loads them.
    _variants: dict[str, type[Communicator]] = {}

    #: The seam a variant plugs into: the private methods a subclass in another module may
    #: override or call (tests/unit/test_shared_state.py holds every module to it; the family's
    #: own hooks are in :attr:`bmlmpi.family.FamilyCalls.SEAM`). Hooks the base calls at one
    #: point of a call's life, which a variant may override:
    #:
    #: * ``_agrees_every_call`` -- agree on every call, not only a signature's first.
    #: * ``_make_control`` -- the communicator agreements travel on.
    #: * ``_split_levels`` -- the BCube level communicators (a variant may make none).
    #: * ``_start`` -- a non-blocking allreduce's entry, its algorithm checked.
    #: * ``_submit`` -- a checked call's launch: returns its :class:`Request`.
    #: * ``_start_persistent`` -- one start of a persistent call: returns the record polled.
    #: * ``_compile`` -- a schedule bound to communicators (a plan).
    #: * ``_failure_noted``/``_is_failure`` -- what an MPI error means (noted or raised).
    #: * ``_progress_mark`` -- what changes when outstanding work advances.
    #:
    #: Services of the base a variant calls (not overridden):
    #:
    #: * ``_check_and_launch(call, label, finish, launch=)`` -- agree on a prepared call across
    #:   ranks (raising on every rank when it differs), then start its exchange (a
    #:   :class:`~bmlmpi.execute.Run` or :class:`NativeRun`; None with ``launch=False``, a
    #:   rank the call skips but which must still agree).
    #: * ``_resolve_auto(call)`` -- the algorithm ``auto`` picks for a call over the current
    #:   members.
    #: * ``_adopt_comm(comm, keep, shape)`` -- after the members changed (a shrink or a mask):
    #:   ``comm`` becomes the data communicator (the old one is freed), ``keep`` the old ranks
    #:   of its members in their new order, ``shape`` its BCube shape; the link weights keep
    #:   those rows and columns (placement did not change), a control channel that was the
    #:   data communicator (``_make_control``) is ``comm`` too, and every cached plan, ``auto``
    #:   choice and agreed signature is forgotten. Only a variant without level
    #:   communicators adopts (none are made for ``comm``).
    #: * ``_tag_count`` -- how many calls have taken tags (settable: survivors of a failure
    #:   continue from the largest count among them, so their next calls use the same tags).
    #: * ``_record(call)``, ``_call_done(slot)``, ``_call_failed(slot, exc, run)`` -- the
    #:   flight recorder's record of a call the variant tracks itself.
    SEAM = frozenset({"_agrees_every_call", "_make_control", "_split_levels", "_start",
                      "_submit", "_start_persistent", "_compile", "_failure_noted",
                      "_is_failure", "_progress_mark", "_check_and_launch", "_resolve_auto",
                      "_adopt_comm", "_tag_count", "_record", "_call_done", "_call_failed"})

    def __init_subclass__(cls, variant: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if variant is not None:
            Communicator._variants[variant] = cls

    def __new__(cls, comm: MPI.Comm = MPI.COMM_WORLD, algorithm: str = "auto",
                topology: str | Sequence[int] | None = None, fault_tolerant: bool = False,
                **kwargs: Any):
        if comm != MPI.COMM_NULL and comm.Is_inter():
            raise IntercommunicatorError(
                "bmlmpi reduces over intracommunicators only; for an intercommunicator use "
                "mpi4py's intercomm.Allreduce (each group receives the reduction of the other "
                "group's data), or Merge() it into an intracommunicator first")
        if fault_tolerant and cls is Communicator:
            variant = Communicator._variants.get("fault_tolerant")
            if variant is None:
                raise RuntimeError("fault_tolerant=True needs the fault-tolerant variant "
                                   "loaded: use bmlmpi.Communicator (bmlmpi.variants loads "
                                   "it) or import bmlmpi.ft.communicator")
            return super().__new__(variant)
        return super().__new__(cls)

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, algorithm: str = "auto",
                 topology: str | Sequence[int] | None = None, fault_tolerant: bool = False,
                 *, timeout: float | None = None, validate: bool | None = None,
                 check: str | None = None):
        if comm == MPI.COMM_NULL:
            raise ValueError("cannot build a bmlmpi.Communicator on MPI.COMM_NULL")
        # Arguments are checked locally, then agreed: a rank whose arguments fail still
        # joins the construction's collectives, so every rank raises at once (the others
        # RemoteArgumentError naming it) instead of waiting out a deadline, and ranks that
        # name different shapes fail before any Split (which has no deadline) is made.
        error: Exception | None = None
        self.timeout = config.get("BMLMPI_TIMEOUT")
        self.shape: Shape = ()
        try:
            self.timeout = timeout_from_env(timeout)
            self.algorithm = selection.check_algorithm(algorithm)
            self.validate = _validation_enabled(validate)
            self.check = "every-call" if self._agrees_every_call() else _check_mode(check)
            self.shape = resolve_shape(comm.Get_size(), topology)
        except (ValueError, TypeError) as exc:
            error = exc
        # Every rank must arrive here; a non-blocking dup turns a missing rank into a
        # DeadlineExceeded instead of a hang, and once it completes all ranks are present, so
        # the blocking Splits right after it cannot wait on an absent rank.
        self._comm, req = comm.Idup()
        wait_request(req, self.timeout, "bmlmpi.Communicator: not every rank of the "
                                        "communicator joined its creation")
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._token = self._agree_construction(error)
        # the control channel (bmlmpi.agreement): agreements and notices, never data
        self._control = self._make_control()
        self._mailbox = (Mailbox(self._control, self._token) if self._control is not self._comm
                         else None)
        self._callno = 0                  # calls started on this communicator (all paths)
        self._revoked: str | None = None  # why every later call raises CommunicatorRevoked
        self._repair_after: int | None = None  # an argument error at this call: re-dup first
        self._held: list[Any] = []        # runs given up while MPI may still use their buffers
        self._handled = [0]   # the last call number whose failure this rank has raised
        self._abandoned_upto = 0  # calls up to this number are abandoned on every rank
        self._owner: int | None = None  # the thread inside a call (_one_thread)
        self._sig_ids: dict[tuple, int] = {}
        self._levels = self._split_levels()
        self._links = self._find_links()
        self._choices: dict[tuple[int, int], str] = {}
        self.calibration = None
        if selection.calibration_wanted(self.algorithm):
            from .calibrate import calibrate
            self.calibration = calibrate(self._comm, timeout=self.timeout)
        self._plans: dict[tuple, Plan] = {}
        self._compression = CompressionChannel(self)
        self._tier: NodeTier | None = None
        self._validated: set[int] = set()
        self._calls = 0
        self._active: list[_Outstanding] = []
        # the blocking fast path (see the class docstring); not for a subclass with its own
        # launch path (the fault-tolerant communicator tracks every call itself)
        plain = type(self)._submit is Communicator._submit
        self._fast: dict[tuple, FastCall] | None = {} if plain else None
        self._repeat: Repeat | None = None
        self._native_fast = (config.get("BMLMPI_BLOCKING") == "watchdog"
                             and self.check == "first-call")
        capacity = recorder_capacity()
        self._recorder = (FlightRecorder(capacity, self.rank, self.size, type(self).__name__,
                                         self.timeout) if capacity else None)
        if self._recorder is not None:
            from .timeline import attach
            attach(self._recorder)
        self._watchdog = Watchdog(self.timeout, mpi_abort(self._comm),
                                  source=("timeout=" if timeout is not None else "BMLMPI_TIMEOUT="),
                                  alarm=self._alarm_channel(),
                                  before_abort=_weakly(self._watchdog_fired))
        # a Communicator dropped without Free() is no longer watched (the watchdog holds it
        # only weakly, above; the process's watchdog thread ends with the last one watched)
        weakref.finalize(self, self._watchdog.close)
        tag_ub = tag_upper_bound(self._comm)
        # each collective's calls cycle through their own block of the tag space
        self._tag_mod = max(TAG_STEPS, (tag_ub + 1) // TAG_KINDS // TAG_STEPS * TAG_STEPS)
        slots = self._tag_mod // TAG_STEPS
        self._call_slots = min(_CALL_SLOTS, slots)
        self._sig_slots = max(1, slots // self._call_slots)

    # -- construction and the control channel -----------------------------------------------
    def _agrees_every_call(self) -> bool:
        """Whether every call is agreed whatever ``check`` says (the fault-tolerant
        communicator agrees on each call anyway)."""
        return False

    def _make_control(self) -> MPI.Comm:
        """The communicator agreements and notices travel on: a duplicate of the data
        communicator, so that no agreement can ever match a data message."""
        control = self._comm.Dup()
        control.Set_errhandler(MPI.ERRORS_RETURN)
        return control

    def _alarm_channel(self) -> Callable[[], str | None] | None:
        """What the watchdog polls while a blocking ``MPI_Allreduce`` is in progress: a
        posted receive of the notices' second copy (:data:`~bmlmpi.agreement.TAG_ALARM`),
        only ever tested by the watchdog thread (needs MPI_THREAD_MULTIPLE)."""
        if self._mailbox is None or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            return None
        control, handled, token = self._control, self._handled, self._token
        box = np.empty(MESSAGE_BYTES, dtype=np.uint8)
        state: dict[str, Any] = {}

        def alarm() -> str | None:
            req = state.get("req")
            if req is None:
                req = state["req"] = control.Irecv([box, MPI.BYTE], MPI.ANY_SOURCE, TAG_ALARM)
            while req.Test():
                msg = decode(box)
                req = state["req"] = control.Irecv([box, MPI.BYTE], MPI.ANY_SOURCE, TAG_ALARM)
                # not an earlier communicator's notice, nor one the calling thread raised
                if msg.token == token and msg.seq > handled[0]:
                    what = ("gave up call" if msg.kind == DEADLINE
                            else "rejected its arguments at call")
                    return f"rank {msg.rank} {what} {msg.seq} ({msg.text})"
            return None
        return alarm

    def _agree_construction(self, error: Exception | None) -> int:
        """One agreement on the new duplicate: whether any rank's arguments failed, and
        whether every rank names the same shape, algorithm, checking mode and validation
        (ranks that differ in these would exchange different messages: ``auto`` calibrates
        on the data communicator, a rank that does not validate never joins an agreement).
        Returns the communicator's token (the largest of the ranks' random numbers), which
        its control messages carry (:class:`~bmlmpi.agreement.Mailbox`)."""
        if self.size == 1:
            if error is not None:
                self._comm.Free()
                raise error
            return 0
        h = 0 if error is not None else _signature_hash(
            (self.shape, self.algorithm, self.check, self.validate))
        vec = np.array([1 if error else 0, self.rank if error else -1, h, -h,
                        secrets.randbits(62)], dtype=np.int64)
        res = np.empty_like(vec)
        try:
            wait_request(self._comm.Iallreduce(vec, res, MPI.MAX), self.timeout,
                         "bmlmpi.Communicator: not every rank joined the argument check")
        except BaseException:
            self._comm.Free()
            raise
        if error is not None or res[0] or res[2] != -res[3]:
            mine = None if error else (f"{format_shape(self.shape)}/{self.algorithm}/"
                                       f"{self.check}/{'on' if self.validate else 'off'}")
            everyone = self._comm.allgather(mine)
            self._comm.Free()
            if error is not None:
                raise error
            if res[0]:
                raise RemoteArgumentError(
                    f"rank {int(res[1])} rejected its bmlmpi.Communicator arguments (see its "
                    f"error); the communicator was not built on any rank")
            lines = ", ".join(f"rank {r}: {w}" for r, w in enumerate(everyone))
            raise ArgumentMismatch(f"bmlmpi.Communicator: the ranks name different "
                                   f"topologies, algorithms, checking modes or validation "
                                   f"(topology/algorithm/check/validate: {lines}); the "
                                   f"communicator was not built on any rank")
        return int(res[4])

    # -- properties -----------------------------------------------------------------------
    @property
    def comm(self) -> MPI.Comm:
        """The private communicator bmlmpi sends on (a duplicate of the user's)."""
        return self._comm

    @property
    def tag_slots(self) -> int:
        """How many calls of one signature may be in flight with tags of their own; a call
        beyond that posts nothing until the call whose tags it reuses completes."""
        return self._call_slots

    @property
    def level_comms(self) -> list[MPI.Comm]:
        """The BCube level communicators, level 0 first (member b of a group has rank b)."""
        return self._levels

    def __repr__(self) -> str:
        return (f"bmlmpi.Communicator(size={self.size}, rank={self.rank}, "
                f"algorithm={self.algorithm!r}, topology={format_shape(self.shape)!r})")

    # -- the flight recorder (bmlmpi.recorder) ------------------------------------------------
    @property
    def recorder(self) -> FlightRecorder | None:
        """This communicator's flight recorder (None with ``BMLMPI_TRACE_CALLS=0``)."""
        return self._recorder

    def dump_trace(self, directory: str | None = None) -> str | None:
        """Write this rank's flight recorder (its last ``BMLMPI_TRACE_CALLS`` calls) as JSON
        into ``directory`` (default ``BMLMPI_TRACE_DIR``, else a per-job folder under the
        temporary directory) and return the file's path; None when the recorder is off.
        Local: each rank writes its own (``bmlmpi-trace DIR`` reads them all)."""
        if self._recorder is None:
            return None
        from pathlib import Path
        return str(self._recorder.dump("dump_trace()", None if directory is None
                                       else Path(directory), announce=False))

    def _call_done(self, slot: Slot | None) -> None:
        if slot is not None:
            self._recorder.done(slot)

    def _call_failed(self, slot: Slot | None, exc: BaseException, run: Any = None) -> None:
        """Record that ``slot``'s call raised ``exc``; dump the recorder unless it was this
        rank's own argument error (every rank raises that at once, nothing to diagnose)."""
        rec = self._recorder
        if rec is None or slot is None:
            return
        own_argument_error = (isinstance(exc, (ValueError, TypeError, BufferError, LookupError,
                                               AttributeError))
                              and not isinstance(exc, (ArgumentMismatch, RemoteArgumentError)))
        rec.failed_call(slot, exc, run, dump=not (own_argument_error
                                                  or isinstance(exc, KeyboardInterrupt)))

    def _watchdog_fired(self, report: str) -> None:
        """The watchdog is about to abort the job (its thread): the blocked call is failed in
        the recorder, which is dumped."""
        rec = self._recorder
        if rec is None:
            return
        running = [s for s in rec.slots if s.seq >= 0 and s.t1 == 0.0]
        if running:
            rec.fail(max(running, key=lambda s: s.seq), TimeoutError(report))
        try:
            rec.dump("watchdog abort")
        except OSError:
            pass

    def Free(self) -> None:
        """Free bmlmpi's communicators, the compression channel's duplicate included.
        Refused (RuntimeError, nothing freed) while a started allreduce of this communicator
        has not completed: MPI would still write its buffers. A communicator on which MPI may
        still hold a call given up at a deadline or after another rank's error is left to MPI
        (not freed: freeing it under a pending collective crashes some MPI libraries); so is
        the compression channel's duplicate while a compressed call is unfinished or after
        one failed (:meth:`bmlmpi.compression.channel.CompressionChannel.free`)."""
        if self._active:
            raise RuntimeError(f"bmlmpi.Communicator.Free(): {len(self._active)} allreduce(s) "
                               f"started on it have not completed; Wait() on their requests "
                               f"first")
        self._watchdog.stop()
        if self._fast is not None:
            self._fast.clear()
        self._family_forget(scheduled_only=False)
        self._repeat = None
        if self._tier is not None:
            if self._tier.comm is self._comm:
                self._tier.free()
            self._tier = None
        if self._mailbox is not None:
            self._mailbox.close()
        held = any(isinstance(h, tuple) for h in self._held)
        pending = bool(self._held) and not all(
            isinstance(h, tuple) or not _still_posted(h) for h in self._held)
        for c in [*self._levels, self._comm]:
            if c != MPI.COMM_NULL and not pending:
                drain(c)
                c.Free()
        if self._control is not self._comm and self._control != MPI.COMM_NULL:
            self._control.Free()
        self._compression.free()
        if not held:
            self._held.clear()
        self._levels = []
        self._plans.clear()

    # -- public calls ---------------------------------------------------------------------
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                  algorithm: str | None = None, compression: Any = None) -> None:
        """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (``sendbuf`` may be IN_PLACE).
        ``algorithm``: this call's (None: the communicator's); ``compression``: a
        :mod:`bmlmpi.compression` compressor or spec (``"fp16"``), which chooses its own path.

        After a signature's first call, a native one goes straight to ``MPI_Allreduce``,
        bounded by the watchdog, and a scheduled one runs its cached plan directly, under the
        executor's deadline (class docstring)."""
        if compression is not None:
            self.Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm,
                            compression=compression).Wait()
            return
        self._blocking(sendbuf, recvbuf, op, self._algorithm_named(algorithm))

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                   algorithm: str | None = None, compression: Any = None) -> Request:
        """Start an allreduce; it progresses inside ``Test``/``Wait`` of the returned request.
        ``algorithm`` and ``compression`` as for :meth:`Allreduce`."""
        if compression is not None:   # the compression layer wraps this same call path
            if algorithm is not None:
                self._refuse(ValueError("algorithm= and compression= together: a compressed "
                                        "call chooses its own path"))
            return self._compression.start(sendbuf, recvbuf, op, compression)
        return self._start(sendbuf, recvbuf, op, self._algorithm_named(algorithm))

    def _algorithm_named(self, algorithm: str | None) -> str:
        """The checked name of a call's ``algorithm`` (None: the communicator's); an unknown
        one is refused on every rank."""
        if algorithm is None:
            return self.algorithm
        try:
            return _CHECKED[algorithm]
        except (KeyError, TypeError):
            try:
                name = selection.check_algorithm(algorithm)
            except (ValueError, TypeError) as exc:
                self._refuse(exc)
            _CHECKED[algorithm] = name
            return name

    # -- the compression seam (bmlmpi.compression) ---------------------------------------------
    @property
    def compression(self) -> CompressionChannel:
        """This communicator's compression state: the private duplicate its compressed calls
        send on, their tag blocks and plans, the measured α-β price, and ``start()`` of a
        compressed allreduce with a chosen error-feedback key
        (:class:`bmlmpi.compression.channel.CompressionChannel`)."""
        return self._compression

    def schedule(self, algorithm: str, count: int, itemsize: int) -> Schedule:
        """This rank's allreduce schedule of ``algorithm`` for ``count`` elements of
        ``itemsize`` bytes over the current members (what the compression layer runs on
        16-bit codes)."""
        return self._schedule(algorithm, count, itemsize)

    def choose(self, count: int, itemsize: int) -> str:
        """The algorithm ``auto`` picks for an allreduce of ``count`` elements of ``itemsize``
        bytes on this communicator (local; every rank picks the same)."""
        return self._auto(count, itemsize)

    def settle_compressed(self, stages: Generator[list, None, Any], channel: CompressionChannel,
                          what: str, abandon: Callable[[], None]
                          ) -> Generator[list, None, Any]:
        """Run the exchange ``stages`` of one compressed call (``what``) on ``channel``, its
        result returned. The seam a fault-tolerant communicator overrides to settle the call
        among the survivors, calling ``abandon()`` (which takes the call out of the
        compressor's memory and drops the channel's duplicate) where it cannot; here the
        stages run as they are."""
        return (yield from stages)

    def allreduce(self, array: Any, op: Any = MPI.SUM) -> np.ndarray:
        """Return a new array holding the reduction of ``array`` over all ranks."""
        if buffers.is_device_array(array):
            from .kernels import gpu
            out = gpu.empty_like(array)
        else:
            src = np.ascontiguousarray(array)
            out = np.empty_like(src)
            array = src
        self.Allreduce(array, out, op)
        return out

    # -- internals ------------------------------------------------------------------------
    # -- the launch path: prepare, agree, launch, progress --------------------------------
    # One engine for both communicators. A subclass overrides only what differs: how a
    # schedule is chosen and bound (_compile), how a started call is tracked (_submit), and
    # what an MPI failure means (_failure_noted, _is_failure).
    def _start(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> Request:
        mine = self._one_thread()
        try:
            return self._begin(sendbuf, recvbuf, op, algorithm)[1]
        finally:
            if mine:
                self._owner = None

    def _begin(self, sendbuf: Any, recvbuf: Any, op: Any,
               algorithm: str) -> tuple[PreparedCall, Request]:
        """Prepare, record and submit one call (the checked path)."""
        try:
            call = self._prepare_agreed(sendbuf, recvbuf, op, algorithm)
        except BaseException as exc:
            self._refused("allreduce", algorithm, op, exc)
            raise
        return call, self._submit_recorded(call)

    def _record(self, call: PreparedCall | FamilyCall) -> Slot | None:
        """Enter ``call`` in the flight recorder (its slot, also kept as ``call.slot``)."""
        rec = self._recorder
        call.slot = None if rec is None else rec.begin(call.traced())
        return call.slot

    def _submit_recorded(self, call: PreparedCall | FamilyCall) -> Request:
        """:meth:`_submit`, the call entered in the flight recorder first."""
        self._record(call)
        try:
            return self._submit(call)
        except BaseException as exc:
            self._call_failed(call.slot, exc)
            raise

    def _refused(self, collective: str, algorithm: str, op: Any, exc: BaseException) -> None:
        """A call this rank refused before it was prepared: recorded (failed) all the same,
        so that the sequence numbers of every rank's recorder stay in step."""
        rec = self._recorder
        if rec is not None:
            name = op_name(op) if id(op) in _FAST_OPS else None
            self._call_failed(rec.begin(Signature(collective, None, None, name, None,
                                                  algorithm, None)), exc)

    # -- call numbers, notices, repair and revocation (docs/contracts.md) -------------------
    def _begin_call(self) -> int:
        """Number the call about to start (the same number on every rank). First deal with
        what the control channel has said: a communicator a deadline ended raises
        CommunicatorRevoked; one that an argument error left with abandoned calls is
        repaired (a fresh duplicate, every rank at its first call after learning of the
        error); a notice that this very call failed on another rank raises here, before
        any data moves."""
        while True:
            if self._revoked is not None:
                self._callno += 1
                raise CommunicatorRevoked(self._revoked)
            if self._repair_after is not None:
                self._repair()
            # a notice about this very call is looked at after the local check (_validate):
            # a rank whose own arguments are wrong too raises its own error
            if self._notice(self._callno) is None:
                break
        self._callno += 1
        if self._callno <= self._abandoned_upto:
            raise RemoteArgumentError(
                f"call {self._callno} was started on another rank before it learnt that call "
                f"{self._handled[0]} failed, so it is abandoned on every rank (docs/contracts.md)")
        return self._callno

    def _notice(self, upto: int) -> Message | None:
        """The first failure notice not yet handled about a call numbered ``upto`` or lower,
        handled now (outstanding calls it dooms are marked failed; the communicator is
        flagged for repair or revoked); None when there is none."""
        mailbox = self._mailbox
        if mailbox is None:
            return None
        msg = mailbox.failure(self._handled[0] + 1)
        if msg is None or msg.seq > upto:
            return None
        exc = self._remote_error(msg)
        if msg.kind == DEADLINE:
            self._revoke(msg.seq, str(exc))
        else:
            self._abandon_from(msg.seq, exc)
            self._repair_after = msg.seq
        return msg

    def _remote_error(self, msg: Message) -> Exception:
        if msg.kind == DEADLINE:
            return CommunicatorRevoked(
                f"rank {msg.rank} gave up call {msg.seq} at its deadline ({msg.text}); the "
                f"call is abandoned on every rank and the communicator is revoked: Free() it "
                f"and build another (docs/contracts.md)")
        return RemoteArgumentError(
            f"rank {msg.rank} rejected its arguments at call {msg.seq} ({msg.text}); this "
            f"call is abandoned on all ranks")

    def _abandon_from(self, seq: int, exc: BaseException) -> None:
        """Calls numbered ``seq`` or later that this rank started are given up: each raises
        ``exc`` when waited on; MPI keeps what it may still use (:attr:`_held`)."""
        self._handled[0] = max(self._handled[0], seq)
        self._repeat = None   # the fast paths stay shut until the repair (_fast_entry)
        keep = []
        for entry in self._active:
            if entry.seq >= seq:
                entry.failed = exc
                self._hold(entry.run)
            else:
                keep.append(entry)
        self._active = keep

    def _hold(self, run: Any) -> None:
        if run is not None and run.cancel():
            self._held.append(run)

    def _revoke(self, seq: int, why: str) -> None:
        self._abandon_from(seq, CommunicatorRevoked(why))
        self._revoked = why

    def _gave_up(self, seq: int, exc: DeadlineExceeded) -> None:
        """This rank gave up call ``seq`` at its deadline: tell the others (a late rank then
        does not join it), revoke the communicator here, and bound this process's
        ``MPI_Finalize`` (a stopped peer would otherwise keep it waiting for ever)."""
        bound_finalize(self.timeout)
        if self._mailbox is not None and self._revoked is None:
            self._mailbox.announce(seq, DEADLINE, _describe_error(exc)[:300],
                                   also_tag=TAG_ALARM)
        if self._revoked is None:
            self._revoke(seq, f"this rank gave up call {seq} at its deadline ({exc}); the "
                              f"communicator is revoked: Free() it and build another "
                              f"(docs/contracts.md)")

    def _repair(self) -> None:
        """After an argument error abandoned calls: move to a fresh duplicate (the old one
        may still hold those calls' messages), and agree on the call numbers, so that a
        call another rank had already started before it learnt of the error is abandoned on
        every rank instead of pairing with a different call."""
        failed = self._repair_after
        new, req = self._control.Idup()
        wait_request(req, self.timeout, f"bmlmpi: not every rank came back after call {failed}'s "
                                        f"argument error (the communicator's repair)")
        counts = np.array([self._callno, self._calls], dtype=np.int64)
        agreed = np.empty_like(counts)
        wait_request(self._control.Iallreduce(counts, agreed, MPI.MAX), self.timeout,
                     "bmlmpi: not every rank joined the communicator's repair")
        new.Set_errhandler(MPI.ERRORS_RETURN)
        self._held.append((self._comm, self._levels))
        self._comm = new
        self._levels = self._split_levels()
        self._plans.clear()
        self._family_forget(scheduled_only=True)
        for entry in (self._fast or {}).values():
            if entry.plan is not None:  # bound to the old communicator: bind it again
                entry.plan = self._plan(*entry.key)
        self._abandoned_upto = int(agreed[0])
        self._calls = int(agreed[1])
        self._repair_after = None

    def _interrupt(self, seq: int) -> Callable[[], None]:
        """The wait loops' check of the control channel for call ``seq``: raises once a
        notice says this call (or an earlier one) failed on another rank."""
        def check() -> None:
            msg = self._notice(seq)
            if msg is not None:
                raise self._remote_error(msg)
        return check

    def _refuse(self, exc: Exception) -> None:
        """A call refused before it had arguments to check (an unknown algorithm name): this
        rank's error, announced to the others like any other argument error."""
        self._begin_call()
        with self._failure_noted():
            self._validate(None, exc)
        raise exc

    def _prepare_agreed(self, sendbuf: Any, recvbuf: Any, op: Any,
                        algorithm: str) -> PreparedCall:
        self._begin_call()
        try:
            return self._prepare(sendbuf, recvbuf, op, algorithm)
        except (ValueError, TypeError, BufferError, LookupError, AttributeError) as exc:
            # the others learn of it in their argument check (RemoteArgumentError); the
            # check raises it here. Lookup and attribute errors come from malformed specs an
            # exporter's own code trips on: still this rank's argument error, not a hang.
            with self._failure_noted():
                self._validate(None, exc)
            raise

    def agree_compressed(self, recvbuf: Any, op: Any, compression: str) -> None:
        """A compressed allreduce's place among this communicator's calls (called by
        :func:`bmlmpi.compression.layer.start` before its first collective): numbered as
        every call, and the first call of each signature agreed on like any other, the
        compressor's settings (``compression``) in the signature. A rank that compresses
        where the others run the plain call, or compresses otherwise, makes that first call
        raise :class:`ArgumentMismatch` on every rank at once (docs/contracts.md). The
        fault-tolerant communicator agrees inside the compressed call itself."""
        if self._mailbox is None:
            return
        self._begin_call()
        count = dtype = name = None
        if isinstance(recvbuf, np.ndarray):
            count, dtype = int(recvbuf.size), recvbuf.dtype.str
        with contextlib.suppress(Exception):
            name = op_name(op)
        self._validate(CompressedCall(count, dtype, name, self.algorithm, compression), None)

    def _one_thread(self) -> bool:
        """Claim the communicator for this thread's call; False when it already holds it (a
        call inside a call). A second thread inside a call raises: two threads' messages on
        one communicator swap results silently (bmlmpi's communicators, like MPI's
        collectives on one communicator, take one call at a time)."""
        me = threading.get_ident()
        owner = self._owner
        if owner == me:
            return False
        if owner is not None:
            raise RuntimeError(
                f"bmlmpi.Communicator (rank {self.rank}): two threads called it at once (a "
                f"call of thread {owner} is in progress); a communicator takes one call at a "
                f"time: use one communicator per thread, or a lock")
        self._owner = me
        return True

    def _blocking(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> None:
        if not self._one_thread():
            self._blocking_call(sendbuf, recvbuf, op, algorithm)
            return
        try:
            self._blocking_call(sendbuf, recvbuf, op, algorithm)
        finally:
            self._owner = None

    def _blocking_call(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> None:
        """A blocking allreduce: the fast path when this signature may take it, else a
        started call waited on (which may then open the fast path for the signature).

        The last fast call's signature is remembered (:class:`Repeat`): numpy arrays of the
        same dtype objects and sizes, with the same op and algorithm, skip the signature key
        (its tuple and hash). Anything else looks the signature up."""
        if self._repair_after is not None:
            self._repair()  # (collective: every rank's first call after the error repairs)
        rep = self._repeat
        # the test of Repeat's docstring, inline (a call frame is a tenth of this path)
        if (rep is not None and rep.op is op and rep.algorithm is algorithm
                and type(recvbuf) is np.ndarray and not self._active
                and recvbuf.dtype is rep.recv_dtype and recvbuf.size == rep.recv_size
                and (sendbuf is MPI.IN_PLACE if rep.send_dtype is None else
                     type(sendbuf) is np.ndarray
                     and sendbuf.dtype is rep.send_dtype and sendbuf.size == rep.send_size
                     and not np.may_share_memory(sendbuf, recvbuf))):
            entry = rep.entry
        else:
            entry = self._fast_entry(sendbuf, recvbuf, op, algorithm)
        if entry is not None:
            if entry.plan is not None:
                flags = recvbuf.flags
                if (flags.c_contiguous and flags.writeable
                        and (sendbuf is MPI.IN_PLACE or sendbuf.flags.c_contiguous)):
                    self._scheduled(entry, sendbuf, recvbuf)
                    return
                # else the checked path says what is wrong with the buffers
            else:
                # the flight recorder's begin and done, inline (bmlmpi.recorder)
                rec = self._recorder
                if rec is not None:
                    n = rec.next
                    rec.next = n + 1
                    s = rec.slots[n % rec.capacity]
                    s.seq = n
                    s.sig = entry.traced
                    s.t1 = 0.0
                    s.t0 = _now()
                watch = self._watchdog
                watch.calls += 1
                watch.current = entry.what
                try:
                    self._comm.Allreduce(sendbuf, recvbuf, entry.op)
                except BufferError:
                    # mpi4py refused a buffer (not contiguous, read-only: flags can change
                    # between calls) before anything was sent: the slow path below gives
                    # the same error, and announces it to the others (and records the call)
                    if rec is not None:
                        rec.next = n
                except MPI.Exception as exc:
                    self._call_failed(s if rec is not None else None, exc)
                    raise
                else:
                    self._callno += 1
                    if rec is not None:
                        s.t1 = _now()
                        if rec.timeline is not None:
                            rec.timeline.call(rec, s)
                    return
                finally:
                    watch.current = None
        call, req = self._begin(sendbuf, recvbuf, op, algorithm)
        req.Wait()
        key = self._fast_key(sendbuf, recvbuf, op, algorithm)
        if (key is None or key in self._fast or call.staging is not None
                or not 0 < call.out.size == recvbuf.size):
            return
        # the first call of this signature ran, argument check and deadline included
        sig = call.slot.sig if call.slot is not None else call.traced()
        if call.algorithm != "native":
            plan_key = (call.algorithm, call.out.size, call.out.dtype, call.op)
            plan = self._plans.get(plan_key)
            if plan is not None:
                self._fast[key] = FastCall(op, f"bmlmpi {call.algorithm} allreduce (rank "
                                                f"{self.rank}", plan, call.op,
                                            self._sig_id(plan_key), plan_key, sig)
        elif self._native_fast and id(op) in _FAST_OPS:
            self._fast[key] = FastCall(_FAST_OPS[id(op)],
                                        f"bmlmpi native allreduce (blocking MPI_Allreduce of "
                                        f"{recvbuf.size} x {recvbuf.dtype} {call.op}, rank "
                                        f"{self.rank} of {self.size})", traced=sig)
            self._watchdog.start()

    def _fast_key(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> tuple | None:
        """The fast path's signature key of a call with numpy arrays; None for any other."""
        if self._fast is None or type(recvbuf) is not np.ndarray:
            return None
        if sendbuf is MPI.IN_PLACE:
            return (algorithm, recvbuf.shape, recvbuf.dtype, None, None, id(op))
        if type(sendbuf) is np.ndarray:
            return (algorithm, recvbuf.shape, recvbuf.dtype, sendbuf.shape, sendbuf.dtype,
                    id(op))
        return None

    def _fast_entry(self, sendbuf: Any, recvbuf: Any, op: Any,
                    algorithm: str) -> FastCall | None:
        """The open fast path of this call's signature, if it may take it now (remembered
        for the next call: :class:`Repeat`); None: the checked path."""
        key = self._fast_key(sendbuf, recvbuf, op, algorithm)
        if key is None:
            return None
        entry = self._fast.get(key)
        if (entry is None or not self._fast_open()
                or not (sendbuf is MPI.IN_PLACE or entry.apart(sendbuf, recvbuf))):
            return None  # the checked path (which may open the fast path for the signature)
        self._repeat = Repeat(entry, op, algorithm, sendbuf, recvbuf)
        return entry

    def _scheduled(self, entry: FastCall, sendbuf: Any, recvbuf: np.ndarray) -> None:
        """A checked scheduled signature's later blocking call: the Run straight from the
        cached plan, driven here with the executor's deadline (no PreparedCall, Request or
        resolve). Tags advance as on the checked path, so ranks that take different paths for
        the same call still match."""
        out = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
        src = None if sendbuf is MPI.IN_PLACE else (
            sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1))
        tag_base = self._tag_base(sig=entry.sig)
        self._callno = seq = self._callno + 1
        entry.calls += 1
        what = entry.what
        finish = None
        if entry.name == "avg":
            def finish() -> None:
                kernels.scale_avg(out, self.size)
        self._drive_fast(_run_of(entry.plan)(entry.plan, out, entry.name, tag_base,
                                             lambda: f"{what}, call {seq})", finish, src=src),
                         seq, entry.traced)

    def _fast_open(self) -> bool:
        """Whether a blocking call may take a fast path now: nothing outstanding, the
        communicator neither revoked nor due for a repair, no call abandoned ahead."""
        return (not self._active and self._revoked is None and self._repair_after is None
                and self._callno >= self._abandoned_upto)

    def _drive_fast(self, run: Run | ShmRun, seq: int, traced: Signature) -> None:
        """Drive a fast path's ``run`` (call ``seq``, numbered already) to completion in the
        calling thread under the executor's deadline, entered in the flight recorder (its
        begin and done inline: this is the path of every repeated scheduled call). A
        deadline revokes the communicator as on the checked path."""
        rec = self._recorder
        # (a schedule's run costs tens of microseconds: the call frame of begin is noise here)
        s = rec.begin(traced, run) if rec is not None else None
        try:
            run.drive(self.timeout, self._interrupt(seq))
        except DeadlineExceeded as exc:
            self._call_failed(s, exc, run)
            self._held.append(run)
            self._gave_up(seq, exc)
            raise
        except (RemoteArgumentError, CommunicatorRevoked) as exc:
            self._call_failed(s, exc, run)
            self._hold(run)
            raise
        except BaseException as exc:
            self._call_failed(s, exc, run)
            raise
        if s is not None:
            s.run = None
            s.t1 = _now()
            if rec.timeline is not None:
                rec.timeline.call(rec, s)

    def _prepare(self, sendbuf, recvbuf, op, algorithm) -> PreparedCall:
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
            algorithm = self._auto_for(count, dtype, name)
        out = recv.flat[:count]
        src = None if send is None else send.flat
        if src is not None and np.may_share_memory(src, out):
            if not (src.__array_interface__["data"][0] == out.__array_interface__["data"][0]):
                raise BufferSpecError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")
            src = None  # the same memory: an in-place call spelled with two names
        return PreparedCall(algorithm, name, src, out, staging, requested)

    def _validate(self, call: PreparedCall | None, error: Exception | None,
                  always: bool = False) -> None:
        """Agree across ranks that the call is well-formed; raise on every rank if not
        (:mod:`bmlmpi.agreement`: the first call of a signature, or every call; ``always``:
        this call whatever the signature)."""
        if self.size == 1:
            if error is not None:
                raise error
            return
        if self.check == "every-call":
            self._agree_collectively(call, error)
            return
        seq = self._callno
        if error is not None:
            # no wait: the others learn of it from the notice, wherever they wait
            self._mailbox.announce(seq, ERROR, _describe_error(error), also_tag=TAG_ALARM)
            self._abandon_from(seq, error)
            self._repair_after = seq
            raise error
        self._interrupt(seq)()   # another rank already rejected this call
        if not self.validate:
            return
        sig = call.signature(self.shape)
        h = _signature_hash(sig)
        if h in self._validated and not always:
            return
        text = call.describe_signature(sig)
        try:
            got = self._mailbox.gather(
                seq, h, text, self.timeout,
                lambda t: f"bmlmpi argument check of call {seq}: not every rank joined within "
                          f"{t:g} s (a rank is missing, or runs a call whose signature was "
                          f"already checked)", DeadlineExceeded)
        except DeadlineExceeded as exc:
            self._gave_up(seq, exc)
            raise
        self._interrupt(seq)()
        if any(m.value != h for m in got.values()):
            lines = "; ".join(f"rank {r}: {got[r].text}" for r in sorted(got))
            raise ArgumentMismatch(f"{call.collective} arguments differ across ranks: {lines}")
        self._validated.add(h)

    def _agree_collectively(self, call: PreparedCall | None, error: Exception | None) -> None:
        """Every call's agreement: one Iallreduce on the control communicator, which every
        rank makes for every call (the rank with an error included) before any data moves."""
        sig, h = None, 0
        if call is not None:
            sig = call.signature(self.shape)
            h = _signature_hash(sig)
        vec = np.array([h, -h, 1 if error else 0, self.rank if error else -1], dtype=np.int64)
        res = np.empty_like(vec)
        try:
            wait_request(self._control.Iallreduce(vec, res, MPI.MAX), self.timeout,
                         f"bmlmpi argument check of call {self._callno}: other ranks did not "
                         f"join")
        except DeadlineExceeded as exc:
            self._gave_up(self._callno, exc)
            raise
        if error is not None:
            raise error
        if res[2]:
            raise RemoteArgumentError(f"rank {res[3]} rejected its {call.collective} "
                                      f"arguments (see its error); this call is abandoned "
                                      f"on all ranks")
        if res[0] != -res[1]:
            everyone = self._control.allgather(sig)
            lines = "; ".join(f"rank {r}: {PreparedCall.describe_signature(s)}"
                              for r, s in enumerate(everyone))
            raise ArgumentMismatch(f"{call.collective} arguments differ across ranks: {lines}")

    def _submit(self, call: PreparedCall) -> Request:
        """Check the call across ranks, start it and hand back its request."""
        seq = self._callno
        label = f"bmlmpi {call.algorithm} {call.collective} (rank {self.rank}, call {seq})"
        return Request(self._outstanding(
            self._check_and_launch(call, label, lambda: call.finish(self.size)), seq,
            call.slot))

    def _check_and_launch(self, call: PreparedCall | FamilyCall, label: str,
                          finish: Callable[[], None] | None = None, *,
                          launch: bool = True) -> Run | NativeRun | None:
        """Agree on ``call`` across ranks (raising on every rank when it differs), then start
        its exchange (None with ``launch`` False: a rank the call skips agrees all the
        same). A seam service (:attr:`SEAM`)."""
        self._validate(call, None)
        return self._launch(call, label, finish) if launch else None

    def _sig_id(self, key: tuple) -> int:
        """The signature's number: the order in which this communicator first ran it, the
        same on every rank that runs the same calls."""
        sig = self._sig_ids.get(key)
        if sig is None:
            sig = self._sig_ids[key] = len(self._sig_ids)
        return sig

    def _launch(self, call: PreparedCall, label: str,
                finish: Callable[[], None] | None) -> Run | NativeRun:
        """Start ``call``'s exchange (native, or its schedule's plan) on this communicator;
        ``finish`` runs when the exchange completes."""
        if call.collective != "allreduce":
            return self._launch_family(call, label, finish)
        if call.algorithm == "native":
            return self._launch_native(call, finish)
        out = call.out
        plan = self._plan(call.algorithm, out.size, out.dtype, call.op)
        tag_base = self._tag_base(sig=self._sig_id((call.algorithm, out.size, out.dtype,
                                                     call.op)))
        # a separate input is not copied into out up front: the run copies only the ranges
        # it must (bmlmpi.deferred), sending the rest from the input itself
        return _run_of(plan)(plan, out, call.op, tag_base, label, finish, src=call.src)

    def _tag_base(self, kind: int = 0, sig: int = 0) -> int:
        """The tag base of the next call (every call advances the count): the call's slot in
        its collective's block of the tag space (``kind``: :data:`bmlmpi.family.TAG_KIND`).
        Inside the block, the signature's number (``sig``, :meth:`_sig_id`) picks a part and
        the count a slot in it, so messages of calls with different signatures never match
        (up to ``_sig_slots`` signatures: 1024 with Open MPI's tag bound), even when ranks
        disagree on which signature they run."""
        slot = (sig % self._sig_slots) * self._call_slots + self._calls % self._call_slots
        self._calls += 1
        return slot * TAG_STEPS + kind * self._tag_mod

    def _native_run(self, req: MPI.Request, finish: Callable[[], None] | None,
                    what: str) -> NativeRun:
        return NativeRun(req, finish, self.rank, what)

    def _native_blocking(self) -> bool:
        """Whether a checked native call may be MPI's blocking call under the watchdog (the
        plain communicator with ``BMLMPI_BLOCKING=watchdog``)."""
        return self._fast is not None and self._native_fast

    def _agreed(self, call: PreparedCall | FamilyCall) -> bool:
        """Whether ``call``'s signature was agreed on by every rank before (else it goes
        through the checked path, whose agreement raises on every rank if it differs)."""
        return (not self.validate or self.size == 1
                or _signature_hash(call.signature(self.shape)) in self._validated)

    def _resolve_auto(self, call: PreparedCall | FamilyCall) -> str:
        """``auto``'s choice for ``call`` over the current members."""
        if call.collective != "allreduce":
            return self._family_auto(call)
        return self._auto_for(call.out.size, call.out.dtype, call.op)

    # -- persistent calls (MPI 4): checked and compiled once, started many times -----------
    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                       algorithm: str | None = None) -> PersistentRequest:
        """A persistent allreduce (``MPI_Allreduce_init``; :mod:`bmlmpi.persistent`);
        ``algorithm`` None: the communicator's."""
        self._usable_for_calls()
        algorithm = self.algorithm if algorithm is None else selection.check_algorithm(algorithm)
        if buffers.is_device_array(recvbuf if not isinstance(recvbuf, (list, tuple))
                                   else recvbuf[0] if recvbuf else None):
            raise BufferSpecError("Allreduce_init takes host buffers (a persistent request "
                                  "cannot stage device memory at every start)")
        return self._persistent(self._prepare_agreed(sendbuf, recvbuf, op, algorithm))

    def _persistent(self, call: PreparedCall | FamilyCall) -> PersistentRequest:
        """Agree on ``call`` across ranks now and compile it once (:mod:`bmlmpi.persistent`).
        The agreement is made at every ``_init``, even of a signature already agreed on: a
        rank whose arguments fail its local check makes every rank's ``_init`` raise."""
        with self._failure_noted():
            self._validate(call, None, always=True)
        compiled = None
        if self._fast is not None:  # the plain communicator (the ledger compiles per attempt)
            if call.algorithm == "native":
                compiled = self._native_init(call)
            elif call.collective == "allreduce":
                compiled = self._plan(call.algorithm, call.out.size, call.out.dtype, call.op)
            else:
                compiled = self._family_plan(call)
        return PersistentRequest(self._start_persistent, call, compiled)

    def _native_init(self, call: PreparedCall | FamilyCall) -> NativePersistent | None:
        """The MPI library's persistent request for a native call, on buffers of its own
        (:class:`NativePersistent`); None where the library has none (each start then posts
        the non-blocking call)."""
        try:
            if call.collective != "allreduce":
                return NativePersistent(*call.native_private(self._comm, "_init"))
            sbuf = call.out if call.src is None else call.src
            private, out = np.empty_like(call.out), call.out

            def deliver() -> None:
                np.copyto(out, private)
            return NativePersistent(self._comm.Allreduce_init(sbuf, private, mpi_op(call.op)),
                                    deliver)
        except (NotImplementedError, AttributeError):
            return None
        except MPI.Exception as exc:
            if exc.Get_error_class() == MPI.ERR_UNSUPPORTED_OPERATION:
                return None
            raise

    def _start_persistent(self, call: PreparedCall | FamilyCall, compiled: Any) -> Any:
        """One start of a persistent call: no argument check, the compiled plan or the MPI
        library's persistent request; the returned record is polled like an Iallreduce."""
        def finish() -> None:
            call.finish(self.size)

        # a start is a call: numbered alike on every rank; refused on a revoked
        # communicator, and after another rank's argument error as any call is
        seq = self._begin_call()
        label = (f"bmlmpi persistent {call.algorithm} {call.collective} (rank {self.rank}, "
                 f"call {seq})")
        if isinstance(compiled, NativePersistent):
            compiled.req.Start()
            run: Run | NativeRun = NativeRun(compiled.req, then(compiled.deliver, finish),
                                             self.rank, label)
        elif isinstance(compiled, Plan | ShmPlan):
            if call.collective == "allreduce":
                sig = self._sig_id((call.algorithm, call.out.size, call.out.dtype, call.op))
                run = _run_of(compiled)(compiled, call.out, call.op, self._tag_base(sig=sig),
                                        label, finish, src=call.src)
            else:
                run = self._launch_family(call, label, finish)
        else:
            run = self._launch(call, label, finish)
        return self._outstanding(run, seq, self._record(call))

    def _outstanding(self, run: Run | ShmRun | NativeRun, seq: int,
                     slot: Slot | None) -> _Outstanding:
        """The record of call ``seq``, started as ``run``: polled once, then kept in
        :attr:`_active` until it completes. A scheduled run whose tags a call still in flight
        holds (the same signature's call ``_call_slots`` calls earlier: tag slots cycle) posts
        nothing until that call completes, since the two would take each other's messages;
        ranks post their calls in one order, so the older call completes without it."""
        if self._active and type(run) is Run:
            run.defer_behind(e.run for e in self._active)
        entry = _Outstanding(self, run, seq, slot)
        if not entry.poll():
            self._active.append(entry)
        return entry

    def _launch_native(self, call: PreparedCall, finish: Callable[[], None] | None) -> NativeRun:
        """``MPI_Iallreduce`` into a private buffer, copied to the caller's on completion:
        a call given up at its deadline can still complete inside MPI when a late rank
        joins it, and must then write memory bmlmpi holds, not the caller's."""
        out = call.out
        sbuf = out if call.src is None else call.src
        private = np.empty_like(out)
        try:
            req = self._comm.Iallreduce(sbuf, private, mpi_op(call.op))
        except (KeyError, ValueError, MPI.Exception) as exc:
            if isinstance(exc, MPI.Exception) and self._is_failure(exc):
                raise
            if out.size > np.iinfo(np.int32).max:
                raise ValueError(
                    f"native MPI_Allreduce of {out.size} elements: the count exceeds what "
                    f"this MPI's int-count call takes (2**31 - 1); use a bmlmpi algorithm "
                    f"(ring, bml) for it: {exc}") from exc
            raise TypeError(f"native MPI_Allreduce cannot reduce dtype {call.out.dtype} "
                            f"with this MPI: {exc}") from exc
        return NativeRun(req, finish, self.rank, private=private, out=out)

    def _plan(self, algorithm: str, count: int, dtype: np.dtype, op: str) -> Plan:
        """The compiled plan of a signature (cached), its kernels compiled."""
        key = (algorithm, count, dtype, op)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        plan = self._compile(algorithm, count, dtype.itemsize)
        # Compile (or load from numba's cache) the kernels this plan calls now, outside any
        # deadline: a first compile inside a step can take seconds on a loaded node.
        fan_in = max((len(offs) for lane in plan.lanes for st in lane for _, _, offs in st.reduces),
                     default=0)
        if fan_in:
            kernels.warmup([dtype], [kernel_op(op)], sources=sorted({1, fan_in}))
        self._plans[key] = plan
        return plan

    def _schedule(self, algorithm: str, count: int, itemsize: int) -> Schedule:
        """This rank's schedule of ``algorithm`` over the current members (hierarchical's
        node tier in shared memory where every node's ranks share it; ``shm`` refused on
        every rank alike when the communicator spans nodes)."""
        record = algorithms.get(algorithm)
        intra = "ring"
        if algorithm == "shm":
            self._node_tier().require_one_node()
        elif algorithm == "hierarchical" and self._node_tier().fits:
            intra = "shm"
        return record.build(algorithms.Context(
            self.size, count, itemsize, self.rank, shape=self.shape, links=self._links,
            nodes=self.nodes() if record.tiered else None, intra=intra))

    def _compile(self, algorithm: str, count: int, itemsize: int) -> Plan | ShmPlan:
        """The schedule bound to this communicator (BCube levels on their own communicators,
        shared-memory steps on the node's window)."""
        sched = self._schedule(algorithm, count, itemsize)
        if sched.uses_shm:
            return self._node_tier().bind(sched, itemsize)
        levels = [] if algorithms.get(algorithm).tiered else self._levels
        return binding.bind(sched, self._comm, levels, self.shape)

    def _adopt_comm(self, comm: MPI.Comm, keep: Sequence[int], shape: Shape) -> None:
        """After the members changed (a fault-tolerant shrink or mask): ``comm`` becomes the
        data communicator, ``keep`` the old ranks of its members in their new order, ``shape``
        its BCube shape. The link weights keep those rows and columns (placement did not
        change); a control channel that was the data communicator follows it; cached plans,
        ``auto`` choices and agreed signatures are forgotten. A seam
        service (:attr:`SEAM`) for a variant without level communicators."""
        old = self._comm
        with contextlib.suppress(MPI.Exception):
            old.Free()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._comm = comm
        if self._control is old:  # agreements travel on the data communicator
            self._control = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.shape = shape
        self._links = self._links[np.ix_(keep, keep)]
        self._plans.clear()
        self._validated.clear()
        self._choices.clear()

    @property
    def _tag_count(self) -> int:
        """How many calls have taken tags (:meth:`_tag_base`); a seam service (:attr:`SEAM`):
        survivors of a failure set it to the largest among them."""
        return self._calls

    @_tag_count.setter
    def _tag_count(self, count: int) -> None:
        self._calls = count

    def _node_tier(self) -> NodeTier:
        """This rank's node of the current communicator (made on first use, collective;
        remade, the old one dropped without a collective, after the members changed)."""
        tier = self._tier
        if tier is not None and tier.comm is self._comm:
            return tier
        if tier is not None:
            tier.abandon()
        tier = self._tier = NodeTier(self._comm, self.nodes(), self.timeout)
        return tier

    @contextmanager
    def _failure_noted(self) -> Iterator[None]:
        """Where a fault-tolerant communicator notes an MPI failure instead of raising it."""
        yield

    def _is_failure(self, exc: MPI.Exception) -> bool:
        """Whether ``exc`` reports a failed process (only ever so with fault tolerance)."""
        return False

    def _test(self, entry: _Outstanding) -> bool:
        return self._owning(self._test_entry, entry)

    def _owning(self, fn: Callable[[_Outstanding], Any], entry: _Outstanding) -> Any:
        """``fn(entry)`` as the thread that owns this communicator's progress."""
        mine = self._one_thread()
        try:
            return fn(entry)
        finally:
            if mine:
                self._owner = None

    def _test_entry(self, entry: _Outstanding) -> bool:
        if entry.failed is not None:
            raise entry.failed
        self._progress()
        if not entry.done:
            self._interrupt(entry.seq)()
            if entry.failed is not None:
                raise entry.failed
        return entry.done

    def _wait(self, entry: _Outstanding) -> None:
        self._owning(self._wait_entry, entry)

    def _wait_entry(self, entry: _Outstanding) -> None:
        if entry.failed is not None:
            raise entry.failed
        if entry.done:
            return
        check = self._interrupt(entry.seq)

        def interrupt() -> None:
            check()
            if entry.failed is not None:
                raise entry.failed
        try:
            wait_for(lambda: (self._progress(), entry.done)[1], self.timeout,
                     entry.run.describe_timeout, progress=self._progress_mark,
                     interrupt=interrupt,
                     busy=entry.run.busy if isinstance(entry.run, ShmRun) else 0.0)
        except DeadlineExceeded as exc:
            if entry in self._active:
                self._active.remove(entry)
            self._call_failed(entry.slot, exc, entry.run)
            self._held.append(entry.run)
            self._gave_up(entry.seq, exc)
            raise
        except BaseException as exc:
            # An abandoned allreduce must not be polled by later calls.
            self._call_failed(entry.slot, exc, entry.run)
            if entry in self._active:
                self._active.remove(entry)
                self._hold(entry.run)
            raise

    def _progress(self) -> None:
        """Advance every outstanding allreduce, oldest first; drop the finished ones."""
        if self._active:
            for e in self._active:
                e.poll()
            self._active = [e for e in self._active if not e.done]

    def _progress_mark(self) -> tuple[int, ...]:
        """Changes whenever any outstanding allreduce completes a step of any lane."""
        return tuple(e.run.progress for e in self._active)

    def _auto_for(self, count: int, dtype: np.dtype, op: str) -> str:
        """``auto``'s choice for an allreduce, keeping one NaN rule: MIN and MAX of floats
        propagate NaN (numpy's rule, which bmlmpi's kernels follow); Open MPI's own
        MPI_MIN/MPI_MAX do not, so ``auto`` never hands those to ``native`` (the tree below
        64 KiB, the ring above). ``native`` asked for explicitly is the MPI library's rule."""
        choice = self._auto(count, dtype.itemsize)
        if choice == "native" and op in ("min", "max") and dtype.kind == "f":
            choice = "tree" if count * dtype.itemsize <= 65536 else "ring"
        return choice

    def _auto(self, count: int, itemsize: int) -> str:
        key = (count, itemsize)
        choice = self._choices.get(key)
        if choice is None:
            why = selection.explain(count, itemsize, self.size, self.calibration, self.shape,
                                 nodes=self._nodes_for_auto())
            choice = self._choices[key] = why.chosen
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("auto (rank %d of %d) for a new signature: %s", self.rank,
                           self.size, why)
        return choice

    def explain(self, count: int, dtype: Any, op: Any = MPI.SUM,
                collective: str = "allreduce") -> selection.Explanation:
        """What ``Allreduce`` of ``count`` elements of ``dtype`` with ``op`` runs on this
        communicator, and why: the candidates ``auto`` priced (predicted seconds: the cost
        model with this machine's calibration, and the model before the calibration's
        measured correction), the one chosen and the rule that chose it
        (:class:`bmlmpi.selection.Explanation`; ``str()`` of it is a small table). Local: no
        communication; every rank reaches the same answer. A communicator built with a named
        algorithm explains that it runs it. ``collective``: also ``reduce_scatter``,
        ``allgather``, ``reduce`` or ``bcast``, ``count`` then being the elements of all
        ranks' blocks together (what their ``auto`` runs: :func:`bmlmpi.selection.
        explain_collective`)."""
        if collective not in ("allreduce", *COLLECTIVES):
            raise ValueError(f"explain: unknown collective {collective!r}; one of allreduce, "
                             f"{', '.join(COLLECTIVES)}")
        if count < 0:
            raise ValueError(f"explain: count must be >= 0, got {count}")
        dt = np.dtype(dtype)
        if collective in ("allreduce", *REDUCING):
            check_dtype_op(dt, op_name(op))
        asked = (self.algorithm if collective == "allreduce"
                 else self._family_algorithm(collective, None))
        if asked != "auto":
            return selection.Explanation(collective, int(count), dt.itemsize, self.size,
                                      asked, "asked",
                                      f"the communicator was built with "
                                      f"algorithm={self.algorithm!r}")
        if collective != "allreduce":
            blocked = collective in ("reduce_scatter", "allgather") and count % self.size == 0
            return selection.explain_collective(
                collective, int(count), dt.itemsize, self.size, self.calibration, self.shape,
                self._nodes_for_auto(), 0, (count // self.size,) * self.size if blocked else None)
        return selection.explain(int(count), dt.itemsize, self.size, self.calibration,
                              self.shape, nodes=self._nodes_for_auto())

    def _find_links(self) -> np.ndarray:
        """The link-weight matrix trees are built on: ``BMLMPI_LINKS``, else MPI placement.

        Also fixes where :meth:`nodes` comes from: ``BMLMPI_RANKS_PER_NODE``, else the
        placement matrix (the returned one, or a separate one when ``BMLMPI_LINKS`` names
        devices)."""
        from .topology.links import links_from_env, links_from_placement
        from .topology.nodes import ranks_per_node_from_env

        self._ranks_per_node = ranks_per_node_from_env()
        self._placement = None  # None: the link matrix itself is the placement
        w = links_from_env()
        if w is None:
            return links_from_placement(self._comm)
        if self._ranks_per_node is None:
            self._placement = links_from_placement(self._comm)
        if w.shape != (self.size, self.size):
            raise ValueError(f"BMLMPI_LINKS describes {w.shape[0]} devices but the "
                             f"communicator has {self.size} ranks")
        return w

    def nodes(self):
        """Which ranks share a node (:class:`bmlmpi.topology.nodes.Nodes`):
        ``BMLMPI_RANKS_PER_NODE`` consecutive ranks when set at construction, else MPI
        placement."""
        from .topology.nodes import resolve_nodes
        placement = self._links if self._placement is None else self._placement
        return resolve_nodes(self.size, placement, self._ranks_per_node)

    def _nodes_for_auto(self):
        try:
            return self.nodes()
        except ValueError:
            return None  # nodes unknown (a stale placement after failures): no hierarchical

    @property
    def links(self) -> np.ndarray:
        """The link-weight matrix (rank × rank) the trees are generated from."""
        return self._links

    def tree(self):
        """The single binary reduction tree rooted at rank 0 (built once, the same on all)."""
        return catalog.binary_tree_for(self.size, self._links)

    def trees(self):
        """One tree per root for the multi-tree allreduce, with the link-usage penalty."""
        return catalog.multi_trees_for(self.size, self._links)

    def _split_levels(self) -> list[MPI.Comm]:
        """One communicator per BCube level: the ranks sharing all digits but that level's."""
        cube = BCube(self.shape)
        levels = []
        for lv in range(cube.levels):
            c = self._comm.Split(cube.color(self.rank, lv), cube.digit(self.rank, lv))
            c.Set_errhandler(MPI.ERRORS_RETURN)
            levels.append(c)
        return levels


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
    return _communicator_for(comm)


def _communicator_for(comm: MPI.Comm) -> Communicator:
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
        ctx = _communicator_for(comm)
    ctx._blocking(sendbuf, recvbuf, op, ctx._algorithm_named(algorithm))


def Iallreduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, comm: MPI.Comm = MPI.COMM_WORLD,
               algorithm: str = "auto") -> Request:
    """Non-blocking :func:`Allreduce`; progresses inside the request's ``Test``/``Wait``."""
    ctx = _communicator_for(comm)
    return ctx._start(sendbuf, recvbuf, op, ctx._algorithm_named(algorithm))


_finalize_bound: list[float] = []


def bound_finalize(seconds: float) -> None:
    """Give this process's ``MPI_Finalize`` at most ``2 * seconds`` (at least 30) once the program
    ends: a rank that gave up a call at its deadline may have a peer that is stopped or hung,
    and ``MPI_Finalize`` would wait for it for ever. At exit, before mpi4py finalizes, an
    alarm is armed (SIGALRM, the default action: the process ends, and the launcher ends the
    job); a finalize that completes in time is not affected."""
    if _finalize_bound:
        _finalize_bound[0] = max(_finalize_bound[0], seconds)
        return
    _finalize_bound.append(seconds)
    import atexit
    import os
    import signal

    def arm() -> None:
        # generous: a finalize that is merely slow (a loaded node, many communicators) must
        # not be cut short; only one that waits for ever is
        n = max(30, int(math.ceil(2 * _finalize_bound[0])))
        with contextlib.suppress(OSError):
            os.write(2, (f"bmlmpi: a call was given up at its deadline on this rank; "
                         f"MPI_Finalize gets {n} s before this process ends itself (a "
                         f"stopped or hung peer cannot keep the job from ending)\n").encode())
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(n)
    atexit.register(arm)
