"""The fault-tolerant communicator: the plain communicator's launch path, with calls kept in
the ledger until every survivor commits them (:mod:`.ledger`), recovery by shrinking
(:mod:`.membership`) and growing back (:mod:`.grow`).

It owns three objects and wires them together: a :class:`~.ledger.Ledger` (the pending
calls, their votes and commits), a :class:`~.membership.Membership` (the members, the ranks
lost, masking) and a :class:`~.grow.Growth` (spawned replacements), plus this rank's
:class:`~.heartbeat.Heartbeat`. They read its public side (``comm``, ``heartbeat``,
``rank``, ``size``, ``timeout``, ``recorder``) and reach back through the hooks it hands the
ledger; it plugs into :class:`bmlmpi.Communicator` only through the base's declared seam
(``Communicator.SEAM``): schedules bind to one communicator (no level
communicators, so revoking and shrinking touch exactly one object), recovery picks the
BCube-preserving schedule where asked, an MPI failure is noted for the agreement instead of
raised, every call is entered in the ledger and returns a plain :class:`bmlmpi.Request` over
its :class:`~.ledger.Call`, and a shrink or mask adopts the survivors' communicator
(``_adopt_comm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import config
from ..api import Communicator, Request
from ..calls import CollectiveCall
from ..execute import DeadlineExceeded, Plan, check_seconds, timeout_from_env, wait_request
from .compressed import settle
from .errors import (
    FaultToleranceError,
    FaultToleranceUnavailable,
    RankMasked,
    is_failure,
    ulfm_support,
)
from .exit import LIVE, started
from .family import Skipped, retarget
from .grow import (
    GrowRecord,
    Growth,
    Joined,
    agree_grown,
    receive_settings,
    receive_state,
    rejoin,
)
from .heartbeat import Heartbeat
from .ledger import Call, Hooks, Ledger
from .link_watch import LinkWatch
from .membership import Membership, RecoveryRecord
from .recovery import bcube_preserving, fresh_shape

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
    #: Who takes part (None until construction makes it: the base class constructs first).
    _membership: Membership | None = None
    #: The members new calls' arguments are given for (:attr:`call_members`); None until the
    #: first call.
    _frame: tuple[int, ...] | None = None

    def __init__(self, comm: MPI.Comm = MPI.COMM_WORLD, algorithm: str = "auto",
                 topology: str | Sequence[int] | None = None, fault_tolerant: bool = True, *,
                 timeout: float | None = None, validate: bool | None = None,
                 on_failure: Callable[[FaultTolerantCommunicator, tuple[int, ...]], None]
                 | None = None,
                 recovery: str = "auto", hang_timeout: float | None = None,
                 heartbeat: float | None = None, watch_links: Sequence[str] | None = None):
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
        # Which node each original rank is on; after failures the survivors keep their nodes
        # (nodes()): re-deriving consecutive pretended nodes over the survivors, or reading a
        # placement matrix of the original size, would put ranks on the wrong node or fail.
        try:
            self._home_nodes = self.nodes()
        except ValueError:
            self._home_nodes = None  # nodes unknown: no hierarchical
        self.recovery = "bcube" if recovery == "bcube" or (recovery == "auto" and explicit) \
            else "fresh"
        self._compose()
        period = _env_float("BMLMPI_HEARTBEAT", heartbeat, min(0.25, hang / 8), "heartbeat")
        try:
            token = self._share_token()
        except MPI.Exception as exc:
            raise FaultToleranceError(f"bmlmpi.Communicator(fault_tolerant=True): a rank "
                                      f"failed while the communicator was being built: "
                                      f"{exc.Get_error_string()}") from exc
        self._start_heartbeat(token, period, hang)
        bad_links = None
        if watch_links:
            try:
                self._link_watch = LinkWatch(watch_links, period)
            except ValueError as exc:
                bad_links = exc
        if not self._settle_construction(ok=bad_links is None):
            self.Free()
            raise bad_links or ValueError("watch_links names an interface that is missing or "
                                          "down on another rank")

    # -- construction helpers ---------------------------------------------------------------
    def _compose(self, seq: int = 0, committed: int = 0) -> None:
        """The ledger, membership and growth of a communicator whose members are all the
        original ranks (also how a replacement starts, from the survivors' counts)."""
        self._membership = Membership(self, self.size)
        self._ledger = Ledger(self, Hooks(attempt=self._attempt, recover=self._recover,
                                          check=self._membership.check_vanished,
                                          done=self._call_done, failed=self._call_failed),
                              seq, committed)
        self._growth = Growth(self, self._ledger, self._membership)
        self._link_watch: LinkWatch | None = None

    def _start_heartbeat(self, token: str, period: float, hang: float, *,
                         replacement: bool = False) -> None:
        self._hb = Heartbeat(token, self.original_rank, period, hang)
        self._hb.watch(self._membership.members)
        LIVE.append(self)
        started(self.original_rank, replacement=replacement, heartbeat=self._hb.folder)

    def nodes(self):
        """Which current ranks share a node: the nodes at construction restricted to the
        current members (each survivor stays on its node; a node that lost a rank holds
        fewer)."""
        home = self._home_nodes  # None while the base class constructs
        if home is None:
            return super().nodes()
        members = self._membership.members
        if any(m >= home.size for m in members):
            return super().nodes()
        return home.restrict(members)

    # -- the seam (Communicator.SEAM): what differs from the plain communicator -----------
    def _agrees_every_call(self) -> bool:
        """Every call is agreed before its attempt (one Iallreduce on the communicator, made
        by every rank, the one whose arguments fail included), so an agreement never meets a
        data message, whatever the ranks' arguments."""
        return True

    def _make_control(self) -> MPI.Comm:
        """The agreement travels on the one communicator, which recovery revokes and
        shrinks (and the base's ``_adopt_comm`` replaces): every rank agrees on every call
        before any data moves (see above)."""
        return self.comm

    def _split_levels(self) -> list[MPI.Comm]:
        return []  # one communicator for every transfer (module docstring)

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
            self._ledger.note_failure(exc)
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
        return tuple(self._membership.members)

    @property
    def comm(self) -> MPI.Comm:
        """The communicator bmlmpi sends on (the survivors' after a recovery);
        ``MPI.COMM_NULL`` on a rank masked out."""
        masked = self._membership is not None and self._membership.masked
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
        return self._frame_now()

    def _frame_now(self) -> tuple[int, ...]:
        if self._frame is None or not self._ledger.outstanding:
            self._frame = tuple(self._membership.members)
        return self._frame

    @property
    def masked(self) -> bool:
        """Whether this rank was masked out (:meth:`mask_link`): its calls raise
        :class:`RankMasked`."""
        return self._membership.masked

    @property
    def failed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The original ranks lost (died or masked) and not replaced."""
        return self._membership.failed

    @property
    def recoveries(self) -> list[RecoveryRecord]:
        """One :class:`RecoveryRecord` per recovery (a shrink or a mask), oldest first."""
        return self._membership.recoveries

    @property
    def regrowths(self) -> list[GrowRecord]:
        """One :class:`GrowRecord` per grow-back (:meth:`replace_failed`), oldest first."""
        return self._growth.records

    @property
    def heartbeat(self) -> Heartbeat:
        """This rank's heartbeat and its watch over the members' (:mod:`.heartbeat`)."""
        return self._hb

    def __repr__(self) -> str:
        return (f"bmlmpi.FaultTolerantCommunicator(size={self.size}/{self.original_size}, "
                f"rank={self.rank}, failed={list(self.failed)}, algorithm={self.algorithm!r}, "
                f"recovery={self.recovery!r})")

    def Free(self) -> None:
        self._hb.close()
        if self._link_watch is not None:
            self._link_watch.close()
        if self in LIVE:
            LIVE.remove(self)
        if not self.masked:
            super().Free()

    # -- the calls --------------------------------------------------------------------------
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                  algorithm: str | None = None, compression: Any = None) -> None:
        """Reduce ``sendbuf`` over the survivors into ``recvbuf`` (``sendbuf`` may be
        IN_PLACE). ``algorithm`` and ``compression``: as :meth:`bmlmpi.Communicator.Allreduce`,
        with the failure contract of :meth:`Iallreduce`.

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
        self.Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm, compression=compression).Wait()

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                   algorithm: str | None = None, compression: Any = None) -> Request:
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
            self._usable()
        return super().Iallreduce(sendbuf, recvbuf, op, algorithm=algorithm,
                                  compression=compression)

    def settle_compressed(self, stages: Any, channel: Any, what: str,
                          abandon: Callable[[], None]) -> Any:
        """A compressed call's exchange settled among the survivors: it completes on every
        survivor or on none (:mod:`.compressed`)."""
        return settle(self, stages, channel, what, abandon)

    def _usable(self) -> None:
        if self.masked:
            raise RankMasked(f"original rank {self.original_rank} was masked out of this "
                             f"fault-tolerant communicator")

    def _start(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> Request:
        self._usable()
        return super()._start(sendbuf, recvbuf, op, algorithm)

    def _usable_for_calls(self) -> None:
        self._usable()

    def _family_prepared(self, collective: str, algorithm: str | None, build: Any) -> Any:
        """The family's call, its arguments checked against the members of its frame
        (:attr:`call_members`) and remembering them: each attempt runs it over the members
        then by its collective's contract (:mod:`.family`)."""
        frame = self._frame_now()
        if list(frame) != self._membership.members:
            build = self._framed(build, frame)
        call = super()._family_prepared(collective, algorithm, build)
        call.extra["members"] = frame
        return call

    def _framed(self, build: Any, frame: tuple[int, ...]) -> Any:
        """``build`` checking its arguments as a call over ``frame`` (members this rank
        recovered from while calls were outstanding) instead of the current members."""
        def framed(algorithm: str) -> Any:
            rank, size = self.rank, self.size
            self.rank, self.size = frame.index(self.original_rank), len(frame)
            try:
                call = build(algorithm)
            finally:
                self.rank, self.size = rank, size
            if call.algorithm == "auto":
                # auto chooses at each attempt, over the members it runs on (_attempt); a
                # choice now would be for members this communicator no longer has
                call.algorithm = "native"
            return call
        return framed

    def _submit(self, prepared: CollectiveCall) -> Request:
        """Enter the call in the ledger and start its first attempt."""
        self._frame_now()  # a call started with nothing outstanding opens a new frame
        return Request(self._ledger.enter(prepared))

    def _start_persistent(self, prepared: CollectiveCall, compiled: Any) -> Call:
        """A persistent call's start is one call of the ledger (compiled per attempt); it
        runs over the members at each start by the contract for the members it was made for
        (its ``_init``'s frame)."""
        self._record(prepared)
        self._frame_now()
        return self._ledger.enter(prepared)

    def _progress_mark(self) -> tuple:
        return self._ledger.progress_mark()

    def _attempt(self, call: Call) -> None:
        """Start (or restart) ``call`` over the current members; a failure is only noted here,
        the agreement decides (the ledger's ``attempt`` hook)."""
        call.restart(self.size)
        if self._ledger.broken:
            return
        prepared = call.prepared
        if prepared.collective != "allreduce":
            prepared = retarget(prepared, self._membership.members, self.rank)
        skip = prepared.collective != "allreduce" and prepared.extra.get("skip")
        algorithm = call.algorithm
        if algorithm == "auto" and not skip:  # chosen for the call as it runs now
            algorithm = self._resolve_auto(prepared)
        prepared = dataclasses.replace(prepared, algorithm=algorithm)
        call.effective = prepared
        label = (f"bmlmpi fault-tolerant {algorithm} {prepared.collective} (rank {self.rank} "
                 f"of {self.size}, call {call.seq}, attempt {call.attempts})")
        with self._failure_noted():
            run = self._check_and_launch(prepared, label, launch=not skip)
            call.run = Skipped() if skip else run
            self._ledger.defer_behind_holder(call)
        if call.slot is not None:
            call.slot.run = call.run

    # -- recovery: the ledger's recover hook, masking, growing back -----------------------
    def _recover(self) -> None:
        """After a 0 vote: let the abandoned attempts drain, shrink to the survivors, adopt
        their communicator, reconcile, run ``on_failure`` and start every uncommitted call
        again over the survivors (:mod:`.membership`)."""
        agreed = time.time()
        noticed = self._ledger.noticed or agreed
        self._ledger.drain()
        new, members, lost = self._membership.shrink()
        self._adopt(new, members, lost)
        self._membership.recovered(
            RecoveryRecord(lost, noticed, agreed, time.time(), self.size), "died")
        self._tag_count = self._membership.reconcile(
            self._ledger.committed, len(self._ledger.pending), self._tag_count)
        if lost and self.on_failure is not None:
            self.on_failure(self, lost)
        self._ledger.restart()

    def _adopt(self, new: MPI.Comm, members: list[int], lost: tuple[int, ...]) -> None:
        """Make ``new`` (the survivors, in ``members`` order) this communicator's own."""
        self._adopt_comm(new, self._membership.positions(members), fresh_shape(len(members)))
        self._membership.adopt(members, lost)
        self._ledger.recovered()
        self._hb.watch(members)
        self._hb.forget(lost)

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
        if self._ledger.pending:
            raise RuntimeError("mask_rank/mask_link with allreduces outstanding; Wait them "
                               "first")
        with self._hb.watching():
            new = self._membership.mask(victim)
            if new is None:   # this rank is the one masked out
                self._hb.close()
                return False
            members = [m for m in self._membership.members if m != victim]
            self._adopt(new, members, (victim,))
            now = time.time()
            self._membership.recovered(RecoveryRecord((victim,), now, now, now, self.size),
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
        self._usable()
        return self._growth.replace_failed(state, command, args)

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
        rejoin(self, parent, high=True, algorithm=settings["algorithm"],
               shape=self.home_shape, validate=settings["validate"])
        self._compose(settings["seq"], settings["committed"])
        self._start_heartbeat(settings["token"], settings["period"], settings["hang"],
                              replacement=True)
        rebuilt = time.time()
        with self._hb.watching():
            state = receive_state(self, settings["donor"])
            agree_grown(self, self._ledger)
        self._growth.records.append(GrowRecord((self.original_rank,), started_at, spawned,
                                               rebuilt, time.time(), self.size, joined=True))
        return Joined(self, state)

    def _compile(self, algorithm: str, count: int, itemsize: int) -> Plan:
        """After failures with ``recovery="bcube"``, bml keeps the original BCube addresses
        (peers are original ranks); otherwise the requested algorithm over the current
        members. Every transfer runs on the one communicator."""
        if self.recovery == "bcube":
            members = self._membership.members
            sched = bcube_preserving(algorithm, members[self.rank], self.home_shape,
                                     self.failed, count)
            if sched is not None:
                current = {orig: cur for cur, orig in enumerate(members)}
                return Plan(sched, [self.comm], lambda level, peer: (0, current[peer]))
        return super()._compile(algorithm, count, itemsize)  # no level communicators

    @contextlib.contextmanager
    def _failure_noted(self) -> Iterator[None]:
        """An MPI failure here is noted (and the communicator revoked), not raised: the
        agreement on the call decides."""
        with self._hb.watching():
            try:
                yield
            except MPI.Exception as exc:
                if not is_failure(exc, self.comm):
                    raise
                self._ledger.note_failure(exc)

    def _is_failure(self, exc: MPI.Exception) -> bool:
        return is_failure(exc, self.comm)

    def close(self, timeout: float) -> None:
        """Meet the other survivors in a barrier bounded by ``timeout`` (a peer dying in it is
        ignored), then stop this rank's heartbeat: how :func:`bmlmpi.ft.finish` ends."""
        if self._link_watch is not None:
            self._link_watch.close()
        if self.masked or self.comm == MPI.COMM_NULL:
            return
        with self._hb.watching():
            try:
                wait_request(self.comm.Ibarrier(), timeout, "final barrier")
            except (MPI.Exception, DeadlineExceeded, FaultToleranceError):
                pass  # a peer died at the end: nothing is left to agree on
        with contextlib.suppress(Exception):
            self._hb.close()


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

