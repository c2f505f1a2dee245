"""The public communicator: :class:`Communicator`, a facade over the parts that do the work.

Drop-in for mpi4py: ``comm.Allreduce(a, b, op=MPI.SUM)`` becomes
``bmlmpi.Communicator(comm).Allreduce(a, b)`` (or the module-level ``bmlmpi.Allreduce(a, b,
comm=comm)`` of :mod:`bmlmpi.dropin`).

A :class:`Communicator` owns a private duplicate of the user's communicator (so bmlmpi's
messages never match the user's) and composes the parts it calls through their public
methods: its placement (:mod:`bmlmpi.placement`: level communicators, links, nodes), plan
cache and ``auto`` (:mod:`bmlmpi.plans`), call numbers and tag slots
(:mod:`bmlmpi.call_numbers`, their one owner), the thread inside a call
(:mod:`bmlmpi.call_gate`), agreement on its calls (:mod:`bmlmpi.call_agreement`),
outstanding calls (:mod:`bmlmpi.progress`), the blocking fast path of every collective
(:mod:`bmlmpi.fast_path`), the family's checked calls (:mod:`bmlmpi.family`) and compression
channel
(:mod:`bmlmpi.compression.channel`), and the policy for what differs under failures
(:mod:`bmlmpi.call_policy`), which it calls at a few named points of a call's life. Here:
construction, the public methods, the variant registry and the services a policy calls.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import buffers, call_formats, config, selection
from .agreement import (
    Mailbox,
    drain,
)
from .auto_tuning import AutoTuning
from .buffers import BufferSpecError
from .call_agreement import CallAgreement, agree_construction
from .call_gate import CallGate
from .call_log import CallLog
from .call_numbers import CallNumbers
from .call_policy import CallPolicy
from .calls import (
    CollectiveCall,
    CompressedCall,
    IntercommunicatorError,
    prepare_allreduce,
)
from .compression.channel import CompressionChannel
from .execute import (
    Run,
    tag_upper_bound,
    timeout_from_env,
    wait_request,
)
from .family import (
    COLLECTIVES,
    REDUCING,
    FamilyEngine,
    alltoallv_counts,
    alltoallv_key,
    broadcast,
    exchange,
    gather,
    reduce_to,
    scatter,
    scatter_blocks,
)
from .fast_path import CARRIED, DONE, FastPath, fast_key
from .finalize import remove_singleton_leftovers
from .handles import NativeRun, Request
from .model.estimate import Calibration
from .ops import check_dtype_op, op_name
from .persistent import PersistentCalls, PersistentRequest
from .placement import Placement
from .plans import PlanCache
from .progress import Outstanding, Progress
from .recorder import FlightRecorder, recorder_capacity, world_members
from .schedules import catalog
from .topology.bcube import Shape, format_shape, resolve_shape
from .watchdog import Watchdog, mpi_abort

# mpi4py initialised MPI when it was imported above (unless the program turned that off): a
# singleton's segment is removed at exit even where it never builds a communicator (a
# program's --help, a script that only asks bmlmpi.algorithms())
remove_singleton_leftovers()

_log = logging.getLogger("bmlmpi")

#: Algorithm names already checked, so a module-level call does not check its string again.
_CHECKED: dict[str, str] = {}


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


def _carry(comm: Communicator, reproducible: bool | None) -> Any:
    """The call format a reducing call of ``comm`` is carried in: the reproducible one when
    ``reproducible`` says so (None: the communicator's own mode), else None."""
    wanted = comm.reproducible if reproducible is None else reproducible
    return call_formats.REPRODUCIBLE if wanted else None


def _defaults_changed(comm: Communicator) -> None:
    """``comm``'s own algorithm or mode was assigned: its blocking fast path forgets what
    calls that named neither took (nothing while the constructor runs)."""
    fast = comm.__dict__.get("_fast_path")
    if fast is not None:
        fast.forget_defaults()


def _in_key(carry: Any) -> tuple:
    """What a call format adds to a blocking call's fast-path signature key: a call of the
    same arrays in another mode is another signature."""
    return () if carry is None else (CARRIED,)


def _named(comm: Communicator, algorithm: str | None) -> str:
    """The checked name of a call's ``algorithm`` on ``comm`` (None: the communicator's); an
    unknown one is refused on every rank."""
    if algorithm is None:
        return comm.algorithm
    try:
        return _CHECKED[algorithm]
    except (KeyError, TypeError):
        try:
            name = selection.check_algorithm(algorithm)
        except (ValueError, TypeError) as exc:
            comm._agreement.refuse(exc)
        _CHECKED[algorithm] = name
        return name


def _prepare_checked(comm: Communicator, sendbuf: Any, recvbuf: Any, op: Any,
                     algorithm: str, carry: Any = None) -> CollectiveCall:
    """One allreduce of ``comm`` numbered and prepared on the checked path (the caller holds
    the gate), carried in ``carry`` (a call format, or None); a call this rank refuses is
    recorded as refused before its error is raised."""
    try:  # (not a context manager: one costs the I… hot path ~2 µs)
        return comm._agreement.prepared(prepare_allreduce, comm.rank, comm.size, sendbuf,
                                        recvbuf, op, algorithm, comm._cache.auto_for, carry)
    except BaseException as exc:
        comm.call_log.refused("allreduce", algorithm, op, exc)
        raise


def _weakly(method: Callable[[str], None]) -> Callable[[str], None]:
    """``method`` called through a weak reference to its object (a watchdog thread must not
    keep a dropped Communicator alive)."""
    ref = weakref.WeakMethod(method)

    def call(report: str) -> None:
        bound = ref()
        if bound is not None:
            bound(report)
    return call


def _weakly_number(comm: Communicator) -> Callable[[], int | None]:
    """The number of ``comm``'s call in progress (:meth:`bmlmpi.call_log.CallLog.
    in_progress`),
    through a weak reference (a watchdog thread must not keep a dropped Communicator
    alive)."""
    ref = weakref.ref(comm)

    def number() -> int | None:
        c = ref()
        return None if c is None else c.call_log.in_progress()
    return number


def _still_posted(run: Any) -> bool:
    """Whether MPI may still use a held run's buffers (a request not complete)."""
    for r in run.reqs:
        try:
            if r != MPI.REQUEST_NULL and not r.Test():
                return True
        except MPI.Exception:
            pass
    return False


class Communicator:
    """bmlmpi's collectives over an MPI communicator: the allreduce and the rest of the family
    (reduce-scatter, allgather, reduce, broadcast, all-to-all; run by :class:`bmlmpi.family.
    FamilyEngine`), blocking, non-blocking (``I…``) and persistent (``…_init``,
    :mod:`bmlmpi.persistent`).

    ``algorithm``: one of :func:`bmlmpi.algorithms` (``auto`` by default; ``BMLMPI_ALGORITHM``
    overrides auto). ``topology``: the BCube shape for bml (``"3x3"``, ``(2, 2, 3)``); default
    ``BMLMPI_BCUBE`` or the prime factorisation of the size. ``timeout``: seconds a wait may go
    without progress before it raises (``BMLMPI_TIMEOUT``, default 120). ``validate``: check on
    the first call of each signature that all ranks agree (``BMLMPI_VALIDATE``, default on).
    ``policy``: what differs under failures (:class:`bmlmpi.call_policy.CallPolicy`), for a
    variant to build the base with its own (``fault_tolerant=True`` builds the fault-tolerant
    communicator, whose policy is :class:`bmlmpi.ft.policy.FaultTolerantPolicy`); None: the
    plain policy. ``reproducible``: float SUM and AVG allreduces, reduce-scatters and reduces
    return bits that depend on the multiset of addends alone (``BMLMPI_REPRODUCIBLE``,
    default off; an allreduce's own ``reproducible=`` overrides it; docs/reproducible.md):
    such a call takes the checked path each time.

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
    #: variant's module: :mod:`bmlmpi.variants` (``bmlmpi.Communicator``) loads them. A
    #: variant differs in the policy it builds the base with (``policy=``,
    #: :class:`bmlmpi.call_policy.CallPolicy`) and the public methods it adds.
    _variants: dict[str, type[Communicator]] = {}

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
                 check: str | None = None, policy: CallPolicy | None = None,
                 reproducible: bool | None = None):
        if comm == MPI.COMM_NULL:
            raise ValueError("cannot build a bmlmpi.Communicator on MPI.COMM_NULL")
        remove_singleton_leftovers()
        #: What differs under failures (:mod:`bmlmpi.call_policy`): the plain policy unless a
        #: variant builds the base with its own.
        self.policy = policy = CallPolicy() if policy is None else policy
        policy.attach(self)
        # Arguments are checked locally, then agreed: a rank whose arguments fail still
        # joins the construction's collectives, so every rank raises at once (the others
        # RemoteArgumentError naming it) instead of waiting out a deadline, and ranks that
        # name different shapes fail before any Split (which has no deadline) is made.
        error: Exception | None = None
        #: Whether reducing calls are reproducible unless a call says otherwise
        #: (:mod:`bmlmpi.call_formats`).
        self.reproducible = bool(config.get("BMLMPI_REPRODUCIBLE") if reproducible is None
                                 else reproducible)
        self.timeout = config.get("BMLMPI_TIMEOUT")
        self.shape: Shape = ()
        try:
            self.timeout = timeout_from_env(timeout)
            self.algorithm = selection.check_algorithm(algorithm)
            self.validate = _validation_enabled(validate)
            self.check = "every-call" if policy.agrees_every_call else _check_mode(check)
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
        self._token = agree_construction(
            self._comm, error,
            () if error else (self.shape, self.algorithm, self.check, self.validate),
            self.timeout)
        # the control channel (bmlmpi.agreement): agreements and notices, never data
        self._control = policy.control_channel(self._comm)
        mailbox = (Mailbox(self._control, self._token) if self._control is not self._comm
                   else None)
        # the thread inside a call; call numbers and tag slots (their one owner)
        self._gate = CallGate()
        self._numbers = CallNumbers(tag_upper_bound(self._comm))
        # the started calls (the fast paths read it to know whether any is outstanding)
        self._active: list[Outstanding] = []
        self._agreement = CallAgreement(self, self._numbers, mailbox, self._active)
        agreement = self._agreement
        self._levels = policy.levels(self._comm, self.shape, self.rank)
        numbers = self._numbers
        self._placement = Placement(self, lambda: agreement.interrupt(numbers.callno)())
        self._links = self._placement.find_links()
        # auto's prices: taken at the first auto call that needs them, never here
        self._tuning = AutoTuning(self)
        self._cache = PlanCache(self, self._placement, policy)
        self._tuning.at_construction()
        self._compression = CompressionChannel(self)
        # the started calls, polled inside any request's Test/Wait
        self._calls_in_flight = Progress(self, self._gate, self._active, agreement)
        # the blocking fast path (see the class docstring); not for a policy that keeps every
        # call itself (the fault-tolerant one)
        plain = not policy.keeps_calls
        native_fast = config.get("BMLMPI_BLOCKING") == "watchdog" and self.check == "first-call"
        capacity = recorder_capacity()
        self._recorder = (FlightRecorder(capacity, self.rank, self.size, type(self).__name__,
                                         self.timeout, world_members(self._comm),
                                         comm.Get_name()) if capacity else None)
        if self._recorder is not None:
            from .timeline import attach
            attach(self._recorder)
        #: What the pipeline's parts write to the flight recorder (:mod:`bmlmpi.call_log`).
        self.call_log = CallLog(self._recorder)
        self._watchdog = Watchdog(self.timeout, mpi_abort(self._comm),
                                  source=("timeout=" if timeout is not None else "BMLMPI_TIMEOUT="),
                                  alarm=agreement.alarm_channel(),
                                  before_abort=_weakly(self.call_log.watchdog_fired),
                                  number=_weakly_number(self))
        # a Communicator dropped without Free() is no longer watched (the watchdog holds it
        # only weakly, above; the process's watchdog thread ends with the last one watched)
        weakref.finalize(self, self._watchdog.close)
        self._fast_path = FastPath(
            self, self._comm, agreement, self._numbers, self._gate, self._cache, self._active,
            self._recorder, self._watchdog, enabled=plain, native=native_fast)
        self._persistent_calls = PersistentCalls(self, self._cache, self._gate, self._numbers,
                                                 agreement, plain=plain)
        self.family = FamilyEngine(self, agreement, self._gate, self._fast_path)

    # -- the defaults of calls that name none ---------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The algorithm of a call that names none (``"auto"`` unless the constructor said
        otherwise). Assigning it applies from the next call: the blocking fast path forgets
        the signatures that took the old one (:meth:`FastPath.forget_defaults`)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, name: str) -> None:
        self._algorithm = name
        _defaults_changed(self)

    @property
    def reproducible(self) -> bool:
        """Whether a reducing call that does not say is reproducible
        (:mod:`bmlmpi.call_formats`); assignable, as :attr:`algorithm` is."""
        return self._reproducible

    @reproducible.setter
    def reproducible(self, value: bool) -> None:
        self._reproducible = bool(value)
        _defaults_changed(self)

    # -- the control channel and its repair (bmlmpi.call_agreement calls these) --------------
    @property
    def control(self) -> MPI.Comm:
        """The communicator agreements and notices travel on now (the policy's
        :meth:`~bmlmpi.call_policy.CallPolicy.control_channel`; a fault-tolerant one's changes
        with its members)."""
        return self._control

    def abandon_calls(self, seq: int, exc: BaseException) -> None:
        """Calls numbered ``seq`` or later fail with ``exc``; the fast paths stay shut until
        the repair (:meth:`bmlmpi.call_agreement.CallAgreement.abandon_from`)."""
        self._fast_path.forget_last()
        self._calls_in_flight.abandon_from(seq, exc)

    def move_to(self, new: MPI.Comm) -> None:
        """A repair's fresh duplicate becomes the data communicator
        (:meth:`bmlmpi.call_agreement.CallAgreement.repair`); the old one and its levels are
        held (MPI may still hold abandoned calls' messages on them)."""
        self._agreement.held.append((self._comm, self._levels))
        self._comm = new
        self._levels = self.policy.levels(new, self.shape, self.rank)
        self._cache.clear()
        self._fast_path.rebind(new)

    # -- properties -----------------------------------------------------------------------
    @property
    def comm(self) -> MPI.Comm:
        """The private communicator bmlmpi sends on (a duplicate of the user's)."""
        return self._comm

    @property
    def tag_slots(self) -> int:
        """How many calls of one signature may be in flight with tags of their own; a call
        beyond that posts nothing until the call whose tags it reuses completes."""
        return self._numbers.call_slots

    @property
    def plans(self) -> PlanCache:
        """This communicator's plans, schedules and ``auto``'s choices, per signature
        (:class:`bmlmpi.plans.PlanCache`)."""
        return self._cache

    @property
    def calibration(self) -> Calibration | None:
        """The calibration ``auto`` prices with: None until the first blocking ``auto`` call
        that needs one has taken it (read from the cache or measured; refused where it
        cannot be true), and on a communicator whose calls name their algorithms
        (:mod:`bmlmpi.auto_tuning`). Assigning one makes ``auto`` price with it as given."""
        return self._tuning.calibration

    @calibration.setter
    def calibration(self, calib: Calibration | None) -> None:
        self._tuning.give(calib)

    @property
    def tuning(self) -> AutoTuning:
        """``auto``'s part of this communicator: its prices (:class:`bmlmpi.auto_tuning.
        AutoTuning`)."""
        return self._tuning

    @property
    def placement(self) -> Placement:
        """Where this communicator's ranks are: nodes, node tier, link matrix source
        (:class:`bmlmpi.placement.Placement`)."""
        return self._placement

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
                                       else Path(directory), announce=False, counted=False))

    def Free(self) -> None:
        """Free bmlmpi's communicators, the compression channel's duplicate included.
        Refused (RuntimeError, nothing freed) while a started allreduce of this communicator
        has not completed: MPI would still write its buffers. A communicator on which MPI may
        still hold a call given up at a deadline or after another rank's error is left to MPI
        (not freed: freeing it under a pending collective crashes some MPI libraries); so is
        the compression channel's duplicate while a compressed call is unfinished or after
        one failed (:meth:`bmlmpi.compression.channel.CompressionChannel.free`).

        Every later call on it raises :class:`bmlmpi.CommunicatorFreed` on the rank that
        makes it, before anything is sent: every public method, blocking, ``I…`` and
        ``…_init``, ``Start`` of a persistent request made before, ``explain``. A second
        ``Free()`` does nothing. Like any call, ``Free()`` from a second thread while
        another is inside a call raises ``RuntimeError`` and frees nothing."""
        gate = self._gate
        if gate.freed:
            return
        mine = gate.claim(self.rank)
        try:
            if self._active:
                raise RuntimeError(f"bmlmpi.Communicator.Free(): {len(self._active)} call(s) "
                                   f"started on it have not completed; Wait() on their "
                                   f"requests first")
            self._gate.freed = True
            self._tuning.save()
            self._watchdog.stop()
            self._fast_path.close()
            self._placement.free(collective=self._agreement.revoked is None)
            mailbox, held_runs = self._agreement.mailbox, self._agreement.held
            if mailbox is not None:
                mailbox.close()
            held = any(isinstance(h, tuple) for h in held_runs)
            pending = bool(held_runs) and not all(
                isinstance(h, tuple) or not _still_posted(h) for h in held_runs)
            for c in [*self._levels, self._comm]:
                if c != MPI.COMM_NULL and not pending:
                    drain(c)
                    c.Free()
            if self._control is not self._comm and self._control != MPI.COMM_NULL:
                self._control.Free()
            self._compression.free()
            if not held:
                held_runs.clear()
            self._levels = []
            self._cache.clear()
        finally:
            gate.release(mine)

    # -- public calls ---------------------------------------------------------------------
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                  algorithm: str | None = None, compression: Any = None,
                  reproducible: bool | None = None) -> None:
        """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (``sendbuf`` may be IN_PLACE).
        ``algorithm``: this call's (None: the communicator's); ``compression``: a
        :mod:`bmlmpi.compression` compressor or spec (``"fp16"``), which chooses its own path;
        ``reproducible``: this call's mode (None: the communicator's; docs/reproducible.md).

        After a signature's first call, a native one goes straight to ``MPI_Allreduce``,
        bounded by the watchdog, and a scheduled one runs its cached plan directly, under the
        executor's deadline (class docstring). The module-level drop-in
        (:func:`bmlmpi.dropin.Allreduce`) is this call."""
        # a repeat of the last plain signature that took the fast path: no more than that
        # (a change of the communicator's mode forgets it)
        if (compression is None
                and self._fast_path.repeat(sendbuf, recvbuf, op, algorithm, reproducible)):
            return
        if compression is not None:
            self.Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm,
                            compression=compression, reproducible=reproducible).Wait()
            return
        asked = algorithm
        # (the communicator's own algorithm and mode, the commonest, without a call frame)
        algorithm = self._algorithm if algorithm is None else _named(self, algorithm)
        # the fast path when the signature may take it (FastPath.allreduce; a reproducible
        # call's: FastPath.carried), else the checked path, started and waited on, which then
        # opens the signature's entry there
        gate = self._gate
        mine = gate.claim(self.rank)
        try:
            agreement = self._agreement
            if agreement.repair_after is not None:
                agreement.repair()  # (collective: every rank's first call after the error)
            carry = (None if reproducible is None and not self._reproducible
                     else _carry(self, reproducible))  # (the commonest without a call frame)
            fast = self._fast_path
            tuning = self._tuning
            sig = None
            if carry is None:
                if fast.allreduce(sendbuf, recvbuf, op, algorithm, asked, reproducible):
                    return
                # an exploring auto signature's call: its candidate's entry, timed
                sig = fast_key("Allreduce", algorithm, (sendbuf, recvbuf), op)
                if sig is not None and tuning.explore_fast(sig, (sendbuf, recvbuf, op), fast):
                    return
            elif fast.carried(sendbuf, recvbuf, op, algorithm):
                return
            if not self.policy.keeps_calls:
                # the checked path's agreement polls no other call: runs of schedules this
                # rank started before (which every rank started before this call) are
                # completed first (docs/api.md, "Blocking calls")
                self._calls_in_flight.settle()
            call = _prepare_checked(self, sendbuf, recvbuf, op, algorithm, carry)
            timing = tuning.explore(call, sig)
            if call.wire is not None:
                # a carried signature explores its own candidates (AutoTuning.key) before
                # its fast-path entry opens
                call.wire.blocking = True
                self.policy.submit(call).Wait()
                if tuning.after_call(call, timing):
                    fast.open(fast_key("Allreduce", algorithm, (sendbuf, recvbuf), op,
                                       CARRIED), call, (sendbuf, recvbuf, op), carried=True)
                return
            # (a plain call, or a reproducible one whose values pass through: integers,
            # MIN, MAX); an exploring one opens its candidate's entry
            key, args = fast_key("Allreduce", algorithm, (sendbuf, recvbuf), op), (sendbuf,
                                                                                 recvbuf, op)
            opened = key if timing.opens else tuning.candidate_sig(sig, timing)
            if fast.blocking_native(call, opened, args):
                tuning.after_call(call, timing)
                return
            self.policy.submit(call).Wait()
            if tuning.after_call(call, timing) or opened is not key:
                fast.open(opened, call, args)
        finally:
            if mine:
                gate.owner = None


    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                   algorithm: str | None = None, compression: Any = None,
                   reproducible: bool | None = None) -> Request:
        """Start an allreduce; it progresses inside ``Test``/``Wait`` of the returned request.
        ``algorithm``, ``compression`` and ``reproducible`` as for :meth:`Allreduce`; a
        reproducible call's start waits for every rank's (its block exponents' MAX)."""
        if compression is not None:   # the compression layer wraps this same call path
            gate = self._gate
            mine = gate.claim(self.rank)
            try:
                if algorithm is not None:
                    self._agreement.refuse(ValueError("algorithm= and compression= together: "
                                                      "a compressed call chooses its own path"))
                if _carry(self, reproducible) is not None:
                    self._agreement.refuse(call_formats.ReproducibleRefused(
                        "compression= in reproducible mode: a compressor rounds each rank's "
                        "values, so no exact sum is left to reproduce (reproducible=False)"))
                return self._compression.start(sendbuf, recvbuf, op, compression)
            finally:
                gate.release(mine)
        algorithm = _named(self, algorithm)
        self.policy.check_usable()
        mine = self._gate.claim(self.rank)
        try:
            return self.policy.submit(_prepare_checked(self, sendbuf, recvbuf, op,
                                                                 algorithm,
                                                                 _carry(self, reproducible)))
        finally:
            if mine:
                self._gate.owner = None

    # -- the compression seam (bmlmpi.compression) ---------------------------------------------
    @property
    def compression(self) -> CompressionChannel:
        """This communicator's compression state: the private duplicate its compressed calls
        send on, their tag blocks and plans, the measured α-β price, and ``start()`` of a
        compressed allreduce with a chosen error-feedback key
        (:class:`bmlmpi.compression.channel.CompressionChannel`)."""
        return self._compression

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
    # One engine for both communicators. What differs under failures is the policy's
    # (bmlmpi.call_policy): how a started call is tracked, how a schedule is bound, what an
    # MPI error means.
    def agree_compressed(self, recvbuf: Any, op: Any, compression: str) -> None:
        """A compressed allreduce's place among this communicator's calls (called by
        :func:`bmlmpi.compression.layer.start` before its first collective): numbered as
        every call, and the first call of each signature agreed on like any other, the
        compressor's settings (``compression``) in the signature. A rank that compresses
        where the others run the plain call, or compresses otherwise, makes that first call
        raise :class:`ArgumentMismatch` on every rank at once (docs/contracts.md). The
        fault-tolerant communicator agrees inside the compressed call itself."""
        if self._agreement.mailbox is None:
            return
        self._agreement.begin_call()
        count = dtype = name = None
        if isinstance(recvbuf, np.ndarray):
            count, dtype = int(recvbuf.size), recvbuf.dtype.str
        with contextlib.suppress(Exception):
            name = op_name(op)
        self._agreement.validate(CompressedCall(count, dtype, name, self.algorithm, compression),
                                 None)

    def check_and_launch(self, call: CollectiveCall, label: str,
                         finish: Callable[[], None] | None = None, *,
                         launch: bool = True) -> Run | NativeRun | None:
        """Agree on ``call`` across ranks (raising on every rank when it differs), then start
        its exchange (None with ``launch`` False: a rank the call skips agrees all the
        same), through the one launch (:meth:`bmlmpi.calls.CollectiveCall.launch`). What a
        policy's :meth:`~bmlmpi.call_policy.CallPolicy.track` starts a call with."""
        self._agreement.validate(call, None)
        self._tuning.launching()  # an exploring call is timed from here: its run alone
        return call.launch(self, label, finish) if launch else None

    # -- persistent calls (MPI 4): checked and compiled once, started many times -----------
    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                       algorithm: str | None = None,
                       reproducible: bool | None = None) -> PersistentRequest:
        """A persistent allreduce (``MPI_Allreduce_init``; :mod:`bmlmpi.persistent`);
        ``algorithm`` None: the communicator's; ``reproducible`` as for :meth:`Allreduce`
        (each start then waits for every rank's start: its block exponents' MAX)."""
        gate = self._gate
        mine = gate.claim(self.rank)  # one call at a time: a second thread raises here
        try:
            self.policy.check_usable()
            algorithm = (self.algorithm if algorithm is None
                         else selection.check_algorithm(algorithm))
            if buffers.is_device_array(recvbuf if not isinstance(recvbuf, (list, tuple))
                                       else recvbuf[0] if recvbuf else None):
                raise BufferSpecError("Allreduce_init takes host buffers (a persistent request "
                                      "cannot stage device memory at every start)")
            return self._persistent_calls.make(self._agreement.prepared(
                prepare_allreduce, self.rank, self.size, sendbuf, recvbuf, op, algorithm,
                self._cache.auto_for, _carry(self, reproducible)))
        finally:
            gate.release(mine)

    # -- the rest of the family (bmlmpi.family): reduce-scatter, allgather, reduce, bcast ----
    # Blocking, non-blocking (I…: a Request) and persistent (…_init: a PersistentRequest)
    # forms with mpi4py's positional arguments; ``algorithm`` (keyword-only): one of
    # ``bmlmpi.algorithms(collective)``, None the communicator's own when it serves the
    # collective, else ``auto``. Each hands its call's builder to the family's engine; a
    # blocking call whose signature ran before takes its fast path (FastPath.family).
    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                             algorithm: str | None = None,
                             reproducible: bool | None = None) -> None:
        """Reduce ``size`` equal blocks over all ranks; rank r receives block r.
        ``reproducible``: this call's mode, as for :meth:`Allreduce` (the reducing methods
        below take it too)."""
        args = (sendbuf, recvbuf, op)
        carry = (None if reproducible is None and not self._reproducible
                 else _carry(self, reproducible))  # (the commonest without a call frame)
        key = self._fast_path.family("Reduce_scatter_block", algorithm, (sendbuf, recvbuf), op,
                                     () if carry is None else _in_key(carry), args)
        if key is not DONE:
            self.family.blocking("reduce_scatter", algorithm,
                                 scatter_blocks(self, sendbuf, recvbuf, op, carry), key, args)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                              algorithm: str | None = None,
                              reproducible: bool | None = None) -> Request:
        return self.family.start("reduce_scatter", algorithm,
                                 scatter_blocks(self, sendbuf, recvbuf, op,
                                                _carry(self, reproducible)))

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                                  algorithm: str | None = None,
                                  reproducible: bool | None = None) -> PersistentRequest:
        return self.family.init("reduce_scatter", algorithm,
                                scatter_blocks(self, sendbuf, recvbuf, op,
                                               _carry(self, reproducible)))

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                       op: Any = MPI.SUM, *, algorithm: str | None = None,
                       reproducible: bool | None = None) -> None:
        """Reduce blocks of ``recvcounts[r]`` elements over all ranks; rank r receives
        block r (``recvcounts`` None: every rank's ``recvbuf`` count, gathered first)."""
        family, key = self.family, None
        carry = (None if reproducible is None and not self._reproducible
                 else _carry(self, reproducible))  # (the commonest without a call frame)
        if isinstance(recvcounts, (list, tuple)):
            key = self._fast_path.family("Reduce_scatter", algorithm, (sendbuf, recvbuf), op,
                                         (tuple(recvcounts), *_in_key(carry)),
                                         (sendbuf, recvbuf, recvcounts, op))
            if key is DONE:
                return
        recvcounts = family.reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        family.blocking("reduce_scatter", algorithm,
                        scatter(self, sendbuf, recvbuf, recvcounts, op, carry), key,
                        (sendbuf, recvbuf, recvcounts, op))

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                        op: Any = MPI.SUM, *, algorithm: str | None = None,
                        reproducible: bool | None = None) -> Request:
        recvcounts = self.family.reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        return self.family.start("reduce_scatter", algorithm,
                                 scatter(self, sendbuf, recvbuf, recvcounts, op,
                                         _carry(self, reproducible)))

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                            op: Any = MPI.SUM, *, algorithm: str | None = None,
                            reproducible: bool | None = None) -> PersistentRequest:
        recvcounts = self.family.reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        return self.family.init("reduce_scatter", algorithm,
                                scatter(self, sendbuf, recvbuf, recvcounts, op,
                                        _carry(self, reproducible)))

    def Allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Gather every rank's ``sendbuf`` into slot r of every rank's ``recvbuf``."""
        args = (sendbuf, recvbuf)
        key = self._fast_path.family("Allgather", algorithm, args, MPI.SUM, (), args)
        if key is not DONE:
            self.family.blocking("allgather", algorithm, gather(self, sendbuf, recvbuf, False),
                                 key, args)

    def Iallgather(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request:
        return self.family.start("allgather", algorithm, gather(self, sendbuf, recvbuf, False))

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, *,
                       algorithm: str | None = None) -> PersistentRequest:
        return self.family.init("allgather", algorithm, gather(self, sendbuf, recvbuf, False))

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Allgather with per-rank counts and displacements (``recvbuf`` as mpi4py's)."""
        self.family.blocking("allgather", algorithm, gather(self, sendbuf, recvbuf, True))

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any, *,
                    algorithm: str | None = None) -> Request:
        return self.family.start("allgather", algorithm, gather(self, sendbuf, recvbuf, True))

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, *,
                        algorithm: str | None = None) -> PersistentRequest:
        return self.family.init("allgather", algorithm, gather(self, sendbuf, recvbuf, True))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
               algorithm: str | None = None, reproducible: bool | None = None) -> None:
        """Reduce every rank's ``sendbuf`` into the root's ``recvbuf``."""
        args = (sendbuf, recvbuf, op, root)
        carry = (None if reproducible is None and not self._reproducible
                 else _carry(self, reproducible))  # (the commonest without a call frame)
        key = self._fast_path.family("Reduce", algorithm, (sendbuf, recvbuf), op,
                                     (root,) if carry is None else (root, *_in_key(carry)), args)
        if key is not DONE:
            self.family.blocking("reduce", algorithm,
                                 reduce_to(self, sendbuf, recvbuf, op, root, carry), key, args)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
                algorithm: str | None = None, reproducible: bool | None = None) -> Request:
        return self.family.start("reduce", algorithm,
                                 reduce_to(self, sendbuf, recvbuf, op, root,
                                           _carry(self, reproducible)))

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
                    algorithm: str | None = None,
                    reproducible: bool | None = None) -> PersistentRequest:
        return self.family.init("reduce", algorithm,
                                reduce_to(self, sendbuf, recvbuf, op, root,
                                          _carry(self, reproducible)))

    def Bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Copy the root's ``buf`` into every rank's ``buf``."""
        args = (buf, root)
        key = self._fast_path.family("Bcast", algorithm, (buf,), MPI.SUM, (root,), args)
        if key is not DONE:
            self.family.blocking("bcast", algorithm, broadcast(self, buf, root), key, args)

    def Ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        return self.family.start("bcast", algorithm, broadcast(self, buf, root))

    def Bcast_init(self, buf: Any, root: int = 0, *,
                   algorithm: str | None = None) -> PersistentRequest:
        return self.family.init("bcast", algorithm, broadcast(self, buf, root))

    # -- all-to-all: block j of every rank's sendbuf to rank j (bmlmpi.family) -----------------
    def Alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Send block j of ``sendbuf`` to rank j; block i of ``recvbuf`` comes from rank i
        (each buffer ``size`` equal blocks; ``sendbuf`` may be ``MPI.IN_PLACE``)."""
        args = (sendbuf, recvbuf)
        key = self._fast_path.family("Alltoall", algorithm, args, MPI.SUM, (), args)
        if key is not DONE:
            self.family.blocking("alltoall", algorithm, exchange(self, sendbuf, recvbuf), key,
                                 args)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  algorithm: str | None = None) -> Request:
        return self.family.start("alltoall", algorithm, exchange(self, sendbuf, recvbuf))

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, *,
                      algorithm: str | None = None) -> PersistentRequest:
        return self.family.init("alltoall", algorithm, exchange(self, sendbuf, recvbuf))

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """All-to-all with per-pair counts and displacements (each buffer as mpi4py's
        ``[buf, counts, displs, datatype]``): every rank's counts are gathered first (a
        repeated set of counts: their digest agreed), then a signature whose specs and pair
        counts ran before takes its fast path."""
        vector = alltoallv_key(sendbuf, recvbuf)
        table, frame = alltoallv_counts(self, sendbuf, recvbuf, vector)
        key, args = None, (sendbuf, recvbuf)
        # (frame None: the plain policy, whose pair tables give the agreed table's digest)
        digest = (self.policy.pair_tables.digest if vector is not None and frame is None
                  else None)
        if digest is not None:
            args, rest = vector
            key = self._fast_path.family("Alltoallv", algorithm, args, MPI.SUM,
                                         (*rest, digest), args)
            if key is DONE:
                return
        self.family.blocking("alltoall", algorithm, exchange(self, sendbuf, recvbuf, table),
                             key, args, frame=frame)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any, *,
                   algorithm: str | None = None) -> Request:
        table, frame = alltoallv_counts(self, sendbuf, recvbuf)
        return self.family.start("alltoall", algorithm, exchange(self, sendbuf, recvbuf, table),
                                 frame)

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, *,
                       algorithm: str | None = None) -> PersistentRequest:
        table, frame = alltoallv_counts(self, sendbuf, recvbuf)
        return self.family.init("alltoall", algorithm, exchange(self, sendbuf, recvbuf, table),
                                frame)

    def adopt_comm(self, comm: MPI.Comm, keep: Sequence[int], shape: Shape) -> None:
        """After the members changed (a fault-tolerant shrink or mask): ``comm`` becomes the
        data communicator, ``keep`` the old ranks of its members in their new order, ``shape``
        its BCube shape. The link weights keep those rows and columns (placement did not
        change); a control channel that was the data communicator follows it; cached plans,
        ``auto`` choices and agreed signatures are forgotten. How a policy without level
        communicators replaces the communicator (:mod:`bmlmpi.ft.policy`)."""
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
        self._cache.forget()
        self._agreement.validated.clear()

    @property
    def call_numbers(self) -> CallNumbers:
        """This communicator's call numbers and tag slots (:class:`bmlmpi.call_numbers.
        CallNumbers`, their one owner): the survivors of a failure continue from the largest
        launch count among them (:meth:`~bmlmpi.call_numbers.CallNumbers.agree_tags`)."""
        return self._numbers

    @property
    def calls_in_flight(self) -> Progress:
        """The started calls the plain policy tracks (:class:`bmlmpi.progress.Progress`),
        polled inside any request's ``Test``/``Wait``."""
        return self._calls_in_flight

    @property
    def persistent_calls(self) -> PersistentCalls:
        """This communicator's persistent calls (:class:`bmlmpi.persistent.PersistentCalls`):
        made, agreed and compiled at ``…_init``, started at each ``Start``."""
        return self._persistent_calls



    def explain(self, count: int, dtype: Any, op: Any = MPI.SUM,
                collective: str = "allreduce", *,
                reproducible: bool | None = None) -> selection.Explanation:
        """What ``Allreduce`` of ``count`` elements of ``dtype`` with ``op`` runs on this
        communicator, and why: the candidates ``auto`` priced (predicted seconds: the cost
        model with this machine's calibration, and the model before the calibration's
        measured correction), the one chosen and the rule that chose it
        (:class:`bmlmpi.selection.Explanation`; ``str()`` of it is a small table). Local: no
        communication; every rank reaches the same answer. A communicator built with a named
        algorithm explains that it runs it. ``collective``: also ``reduce_scatter``,
        ``allgather``, ``reduce``, ``bcast`` or ``alltoall``, ``count`` then being the
        elements of all ranks' blocks together (an all-to-all's: every rank's whole send
        buffer; what their ``auto`` runs: :func:`bmlmpi.selection.explain_collective`).
        ``reproducible``: the mode of the call explained, as for :meth:`Allreduce` (None: the
        communicator's); a reducing call it carries (float SUM and AVG) is a signature of
        its own, priced on the int64 words it carries: the explanation's ``count`` and
        ``itemsize`` are the words' (a float32 value one word of 8 bytes, a float64 value
        two), and its ``tuning`` that signature's exploration (docs/reproducible.md)."""
        self._gate.refuse_freed(self.rank)
        if collective not in ("allreduce", *COLLECTIVES):
            raise ValueError(f"explain: unknown collective {collective!r}; one of allreduce, "
                             f"{', '.join(COLLECTIVES)}")
        if count < 0:
            raise ValueError(f"explain: count must be >= 0, got {count}")
        dt = np.dtype(dtype)
        wire = None
        if collective in ("allreduce", *REDUCING):
            check_dtype_op(dt, op_name(op))
            carry = _carry(self, reproducible)
            wire = None if carry is None else carry.carrier(dt, op_name(op))
        asked = (self.algorithm if collective == "allreduce"
                 else self.family.algorithm_for(collective, None))
        if asked != "auto":
            return selection.Explanation(collective, int(count), dt.itemsize, self.size,
                                         asked, "asked", f"the communicator was built with "
                                                         f"algorithm={self.algorithm!r}")
        blocked = collective in ("reduce_scatter", "allgather") and count % self.size == 0
        priced, itemsize = self._cache.carried_prices(int(count), dt, wire)
        why = self._cache.explain(collective, priced, itemsize, 0,
                                  (priced // self.size,) * self.size if blocked else None)
        tuning = self._tuning
        return tuning.explained(tuning.key(collective, int(count), dt, op_name(op), 0, wire),
                                why)

    def nodes(self):
        """Which ranks share a node (:class:`bmlmpi.topology.nodes.Nodes`):
        ``BMLMPI_RANKS_PER_NODE`` consecutive ranks when set at construction, else MPI
        placement."""
        return self._placement.nodes()

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
