"""The fault-tolerant communicator: the plain communicator built with the fault-tolerant
policy (:class:`~.policy.FaultTolerantPolicy`), plus the public side of surviving failures.

The base :class:`bmlmpi.Communicator` runs every call; the policy it holds keeps each call in
the ledger until every survivor commits it (:mod:`.ledger`), recovers by shrinking
(:mod:`.membership`) and owns the growth back (:mod:`.grow`) and this rank's heartbeat. This
class overrides no private method of the base: it checks its own arguments, builds the base
with that policy, and adds the public properties and methods of failures (``failed``,
``survivors``, ``recoveries``, ``call_members``, ``mask_link``, ``replace_failed``, ...) and
the failure contracts of the calls it documents.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import config
from ..api import Communicator, Request
from ..execute import DeadlineExceeded, check_seconds, timeout_from_env, wait_request
from .errors import (
    FaultToleranceError,
    FaultToleranceUnavailable,
    is_failure,
    ulfm_support,
)
from .exit import LIVE
from .grow import (
    GrowRecord,
    Joined,
    agree_grown,
    receive_settings,
    receive_state,
    rejoin,
)
from .heartbeat import Heartbeat
from .link_watch import LinkWatch
from .membership import RecoveryRecord
from .policy import FaultTolerantPolicy

DEFAULT_HANG_TIMEOUT: float = config.variable("BMLMPI_HANG_TIMEOUT").default
RECOVERY_MODES = ("auto", "fresh", "bcube")


def _env_float(name: str, value: float | None, default: float, what: str) -> float:
    if value is not None:
        return check_seconds(value, what)
    env = config.get(name)
    return default if env is None else float(env)


class FaultTolerantCommunicator(Communicator, variant="fault_tolerant"):
    """A :class:`bmlmpi.Communicator` whose allreduces survive the death of ranks.

    Extra arguments: ``on_failure(comm, lost)`` — called on every survivor after each recovery
    with the original ranks just lost; ``recovery`` — ``"auto"``, ``"fresh"`` or ``"bcube"``
    (:mod:`bmlmpi.ft`); ``hang_timeout`` and ``heartbeat`` — seconds (:mod:`bmlmpi.ft`);
    ``watch_links`` — this server's NICs (interface names in its network namespace): when one
    goes down this rank is masked, i.e. ends itself and the others recover (:mod:`.link_watch`).
    """

    fault_tolerant = True
    #: Which node each original rank is on (None until construction sets it: the base class
    #: asks :meth:`nodes` while it constructs).
    _home_nodes: Any = None

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, algorithm: str = "auto",
                 topology: str | Sequence[int] | None = None, fault_tolerant: bool = True, *,
                 timeout: float | None = None, validate: bool | None = None,
                 on_failure: Callable[[FaultTolerantCommunicator, tuple[int, ...]], None]
                 | None = None,
                 recovery: str = "auto", hang_timeout: float | None = None,
                 heartbeat: float | None = None, watch_links: Sequence[str] | None = None,
                 reproducible: bool | None = None):
        """Collective over ``comm``, like the plain communicator, plus a token for the
        heartbeat and a closing agreement.

        Failure contract: without ULFM, :class:`FaultToleranceUnavailable` on every rank
        (nothing was built). A rank that fails during the collectives of construction makes
        the others raise :class:`FaultToleranceError` (or :class:`bmlmpi.DeadlineExceeded`
        when no rank reports it within ``timeout``); the communicator does not exist and the
        caller should end the rank (:func:`bmlmpi.ft.finish`). A death reported only in the
        closing agreement does not fail construction: every survivor returns, and the first
        call recovers from it like from any other failure.
        """
        if recovery not in RECOVERY_MODES:
            raise ValueError(f"recovery must be one of {RECOVERY_MODES}, got {recovery!r}")
        # A stopped rank is fenced by the heartbeat after hang_timeout; a deadline shorter
        # than that ends the survivors' calls first, and nobody fences the stopped rank (the
        # job never ends). The pair is refused, on every rank (the values are the same on
        # every rank when they come from the environment; otherwise each rank checks its own).
        hang = _env_float("BMLMPI_HANG_TIMEOUT", hang_timeout, DEFAULT_HANG_TIMEOUT,
                          "hang_timeout")
        deadline = timeout_from_env(timeout)
        if deadline <= hang:
            raise ValueError(
                f"fault-tolerant communicator: timeout ({deadline:g} s) must exceed hang_timeout "
                f"({hang:g} s, BMLMPI_HANG_TIMEOUT): a stopped rank is fenced after hang_timeout "
                f"and the survivors must still be waiting then, or nobody fences it")
        if comm == MPI.COMM_NULL:
            raise ValueError("cannot build a bmlmpi.Communicator on MPI.COMM_NULL")
        support, why = ulfm_support(comm)
        if support is False:
            raise FaultToleranceUnavailable(f"bmlmpi.Communicator(fault_tolerant=True): {why}")
        self.ulfm = support
        explicit = topology is not None or config.get("BMLMPI_BCUBE") is not None
        policy = FaultTolerantPolicy()
        try:
            super().__init__(comm, algorithm, topology, timeout=timeout, validate=validate,
                             policy=policy, reproducible=reproducible)
        except MPI.Exception as exc:
            raise FaultToleranceError(f"bmlmpi.Communicator(fault_tolerant=True): a rank "
                                      f"failed while the communicator was being built: "
                                      f"{exc.Get_error_string()}") from exc
        self.on_failure = on_failure
        self.original_size = self.size
        self.original_rank = self.rank
        self.home_shape = self.shape
        # Which node each original rank is on; after failures the survivors keep their nodes
        # (nodes()): re-deriving consecutive pretended nodes over the survivors, or reading a
        # placement matrix of the original size, would put ranks on the wrong node or fail.
        try:
            self._home_nodes = self.nodes()
        except ValueError:
            self._home_nodes = None  # nodes unknown: no hierarchical
        self.recovery = "bcube" if recovery == "bcube" or (recovery == "auto" and explicit) \
            else "fresh"
        policy.compose()
        period = _env_float("BMLMPI_HEARTBEAT", heartbeat, min(0.25, hang / 8), "heartbeat")
        try:
            token = self._share_token()
        except MPI.Exception as exc:
            raise FaultToleranceError(f"bmlmpi.Communicator(fault_tolerant=True): a rank "
                                      f"failed while the communicator was being built: "
                                      f"{exc.Get_error_string()}") from exc
        policy.start_heartbeat(token, period, hang)
        bad_links = None
        if watch_links:
            try:
                policy.link_watch = LinkWatch(watch_links, period)
            except ValueError as exc:
                bad_links = exc
        if not self._settle_construction(ok=bad_links is None):
            self.Free()
            raise bad_links or ValueError("watch_links names an interface that is missing or "
                                          "down on another rank")

    def nodes(self):
        """Which current ranks share a node: the nodes at construction restricted to the
        current members (each survivor stays on its node; a node that lost a rank holds
        fewer)."""
        home = self._home_nodes  # None while the base class constructs
        if home is None:
            return super().nodes()
        members = self.policy.membership.members
        if any(m >= home.size for m in members):
            return super().nodes()
        return home.restrict(members)

    def _share_token(self) -> str:
        token = np.frombuffer(os.urandom(8), dtype=np.uint8).copy()
        wait_request(self.comm.Ibcast(token, root=0), self.timeout,
                     "bmlmpi fault-tolerant communicator: rank 0's token did not arrive")
        return token.tobytes().hex()

    def _settle_construction(self, ok: bool = True) -> bool:
        """End construction with an agreement, so no rank leaves the constructor before every
        rank has finished the collectives above: otherwise a rank that dies just after its
        constructor (before its first call) could take a message a slower rank still needs
        with it, and that rank would fail inside the constructor. ULFM's agreement completes
        among the survivors even when ranks die in it; a death reported here is recovered
        from like any other, at the first call. The agreement also carries ``ok`` (this
        rank's arguments were valid): False on every rank when one rank's were not."""
        flag = np.array([1 if ok else 0], dtype=np.intc)
        try:
            wait_request(self.comm.Iagree(flag), self.timeout,
                         "bmlmpi fault-tolerant communicator: construction did not complete "
                         "on every rank")
        except MPI.Exception as exc:
            if not is_failure(exc, self.comm):
                raise
            self.policy.ledger.note_failure(exc)
        return bool(flag[0])

    # -- properties -------------------------------------------------------------------------
    @property
    def on_failure(self) -> Callable[[FaultTolerantCommunicator, tuple[int, ...]], None] | None:
        """Called as ``on_failure(comm, lost)`` on every survivor after each recovery (a
        shrink or a mask), with the original ranks just lost, before the uncommitted calls
        run again; ``size``, ``rank`` and ``survivors`` already describe the survivors.

        Contract: it runs inside the ``Allreduce``/``Test``/``Wait`` that met the failure and
        must not start allreduces on this communicator (they would interleave with the
        recovery); it may rescale mini-batches (:func:`bmlmpi.rescaled_batch`) or log. It must
        not raise: an exception propagates out of that call on this rank only, which then
        leaves the re-run, and the other survivors end at their deadline."""
        return self._on_failure

    @on_failure.setter
    def on_failure(self, fn: Callable[[FaultTolerantCommunicator, tuple[int, ...]], None]
                   | None) -> None:
        self._on_failure = fn

    @property
    def survivors(self) -> tuple[int, ...]:
        """The original ranks still taking part, in current rank order."""
        return tuple(self.policy.membership.members)

    @property
    def comm(self) -> MPI.Comm:
        """The communicator bmlmpi sends on (the survivors' after a recovery);
        ``MPI.COMM_NULL`` on a rank masked out."""
        membership = self.policy.membership  # None while the base class constructs
        masked = membership is not None and membership.masked
        return MPI.COMM_NULL if masked else super().comm

    @property
    def call_members(self) -> tuple[int, ...]:
        """The original ranks a new call's arguments are given for (its *frame*), in rank
        order: ``survivors`` while no call started on this rank is outstanding (started and
        not yet completed by ``Wait``, or by a ``Test`` that returned True, or raised). While
        one is, the frame stays what it was when the oldest of them started, whatever
        recoveries happen meanwhile inside ``Test``/``Wait``: calls started together are
        made for one membership, the same on every survivor, and each runs over the
        survivors by its collective's contract (:mod:`.family`). A new call's ``root``,
        counts and buffer sizes are for ``len(call_members)`` ranks, this rank being
        ``call_members.index(original_rank)``."""
        return self.policy.frame_now()

    @property
    def masked(self) -> bool:
        """Whether this rank was masked out (:meth:`mask_link`): its calls raise
        :class:`RankMasked`."""
        return self.policy.membership.masked

    @property
    def failed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The original ranks lost (died or masked) and not replaced."""
        return self.policy.membership.failed

    @property
    def recoveries(self) -> list[RecoveryRecord]:
        """One :class:`RecoveryRecord` per recovery (a shrink or a mask), oldest first."""
        return self.policy.membership.recoveries

    @property
    def regrowths(self) -> list[GrowRecord]:
        """One :class:`GrowRecord` per grow-back (:meth:`replace_failed`), oldest first."""
        return self.policy.growth.records

    @property
    def heartbeat(self) -> Heartbeat:
        """This rank's heartbeat and its watch over the members' (:mod:`.heartbeat`)."""
        return self.policy.heartbeat

    def __repr__(self) -> str:
        return (f"bmlmpi.FaultTolerantCommunicator(size={self.size}/{self.original_size}, "
                f"rank={self.rank}, failed={list(self.failed)}, algorithm={self.algorithm!r}, "
                f"recovery={self.recovery!r})")

    def Free(self) -> None:
        policy = self.policy
        policy.heartbeat.close()
        if policy.link_watch is not None:
            policy.link_watch.close()
        if self in LIVE:
            LIVE.remove(self)
        if not self.masked:
            super().Free()

    # -- the calls --------------------------------------------------------------------------
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                  algorithm: str | None = None, compression: Any = None,
                  reproducible: bool | None = None) -> None:
        """Reduce ``sendbuf`` over the survivors into ``recvbuf`` (``sendbuf`` may be
        IN_PLACE). ``algorithm``, ``compression`` and ``reproducible``: as
        :meth:`bmlmpi.Communicator.Allreduce`, with the failure contract of :meth:`Iallreduce`
        (a reproducible call run again among the survivors agrees its cuts again: the bits of
        a fresh call among them).

        Failure contract: returns on every survivor with the reduction over exactly the
        inputs of the ranks that are members when the call commits, the same on all of them
        (``AVG`` divides by their number). A call commits on every survivor or on none: when
        ranks die during it, the survivors agree, shrink, run ``on_failure`` and run the call
        again over themselves with the input restored (``IN_PLACE`` included). Bad arguments
        raise on every rank (``ValueError``/``TypeError``; the others
        :class:`bmlmpi.RemoteArgumentError` or :class:`bmlmpi.ArgumentMismatch`) with nothing
        started, and the communicator stays usable. :class:`bmlmpi.DeadlineExceeded` and
        :class:`FaultToleranceError` as the request's ``Wait``: nothing committed
        on this rank, the communicator must not be used again. :class:`RankMasked` on a rank
        masked out by :meth:`mask_link`.
        """
        self.Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm, compression=compression,
                        reproducible=reproducible).Wait()

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                   algorithm: str | None = None, compression: Any = None,
                   reproducible: bool | None = None) -> Request:
        """Start an allreduce; it progresses inside ``Test``/``Wait`` of the returned
        :class:`bmlmpi.Request`, which recover from failures inside (the ledger's
        :meth:`~.ledger.Call.test` and :meth:`~.ledger.Call.wait` state what a failure does).

        Failure contract: calls commit in the order they were started. The input is kept
        (``IN_PLACE``: copied) until the call commits, so that it can run again after a
        failure; ``sendbuf`` and ``recvbuf`` must not be touched until then. Bad arguments
        raise here as in :meth:`Allreduce`; a failure noticed while starting is not raised:
        the ``Test``/``Wait`` that follows recovers from it.

        ``compression`` (a :mod:`bmlmpi.compression` compressor or spec): without failures,
        the compressed allreduce of :meth:`bmlmpi.Communicator.Iallreduce` over the current
        members (the sparse exchange goes around the ring: this communicator has no level
        communicators), plus one agreement per call. It is not kept in the ledger and not
        re-run: a failure during a compressed call makes it raise
        :class:`FaultToleranceError` from ``Test``/``Wait`` on every survivor, with recvbuf
        untouched and the compressor's error-feedback memory as before the call, after which
        the communicator must not be used again (end the rank with :func:`bmlmpi.ft.finish`);
        a peer that hangs without failing makes ``Wait`` raise
        :class:`bmlmpi.DeadlineExceeded` after ``timeout`` s without progress, with the same
        consequence. A compressor that compresses nothing (every filter off, no wire format)
        is the plain call above, with its failure contract.
        """
        if compression is not None:
            self.policy.check_usable()
        return super().Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm,
                                  compression=compression, reproducible=reproducible)

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
        policy = self.policy
        policy.check_usable()
        if policy.ledger.pending:
            raise RuntimeError("mask_rank/mask_link with allreduces outstanding; Wait them "
                               "first")
        with policy.heartbeat.watching():
            new = policy.membership.mask(victim)
            if new is None:   # this rank is the one masked out
                policy.heartbeat.close()
                return False
            members = [m for m in policy.membership.members if m != victim]
            policy.adopt(new, members, (victim,))
            now = time.time()
            policy.membership.recovered(RecoveryRecord((victim,), now, now, now, self.size),
                                       "was masked")
        if self.on_failure is not None:
            self.on_failure(self, (victim,))
        return True

    def replace_failed(self, state: Any = None, *, command: str | None = None,
                       args: Sequence[str] | None = None) -> tuple[int, ...]:
        """Spawn one process per failed (or masked) original rank and go back to the full
        communicator: afterwards ``size`` is the original size, ``rank`` the original rank,
        ``failed`` empty and bml runs the full BCube schedule. Returns the original ranks
        replaced (``()`` without collectives when nothing failed). ``state`` (any picklable
        object, e.g. the model's parameters) is handed from current rank 0 to every
        replacement, whose :func:`join` returns it. ``command``/``args`` (default: this
        process's interpreter and command line) start the replacement program, which must
        call :func:`join` before anything else that communicates (:mod:`.grow`).

        Collective over the current members, with no allreduce outstanding (RuntimeError).

        Failure contract: never hangs — every step waits at most ``timeout`` s without
        progress. When ``MPI_Comm_spawn`` fails (the command cannot be started, no slots) it
        fails on every member: :class:`FaultToleranceError` everywhere and the communicator
        is unchanged and usable (a member's death noticed in the spawn is recovered by the
        next call as usual). When a rank dies or hangs later in the grow (the merge, the
        rebuild, the hand-over), the ranks involved raise :class:`FaultToleranceError` or
        :class:`bmlmpi.DeadlineExceeded`: the communicator must not be used again (end the
        rank with :func:`bmlmpi.ft.finish`). A death reported only by the closing agreement
        does not fail the grow: it returns, and the next call recovers from it like from any
        other failure.
        """
        self.policy.check_usable()
        return self.policy.growth.replace_failed(state, command, args)

    @classmethod
    def from_parent(cls, parent: MPI.Intercomm, timeout: float,
                    on_failure: Callable[[Any, tuple[int, ...]], None] | None) -> Joined:
        """The replacement's communicator, grown from the survivors that spawned it over
        ``parent`` (what :func:`join` builds)."""
        started_at = time.time()
        settings = receive_settings(parent, timeout)
        self = object.__new__(cls)
        self.timeout = float(settings["timeout"])
        self.ulfm = settings["ulfm"]
        self.original_rank = settings["rank"]
        self.original_size = settings["size"]
        self.home_shape = tuple(settings["shape"])
        self.recovery = settings["recovery"]
        self.on_failure = on_failure
        spawned = time.time()
        policy = FaultTolerantPolicy()
        rejoin(self, parent, high=True, algorithm=settings["algorithm"],
               shape=self.home_shape, validate=settings["validate"], policy=policy)
        policy.compose(settings["seq"], settings["committed"])
        policy.start_heartbeat(settings["token"], settings["period"], settings["hang"],
                               replacement=True)
        rebuilt = time.time()
        with policy.heartbeat.watching():
            state = receive_state(self, settings["donor"])
            agree_grown(self, policy.ledger)
        policy.growth.records.append(GrowRecord((self.original_rank,), started_at, spawned,
                                               rebuilt, time.time(), self.size, joined=True))
        return Joined(self, state)

    def close(self, timeout: float) -> None:
        """Meet the other survivors in a barrier bounded by ``timeout`` (a peer dying in it is
        ignored), then stop this rank's heartbeat: how :func:`bmlmpi.ft.finish` ends."""
        policy = self.policy
        if policy.link_watch is not None:
            policy.link_watch.close()
        if self.masked or self.comm == MPI.COMM_NULL:
            return
        with policy.heartbeat.watching():
            try:
                wait_request(self.comm.Ibarrier(), timeout, "final barrier")
            except (MPI.Exception, DeadlineExceeded, FaultToleranceError):
                pass  # a peer died at the end: nothing is left to agree on
        with contextlib.suppress(Exception):
            policy.heartbeat.close()


