"""Failure-aware allreduce: the survivors finish the call and carry on (ULFM).

``bmlmpi.Communicator(comm, fault_tolerant=True)`` builds a :class:`FaultTolerantCommunicator`.
When ranks die before, during or between its allreduces, every survivor's call completes with
the reduction over exactly the survivors' inputs (``AVG`` divides by their number), the same on
all of them; afterwards ``size`` and ``rank`` describe the survivors, ``failed`` lists the
original ranks lost, ``survivors`` the original ranks left, and ``on_failure(comm, lost)`` runs.

Mechanism (user-level failure mitigation, mpi4py ≥ 4 on Open MPI ≥ 5 started with
``--with-ft ulfm``, i.e. ``bmlmpi-run --ft``):

1. **Run.** An allreduce runs its schedule (or the native ``MPI_Iallreduce``) on one private
   communicator with ``ERRORS_RETURN``. Unlike the plain communicator there are no per-level
   communicators: every transfer goes over this one, so revoking and shrinking touch exactly
   one object (the schedule's ``level`` still says which BCube link a transfer stands for).
   Each call keeps what it needs to run again: the send buffer, or a copy of the input for
   ``MPI.IN_PLACE``.
2. **Detect.** A request fails with ``ERR_PROC_FAILED``/``ERR_PROC_FAILED_PENDING`` (a peer
   died) or ``ERR_REVOKED`` (another survivor noticed first). A hung peer never fails a request:
   the heartbeat (:mod:`bmlmpi.heartbeat`) fences it with SIGKILL after ``hang_timeout`` seconds
   without a beat, and ULFM then reports it. The detecting rank revokes the communicator so
   that every rank still waiting on anything stops.
3. **Agree.** A call commits on every survivor or on none: once its run has completed locally
   or failed, each rank votes (1 = completed) in ``MPI_Comm_iagree``, calls in the order they
   were started. The agreed flag is the same on every survivor even when the agreement itself
   reports a failure (Open MPI writes it; checked on the development machine), so the decision
   is uniform. A rank that dies after delivering everything a call needed from it (every
   survivor completed) counts as dying after that call: the call commits with its input, and
   the next call notices the death.
4. **Shrink and rebuild.** After a 0 vote every survivor lets the abandoned requests complete
   (with errors, the communicator being revoked), shrinks the communicator (the lost ranks are
   the old group minus the new one, the same on all), checks that all survivors committed the
   same calls, drops the cached plans (the link-weight matrix of the tree algorithms keeps the
   survivors' rows; the calibration of ``auto`` is kept), calls ``on_failure`` and starts every
   uncommitted call again over the survivors, restoring each call's input first. Failures
   during the re-run repeat the cycle (successive failures). ``MPI_Comm_ishrink`` fails with
   ``MPI_ERR_INTERN`` in Open MPI 5.0 (its libnbc schedule aborts on the revoked
   communicator), so the blocking ``MPI_Comm_shrink`` runs in a helper thread (the MPI library
   runs with ``MPI_THREAD_MULTIPLE``, mpi4py's default) while the caller waits on it against
   the deadline; without thread support it runs directly, hung peers still fenced by the
   heartbeat thread. The agreement uses ``MPI_Comm_iagree``, which works.

Re-partitioning (which schedule the survivors run, :mod:`bmlmpi.schedules.recovery`):

* ``recovery="fresh"`` — the survivors run the requested algorithm (bml, ring, tree, native …)
  as if the communicator had been built over them: bml on a fresh mixed-radix BCube of the
  default factorisation of N−x, k·(N−x) pieces. Right for a flat network (shared memory, a
  Fat-Tree), and the default when no BCube shape was given.
* ``recovery="bcube"`` — bml keeps the original BCube addresses and routes around the dead
  servers with auxiliary multi-hop steps (seed 001), so a server only ever talks to a server one
  switch away. The default when the user gave a BCube shape (``topology=`` or
  ``BMLMPI_BCUBE``). When the planner finds no such schedule (or the cube exceeds
  ``MAX_PLANNED_SERVERS``) the fresh schedule is used instead. Other algorithms always run
  fresh.

Non-blocking calls (``Iallreduce``) work as on the plain communicator; a ``Test`` or ``Wait``
that meets a failure performs the recovery (a collective over the survivors) before returning.
``on_failure`` runs inside it and must not start allreduces on this communicator.

Deadlines: every wait of this communicator polls non-blocking requests against ``timeout``
(``BMLMPI_TIMEOUT``) seconds without progress and raises :class:`bmlmpi.DeadlineExceeded`
(after which the communicator should not be used again);
``hang_timeout`` (``BMLMPI_HANG_TIMEOUT``, default 30 s) is the heartbeat age that gets a peer
fenced, ``heartbeat`` (``BMLMPI_HEARTBEAT``) the beat period. Fencing reaches ranks on this
rank's host only (SIGKILL); a hung rank on another host surfaces at the deadline — fencing
across hosts needs the launcher (:mod:`bmlmpi.heartbeat`).

Without ULFM: on Open MPI started without ``--with-ft ulfm`` (it is then off: the environment
lacks ``OMPI_MCA_mpi_ft_enable``) or on an MPI whose ``MPI_Comm_is_revoked`` is missing (the
MPICH wheel), construction raises :class:`FaultToleranceUnavailable`. ``BMLMPI_ULFM=1`` skips
the check (an Open MPI whose parameter file enables ULFM); where support cannot be told, waits
end at the deadline.

Link failures: :meth:`FaultTolerantCommunicator.mask_link` masks one end server of a failed link
(seed 001: treat a link failure as a server failure); the masked rank stops taking part and is
reported in ``failed`` like a dead one.

Process exit: Open MPI's runtime never reports a rank that exits with a non-zero status or an
uncaught Python exception (the others would wait for it forever), and ``MPI_Finalize`` after a
failure sometimes hangs. :func:`install_exit_handlers` turns an uncaught exception into SIGKILL
(which ULFM reports) and ends the process with a bounded barrier among the survivors followed
by ``os._exit``; :func:`finish` does the latter explicitly. A rank that still exits non-zero
without them is noticed by the heartbeat (its process is gone but MPI never said so) and the
survivors raise :class:`FaultToleranceError` instead of hanging.

Mini-batch rescaling after failures: :func:`bmlmpi.rescaled_batch` (:mod:`bmlmpi.rescale`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from . import kernels, registry
from .api import ArgumentMismatch, Communicator, RemoteArgumentError, Request, _NativeRun
from .execute import TAG_STEPS, DeadlineExceeded, Plan, Run, wait_for
from .heartbeat import Heartbeat
from .ops import mpi_op
from .schedules.recovery import (
    MAX_PLANNED_SERVERS,
    RecoveryError,
    bcube_recovery_schedule,
    fresh_shape,
)

DEFAULT_HANG_TIMEOUT = 30.0
RECOVERY_MODES = ("auto", "fresh", "bcube")


class FaultToleranceUnavailable(RuntimeError):
    """The MPI library (or the way it was launched) offers no failure mitigation (ULFM)."""


class FaultToleranceError(RuntimeError):
    """A failure the survivors cannot recover from (e.g. a rank gone without MPI noticing)."""


class RankMasked(RuntimeError):
    """This rank was masked out of the fault-tolerant communicator (see ``mask_link``)."""


def _failure_classes() -> frozenset[int]:
    return frozenset(getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                               "ERR_REVOKED") if hasattr(MPI, n))


FAILURE_CLASSES = _failure_classes()


def is_failure(exc: BaseException, comm: MPI.Comm | None = None) -> bool:
    """True for the MPI errors that mean a process failed or the communicator was revoked.

    ``MPI_Testall`` reports a failed request as ``MPI_ERR_IN_STATUS``; with ``comm`` given,
    that counts as a failure when ``comm`` is revoked or has failed processes (ULFM reports
    a request's process failure there too)."""
    if not isinstance(exc, MPI.Exception):
        return False
    cls = exc.Get_error_class()
    if cls in FAILURE_CLASSES:
        return True
    # Open MPI's non-blocking collectives (libnbc) abort their schedule on a peer's failure and
    # report MPI_ERR_OTHER (or MPI_ERR_INTERN); the failure itself may reach this rank's view a
    # few ms later (5-50 ms here), so look at the communicator for up to a second.
    if cls in (MPI.ERR_IN_STATUS, MPI.ERR_OTHER, MPI.ERR_INTERN) and comm is not None \
            and comm != MPI.COMM_NULL:
        until = time.monotonic() + (1.0 if cls != MPI.ERR_IN_STATUS else 0.0)
        while True:
            try:
                if comm.Is_revoked() or comm.Get_failed().Get_size() > 0:
                    return True
            except (MPI.Exception, NotImplementedError):
                return False
            if time.monotonic() >= until:
                return False
            time.sleep(0.005)
    return False


def ulfm_support(comm: MPI.Comm) -> tuple[bool | None, str]:
    """(True/False/None = cannot tell, why) for user-level failure mitigation on ``comm``."""
    if os.environ.get("BMLMPI_ULFM", "").strip().lower() in ("1", "true", "yes", "on"):
        return True, "BMLMPI_ULFM is set"
    library = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    if "Open MPI" in library:
        enabled = os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower()
        if enabled in ("1", "true", "yes", "on", "enabled"):
            return True, f"{library} with ULFM enabled"
        return False, (f"{library} was started without user-level failure mitigation: launch "
                       f"with `bmlmpi-run --ft ...` (mpiexec --with-ft ulfm)")
    try:
        comm.Is_revoked()
    except NotImplementedError:
        return False, f"{library} has no user-level failure mitigation (ULFM)"
    except MPI.Exception as exc:
        return False, f"{library}: MPI_Comm_is_revoked failed ({exc.Get_error_string()})"
    return None, f"cannot tell whether {library} implements ULFM"


def _env_float(name: str, value: float | None, default: float) -> float:
    if value is not None:
        return float(value)
    env = os.environ.get(name, "").strip()
    return float(env) if env else default


@dataclass
class RecoveryRecord:
    """One recovery, with wall-clock times (``time.time()``) for measurements."""

    lost: tuple[int, ...]      # original ranks
    noticed: float             # this rank saw the failure (or the 0 vote, if it saw nothing)
    agreed: float              # the vote came back 0
    shrunk: float              # the survivors' communicator exists
    size: int                  # survivors


class _Call:
    """One allreduce, tracked until every survivor has committed it."""

    def __init__(self, seq: int, algorithm: str, name: str, src: np.ndarray | None,
                 out: np.ndarray, staging: Any):
        self.seq = seq
        self.algorithm = algorithm          # as requested: "auto" is resolved per attempt
        self.name = name
        self.src = src
        self.out = out
        self.staging = staging
        self.saved = out.copy() if src is None else None  # IN_PLACE input, for a re-run
        self.run: Run | _NativeRun | None = None
        self.size = 0                       # communicator size of the current attempt
        self.ok = False                     # the current attempt completed locally
        self.vote: np.ndarray | None = None
        self.agree: MPI.Request | None = None
        self.committed = False
        self.attempts = 0


class FaultTolerantRequest(Request):
    """The handle of a fault-tolerant non-blocking allreduce (``Test``/``Wait``)."""

    def __init__(self, owner: FaultTolerantCommunicator, call: _Call):
        self._owner = owner
        self._call = call
        self._run = None
        self._done = call.committed

    def _poll(self) -> bool:
        self._done = self._call.committed
        return self._done

    def Test(self) -> bool:
        owner = self._owner
        with owner._hb.watching():
            owner._advance()
        return self._poll()

    def Wait(self) -> None:
        self._owner._wait_call(self._call)
        self._done = True

    test = Test
    wait = Wait


# Every fault-tolerant communicator not yet freed, in creation order: finish() meets the
# survivors of each. Strong references: a communicator the program dropped must still be met.
_LIVE: list[FaultTolerantCommunicator] = []


class FaultTolerantCommunicator(Communicator):
    """A :class:`bmlmpi.Communicator` whose allreduces survive the death of ranks.

    Extra arguments: ``on_failure(comm, lost)`` — called on every survivor after each recovery
    with the original ranks just lost; ``recovery`` — ``"auto"``, ``"fresh"`` or ``"bcube"``
    (module docstring); ``hang_timeout`` and ``heartbeat`` — seconds (module docstring).
    """

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, algorithm: str = "auto",
                 topology: str | Sequence[int] | None = None, fault_tolerant: bool = True, *,
                 timeout: float | None = None, validate: bool | None = None,
                 on_failure: Callable[[FaultTolerantCommunicator, tuple[int, ...]], None]
                 | None = None,
                 recovery: str = "auto", hang_timeout: float | None = None,
                 heartbeat: float | None = None):
        if recovery not in RECOVERY_MODES:
            raise ValueError(f"recovery must be one of {RECOVERY_MODES}, got {recovery!r}")
        if comm == MPI.COMM_NULL:
            raise ValueError("cannot build a bmlmpi.Communicator on MPI.COMM_NULL")
        support, why = ulfm_support(comm)
        if support is False:
            raise FaultToleranceUnavailable(f"bmlmpi.Communicator(fault_tolerant=True): {why}")
        self.ulfm = support
        explicit = topology is not None or bool(os.environ.get("BMLMPI_BCUBE", "").strip())
        try:
            super().__init__(comm, algorithm, topology, timeout=timeout, validate=validate)
        except MPI.Exception as exc:
            raise FaultToleranceError(f"bmlmpi.Communicator(fault_tolerant=True): a rank "
                                      f"failed while the communicator was being built: "
                                      f"{exc.Get_error_string()}") from exc
        self.on_failure = on_failure
        self.original_size = self.size
        self.original_rank = self.rank
        self.home_shape = self.shape
        self.recovery = "bcube" if recovery == "bcube" or (recovery == "auto" and explicit) \
            else "fresh"
        self.failed: tuple[int, ...] = ()
        self.recoveries: list[RecoveryRecord] = []
        self._members = list(range(self.size))   # original rank of each current rank
        self._pending: list[_Call] = []
        self._seq = 0
        self._committed = 0
        self._broken = False
        self._noticed: float | None = None
        self._masked = False
        self._events = 0
        hang = _env_float("BMLMPI_HANG_TIMEOUT", hang_timeout, DEFAULT_HANG_TIMEOUT)
        period = _env_float("BMLMPI_HEARTBEAT", heartbeat, min(0.25, hang / 8))
        try:
            token = self._share_token()
        except MPI.Exception as exc:
            raise FaultToleranceError(f"bmlmpi.Communicator(fault_tolerant=True): a rank "
                                      f"failed while the communicator was being built: "
                                      f"{exc.Get_error_string()}") from exc
        self._hb = Heartbeat(token, self.rank, period, hang)
        self._hb.watch(self._members)
        _LIVE.append(self)
        self._settle_construction()

    # -- construction helpers ---------------------------------------------------------------
    def _split_levels(self) -> list[MPI.Comm]:
        return []  # one communicator for every transfer (module docstring)

    def _share_token(self) -> str:
        token = np.frombuffer(os.urandom(8), dtype=np.uint8).copy()
        req = self._comm.Ibcast(token, root=0)
        wait_for(req.Test, self.timeout,
                 lambda t: f"bmlmpi fault-tolerant communicator: rank 0's token did not arrive "
                           f"within {t:g} s")
        return token.tobytes().hex()

    def _settle_construction(self) -> None:
        """End construction with an agreement, so no rank leaves the constructor before every
        rank has finished the collectives above: otherwise a rank that dies just after its
        constructor (before its first call) could take a message a slower rank still needs
        with it, and that rank would fail inside the constructor. ULFM's agreement completes
        among the survivors even when ranks die in it; a death reported here is recovered
        from like any other, at the first call."""
        flag = np.array([1], dtype=np.intc)
        try:
            req = self._comm.Iagree(flag)
            wait_for(req.Test, self.timeout,
                     lambda t: f"bmlmpi fault-tolerant communicator: construction did not "
                               f"complete on every rank within {t:g} s")
        except MPI.Exception as exc:
            if not is_failure(exc, self._comm):
                raise
            self._note_failure(exc)

    # -- properties -------------------------------------------------------------------------
    @property
    def survivors(self) -> tuple[int, ...]:
        """The original ranks still taking part, in current rank order."""
        return tuple(self._members)

    @property
    def masked(self) -> bool:
        return self._masked

    def __repr__(self) -> str:
        return (f"bmlmpi.FaultTolerantCommunicator(size={self.size}/{self.original_size}, "
                f"rank={self.rank}, failed={list(self.failed)}, algorithm={self.algorithm!r}, "
                f"recovery={self.recovery!r})")

    def Free(self) -> None:
        self._hb.close()
        if self in _LIVE:
            _LIVE.remove(self)
        if not self._masked:
            super().Free()

    # -- the calls --------------------------------------------------------------------------
    def _usable(self) -> None:
        if self._masked:
            raise RankMasked(f"original rank {self.original_rank} was masked out of this "
                             f"fault-tolerant communicator")

    def _start(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> Request:
        self._usable()
        try:
            _, name, src, out, staging = self._prepare(sendbuf, recvbuf, op, algorithm)
        except (ValueError, TypeError, BufferError) as exc:
            # the others learn of it in their argument check (RemoteArgumentError); the check
            # raises it here
            with self._hb.watching():
                try:
                    self._validate(None, exc)
                except MPI.Exception as mpi_exc:
                    if not is_failure(mpi_exc, self._comm):
                        raise
                    self._note_failure(mpi_exc)
            raise
        self._seq += 1
        call = _Call(self._seq, algorithm, name, src, out, staging)
        self._pending.append(call)
        with self._hb.watching():
            try:
                self._attempt(call)
                self._advance()
            except (ArgumentMismatch, RemoteArgumentError):
                self._pending.remove(call)
                raise
        return FaultTolerantRequest(self, call)

    def _attempt(self, call: _Call) -> None:
        """Start (or restart) ``call`` over the current members; a failure is only noted here,
        the agreement decides."""
        call.run = None
        call.ok = False
        call.vote = call.agree = None
        call.size = self.size
        call.attempts += 1
        if call.saved is not None:
            np.copyto(call.out, call.saved)
        if self._broken:
            return
        algorithm = call.algorithm
        if algorithm == "auto":
            algorithm = self._auto(call.out.size, call.out.dtype.itemsize)
        try:
            self._validate((algorithm, call.name, call.src, call.out, call.staging), None)
            self._launch_call(call, algorithm)
        except MPI.Exception as exc:
            if not is_failure(exc, self._comm):
                raise
            self._note_failure(exc)

    def _launch_call(self, call: _Call, algorithm: str) -> None:
        out, src = call.out, call.src
        if algorithm == "native":
            sbuf = MPI.IN_PLACE if src is None else src
            req = self._comm.Iallreduce(sbuf, out, mpi_op(call.name))
            call.run = _NativeRun(req, lambda: None, self.rank)
            return
        if src is not None and out.size:
            np.copyto(out, src)
        plan = self._plan(algorithm, out.size, out.dtype.itemsize)
        tag_base = (self._calls * TAG_STEPS) % self._tag_mod
        self._calls += 1
        label = (f"bmlmpi fault-tolerant {algorithm} allreduce (rank {self.rank} of "
                 f"{self.size}, call {call.seq}, attempt {call.attempts})")
        call.run = Run(plan, out, call.name, tag_base, label, None)

    def _plan(self, algorithm: str, count: int, itemsize: int) -> Plan:
        key = (algorithm, count, itemsize)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        sched = None
        if (algorithm == "bml" and self.recovery == "bcube" and self.failed
                and self.original_size <= MAX_PLANNED_SERVERS):
            try:
                sched = bcube_recovery_schedule(self._members[self.rank], self.home_shape,
                                                self.failed, count)
            except RecoveryError:
                sched = None  # fall back to the fresh BCube over the survivors
        if sched is not None:
            current = {orig: cur for cur, orig in enumerate(self._members)}
            plan = Plan(sched, [self._comm], lambda level, peer: (0, current[peer]))
        else:
            sched, _, _ = registry.build(algorithm, self, count, itemsize)
            plan = Plan(sched, [self._comm], lambda level, peer: (0, peer))
        self._plans[key] = plan
        return plan

    # -- the engine -------------------------------------------------------------------------
    def _note_failure(self, exc: BaseException | None = None) -> None:
        """Remember that this communicator is broken and make every other rank notice."""
        if self._broken:
            return
        self._broken = True
        self._noticed = time.time()
        self._events += 1
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            self._comm.Revoke()

    def _advance(self) -> None:
        """Advance every pending call, then settle agreements in call order."""
        self._check_vanished()
        if not self._broken:
            for call in self._pending:
                run = call.run
                if run is None or call.ok:
                    continue
                before = run.progress
                try:
                    call.ok = run.test()
                except MPI.Exception as exc:
                    if not is_failure(exc, self._comm):
                        raise
                    self._note_failure(exc)
                    break
                if call.ok or run.progress != before:
                    self._events += 1
        while self._pending:
            head = self._pending[0]
            if head.agree is None:
                if not (head.ok or self._broken):
                    return
                head.vote = np.array([1 if head.ok else 0], dtype=np.intc)
                head.agree = self._comm.Iagree(head.vote)
            try:
                done = head.agree.Test()
            except MPI.Exception as exc:
                if not is_failure(exc, self._comm):
                    raise
                # the vote was still agreed (and written); remember the failure it reports
                self._note_failure(exc)
                done = True
            if not done:
                return
            self._events += 1
            if head.vote[0] == 1:
                self._commit(head)
            else:
                self._recover()
                return

    def _commit(self, call: _Call) -> None:
        self._pending.pop(0)
        self._committed += 1
        if call.name == "avg":
            kernels.scale_avg(call.out, call.size)
        if call.staging is not None:
            call.staging.finish()
        call.committed = True

    def _drain(self, run: Run | _NativeRun | None) -> None:
        """Let an abandoned attempt's requests complete (with errors, once revoked) so that
        nothing lands in the buffer after the call starts again."""
        if run is None:
            return
        reqs = [run.req] if isinstance(run, _NativeRun) else list(run.reqs or ())
        end = time.monotonic() + min(self.timeout, 10.0)
        for r in reqs:
            while time.monotonic() < end:
                try:
                    if r.Test():
                        break
                except MPI.Exception:
                    break
                time.sleep(1e-4)

    def _recover(self) -> None:
        agreed = time.time()
        noticed = self._noticed or agreed
        for call in self._pending:
            self._drain(call.run)
        old = self._comm
        # MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0 (its libnbc schedule
        # aborts on the revoked communicator); the blocking shrink works.
        new = self._blocking(old.Shrink, "shrinking the communicator to the survivors")
        translated = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())),
                                               old.Get_group())
        members = [self._members[r] for r in translated]
        lost = tuple(sorted(set(self._members) - set(members)))
        self._adopt(new, members, lost)
        self.recoveries.append(RecoveryRecord(lost, noticed, agreed, time.time(), self.size))
        self._reconcile()
        if lost and self.on_failure is not None:
            self.on_failure(self, lost)
        for call in self._pending:
            self._attempt(call)

    def _blocking(self, fn: Callable[[], Any], what: str) -> Any:
        """Run a blocking MPI call under the deadline: in a helper thread when the MPI library
        allows calls from any thread, else directly (the heartbeat still fences hung peers)."""
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            try:
                return fn()
            except MPI.Exception as exc:
                raise FaultToleranceError(f"{what} failed: {exc.Get_error_string()}") from exc
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the main thread
                box["error"] = exc

        helper = threading.Thread(target=target, name="bmlmpi-blocking", daemon=True)
        helper.start()
        wait_for(lambda: not helper.is_alive(), self.timeout,
                 lambda t: f"bmlmpi: {what} did not finish within {t:g} s")
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, MPI.Exception):
                raise FaultToleranceError(f"{what} failed: {exc.Get_error_string()}") from exc
            raise exc
        return box["value"]

    def _adopt(self, new: MPI.Comm, members: list[int], lost: tuple[int, ...]) -> None:
        """Make ``new`` (the survivors, in ``members`` order) this communicator's own."""
        old = self._comm
        with contextlib.suppress(MPI.Exception):
            old.Free()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        self._comm = new
        self.rank = new.Get_rank()
        self.size = new.Get_size()
        # placement did not change: the survivors' link weights are the old matrix's rows and
        # columns of the survivors (no collective needed to find them again)
        keep = [self._members.index(m) for m in members]
        self._links = self._links[np.ix_(keep, keep)]
        self._members = members
        self.failed = tuple(sorted(set(self.failed) | set(lost)))
        self.shape = fresh_shape(self.size)
        self._plans.clear()
        self._validated.clear()
        self._choices.clear()
        self._tree_cache.clear()
        self._broken = False
        self._noticed = None
        self._events += 1
        self._hb.watch(members)
        self._hb.forget(lost)

    def _reconcile(self) -> None:
        """Every survivor must have committed the same calls; say so loudly if not."""
        mine = np.array([self._committed, len(self._pending)], dtype=np.int64)
        every = np.empty((self.size, 2), dtype=np.int64)
        req = self._comm.Iallgather(mine, every)
        state = {"failed": False}

        def done() -> bool:
            try:
                return req.Test()
            except MPI.Exception as exc:
                if not is_failure(exc, self._comm):
                    raise
                state["failed"] = True  # another failure: the next attempt's vote handles it
                return True

        wait_for(done, self.timeout,
                 lambda t: f"bmlmpi: survivors did not compare states within {t:g} s")
        if state["failed"] or (every == every[0]).all():
            return
        raise FaultToleranceError(f"survivors disagree on the allreduces committed before "
                                  f"the failure (committed, pending per rank: "
                                  f"{every.tolist()})")

    def _check_vanished(self) -> None:
        vanished = self._hb.vanished
        if not vanished:
            return
        failed = set()
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            group = self._comm.Get_failed()
            n = group.Get_size()
            if n:
                idx = MPI.Group.Translate_ranks(group, list(range(n)), self._comm.Get_group())
                failed = {self._members[i] for i in idx if i != MPI.UNDEFINED}
        for peer, why in list(vanished.items()):
            if peer not in self._members or peer in failed:
                vanished.pop(peer, None)
                continue
            raise FaultToleranceError(
                f"{why}, but MPI never reported it (Open MPI's runtime does not report a rank "
                f"that exits with a non-zero status), so the survivors cannot agree to drop "
                f"it. End ranks with bmlmpi.ft.finish() or bmlmpi.ft.install_exit_handlers().")

    def _progress_mark(self) -> tuple:
        return (self._events, tuple(c.run.progress if c.run is not None else -1
                                    for c in self._pending))

    def _wait_call(self, call: _Call) -> None:
        def describe(t: float) -> str:
            head = self._pending[0] if self._pending else None
            where = "nothing"
            if head is not None:
                if head.agree is not None:
                    where = f"the agreement on call {head.seq}"
                elif head.run is not None and not head.ok:
                    where = head.run.describe_timeout(t)
                else:
                    where = f"call {head.seq} (communicator revoked: {self._broken})"
            hint = ("" if self.ulfm else
                    "; this MPI may not implement ULFM, so a failed rank is never reported")
            return (f"bmlmpi fault-tolerant communicator (rank {self.rank} of {self.size}): no "
                    f"progress in {t:g} s; waiting on {where}{hint}")

        with self._hb.watching():
            wait_for(lambda: (self._advance(), call.committed)[1], self.timeout, describe,
                     progress=self._progress_mark)

    # -- masking (link failures) ----------------------------------------------------------
    def mask_link(self, a: int, b: int, *, mask: int | None = None) -> bool:
        """Handle a failed link between original ranks ``a`` and ``b`` as the failure of one
        of its servers: ``mask`` (default the larger of the two) stops taking part.

        Collective over the current members, with no allreduce outstanding. Returns False on
        the masked rank (whose communicator is then closed: calls raise :class:`RankMasked`)
        and True on the others, where ``failed`` now includes it and ``on_failure`` ran.
        """
        if a == b:
            raise ValueError(f"a link joins two servers, got {a} twice")
        victim = max(a, b) if mask is None else mask
        if victim not in (a, b):
            raise ValueError(f"mask={mask} is not an end of the link ({a}, {b})")
        return self.mask_rank(victim)

    def mask_rank(self, victim: int) -> bool:
        """Exclude original rank ``victim`` (collective; see :meth:`mask_link`)."""
        self._usable()
        if self._pending:
            raise RuntimeError("mask_rank/mask_link with allreduces outstanding; Wait them "
                               "first")
        if victim not in self._members:
            raise ValueError(f"original rank {victim} is not a member (members: "
                             f"{self._members})")
        if self.size == 1:
            raise ValueError("cannot mask the last member")
        with self._hb.watching():
            vec = np.array([victim, -victim], dtype=np.int64)
            res = np.empty_like(vec)
            req = self._comm.Iallreduce(vec, res, MPI.MAX)
            wait_for(req.Test, self.timeout,
                     lambda t: f"bmlmpi mask_rank: members did not agree within {t:g} s")
            if res[0] != -res[1]:
                raise ValueError("members named different ranks to mask")
            if self._members[self.rank] == victim:
                self._masked = True
                self._hb.close()
                self._comm = MPI.COMM_NULL
                return False
            group = MPI.Group.Excl(self._comm.Get_group(), [self._members.index(victim)])
            new = self._blocking(lambda: self._comm.Create_group(group),
                                 f"masking original rank {victim}")
            members = [m for m in self._members if m != victim]
            self._adopt(new, members, (victim,))
            now = time.time()
            self.recoveries.append(RecoveryRecord((victim,), now, now, now, self.size))
        if self.on_failure is not None:
            self.on_failure(self, (victim,))
        return True

    def _final_barrier(self, timeout: float) -> None:
        if self._masked or self._comm == MPI.COMM_NULL:
            return
        with self._hb.watching():
            try:
                req = self._comm.Ibarrier()
                wait_for(req.Test, timeout, lambda t: f"final barrier: {t:g} s")
            except (MPI.Exception, DeadlineExceeded, FaultToleranceError):
                pass  # a peer died at the end: nothing is left to agree on