def join(*, timeout: float | None = None,
         on_failure: Callable[[Any, tuple[int, ...]], None] | None = None) -> Joined | None:
    """The replacement's entry: ``(comm, state)`` when this process was spawned by
    :meth:`FaultTolerantCommunicator.replace_failed`, else None (an ordinary rank of the
    original job, which builds its communicator as usual). Call it first, before any other
    communication: the survivors wait in ``replace_failed`` until it has joined. ``comm`` is a
    fault-tolerant communicator at the original rank of the rank replaced, with the survivors'
    settings (algorithm, BCube shape, recovery, deadline, heartbeat); ``on_failure`` as for the
    constructor. Note that ``MPI.COMM_WORLD`` of a replacement holds only the processes spawned
    with it: use ``comm``.

    Failure contract: never hangs. ``timeout`` (default ``BMLMPI_TIMEOUT``) bounds the wait for
    the survivors' settings; every later step waits at most the survivors' ``timeout``. A
    survivor that dies or hangs during the grow makes this raise :class:`FaultToleranceError` or
    :class:`bmlmpi.DeadlineExceeded`; the process should then end (:func:`bmlmpi.ft.finish`). A
    death reported only by the closing agreement is recovered by the next call, as on the
    survivors.
    """
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    parent.Set_errhandler(MPI.ERRORS_RETURN)
    return FaultTolerantCommunicator.from_parent(parent, timeout_from_env(timeout), on_failure)