# -- process exit ------------------------------------------------------------------------------

_exit_status: int = 0
_installed = False


def finish(status: int = 0, *, timeout: float | None = None) -> NoReturn:
    """End this rank: a bounded barrier with the survivors of every fault-tolerant
    communicator (in creation order), flush, ``os._exit(status)`` — skipping ``MPI_Finalize``,
    which can hang after a failure. ``timeout`` defaults to each communicator's own."""
    for c in list(_LIVE):
        c._final_barrier(c.timeout if timeout is None else timeout)
        with contextlib.suppress(Exception):
            c._hb.close()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _kill_on_exception(exc_type, exc, tb) -> None:
    try:
        sys.__excepthook__(exc_type, exc, tb)
        sys.stderr.write(f"bmlmpi: uncaught {exc_type.__name__} on pid {os.getpid()}; killing "
                         f"this rank so that MPI reports it to the others\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def install_exit_handlers() -> None:
    """Make this rank's end visible and hang-free (opt in, once per process):

    * an uncaught exception prints its traceback and kills the process with SIGKILL, which
      ULFM reports to the others (an ordinary non-zero exit is never reported);
    * at interpreter exit, :func:`finish` runs with the status given to ``sys.exit`` (0 for a
      normal end); a ``raise SystemExit(n)`` that bypasses ``sys.exit`` ends with status 0.
    """
    global _installed
    if _installed:
        return
    _installed = True
    sys.excepthook = _kill_on_exception
    real_exit = sys.exit

    def recording_exit(status: object = None) -> NoReturn:
        global _exit_status
        _exit_status = status if isinstance(status, int) else (0 if status is None else 1)
        real_exit(status)

    sys.exit = recording_exit
    atexit.register(lambda: finish(_exit_status))
