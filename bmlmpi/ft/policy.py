"""The fault-tolerant policy: what a call does differently when ranks may die
(:class:`bmlmpi.call_policy.CallPolicy`'s contract, method by method).

:class:`FaultTolerantPolicy` owns the parts that keep calls alive across failures: a
:class:`~.ledger.Ledger` (the pending calls, their votes and commits), a
:class:`~.membership.Membership` (the members, the ranks lost, masking), a
:class:`~.grow.Growth` (spawned replacements) and this rank's :class:`~.heartbeat.Heartbeat`.
It serves one :class:`~.communicator.FaultTolerantCommunicator` (its ``pipeline``) and reaches
it only through public names. What it changes against the plain policy: schedules bind to one
communicator (no level communicators, so revoking and shrinking touch exactly one object) and
agreements travel on it, every call is agreed before it starts, recovery picks the
BCube-preserving schedule where asked, an MPI failure is noted for the agreement instead of
raised, every call is entered in the ledger (the record its :class:`bmlmpi.Request` polls) and
run again over the survivors after a failure, and a shrink or mask replaces the communicator
by the survivors' (``pipeline.adopt_comm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..call_policy import CallPolicy
from ..execute import Plan
from ..schedules.collectives import collective as collective_record
from .compressed import settle
from .errors import RankMasked, is_failure
from .exit import LIVE, started
from .family import ContributionsLost, Skipped, complete_lost_counts, retarget
from .grow import Growth
from .heartbeat import Heartbeat
from .ledger import Call, Ledger
from .link_watch import LinkWatch
from .membership import Membership, RecoveryRecord
from .recovery import bcube_preserving, fresh_shape


class FaultTolerantPolicy(CallPolicy):
    """The policy of a :class:`~.communicator.FaultTolerantCommunicator` (module docstring).
    Its parts exist from :meth:`compose` on (the base communicator is built first)."""

    agrees_every_call = True
    keeps_calls = True

    def __init__(self) -> None:
        self.membership: Membership | None = None
        self.ledger: Ledger | None = None
        self.growth: Growth | None = None
        self.heartbeat: Heartbeat | None = None
        self.link_watch: LinkWatch | None = None
        #: The members new calls' arguments are given for (the communicator's
        #: ``call_members``); None until the first call.
        self.frame: tuple[int, ...] | None = None

    # -- its parts ----------------------------------------------------------------------------
    def compose(self, seq: int = 0, committed: int = 0) -> None:
        """The ledger, membership and growth of a communicator whose members are all the
        original ranks (also how a replacement starts, from the survivors' counts)."""
        pipeline = self.pipeline
        self.membership = Membership(pipeline, pipeline.size)
        self.ledger = Ledger(pipeline, self, seq, committed)
        self.growth = Growth(pipeline, self.ledger, self.membership)
        self.link_watch = None

    def start_heartbeat(self, token: str, period: float, hang: float, *,
                        replacement: bool = False) -> None:
        """This rank's heartbeat, watching the members; the rank is entered among the live
        communicators :func:`bmlmpi.ft.finish` closes."""
        pipeline = self.pipeline
        self.heartbeat = Heartbeat(token, pipeline.original_rank, period, hang)
        self.heartbeat.watch(self.membership.members)
        LIVE.append(pipeline)
        started(pipeline.original_rank, replacement=replacement,
                heartbeat=self.heartbeat.folder)

    # -- the communicators a communicator builds ----------------------------------------------
    def control_channel(self, data: MPI.Comm) -> MPI.Comm:
        """The agreement travels on the one communicator, which recovery revokes and shrinks
        (and ``adopt_comm`` replaces): every rank agrees on every call before any data moves
        (:attr:`agrees_every_call`), so an agreement never meets a data message."""
        return data

    def levels(self, data: MPI.Comm, shape: Sequence[int], rank: int) -> list[MPI.Comm]:
        """None: one communicator for every transfer (module docstring)."""
        return []

    # -- a call's life ----------------------------------------------------------------------
    def check_usable(self) -> None:
        """:class:`RankMasked` on a rank masked out (``mask_link``)."""
        membership = self.membership  # None while the base communicator constructs
        if membership is not None and membership.masked:
            raise RankMasked(f"original rank {self.pipeline.original_rank} was masked out "
                             f"of this fault-tolerant communicator")

    def frame_now(self) -> tuple[int, ...]:
        """The frame a new call is made for (the communicator's ``call_members``): the
        members when nothing started on this rank is outstanding, else the frame the oldest
        outstanding call was made for."""
        if self.frame is None or not self.ledger.outstanding:
            self.frame = tuple(self.membership.members)
        return self.frame

    def prepare_family(self, collective: str, algorithm: str | None,
                       build: Callable[[str], Any], engine: Any,
                       frame: tuple[int, ...] | None = None) -> Any:
        """The family's call, its arguments checked against the members of its frame and
        remembering them (``call.extra["members"]``): each attempt runs it over the members
        then by its collective's contract (:mod:`.family`). ``frame``: the frame its
        arguments were gathered for (:meth:`pair_counts`), kept even where that gathering
        lost ranks; None: :meth:`frame_now`."""
        now = self.frame_now()
        frame = now if frame is None else frame
        if list(frame) != self.membership.members:
            build = self.framed(build, frame)
        call = engine.prepare(collective, algorithm, build)
        call.extra["members"] = frame
        return call

    def pair_counts(self, row_and_column: Callable[[int], Any]) -> tuple[Any, Any]:
        """An ``Alltoallv``'s counts from every member of the call's frame (the plain
        policy's contract), gathered by the ledger's ``Allgather``, and that frame. A
        member lost while they were gathered leaves its row and column as the others'
        counts give them (what each sends it, what each expects from it), so the call is
        still made for the frame, the same on every survivor, and runs over the survivors by
        the all-to-all's contract (:func:`.family.retarget`)."""
        frame = self.frame_now()
        size = len(frame)
        mine = row_and_column(size)
        every = np.empty(mine.size * size, dtype=np.int64)
        try:
            self.pipeline.Allgather(mine, every)
        except ContributionsLost as exc:
            table = every.reshape(size, mine.size)
            complete_lost_counts(table, [frame.index(o) for o in exc.lost])
            return table, frame
        return every.reshape(size, mine.size), frame

    def framed(self, build: Callable[[str], Any], frame: tuple[int, ...]
               ) -> Callable[[str], Any]:
        """``build`` checking its arguments as a call over ``frame`` (members this rank
        recovered from while calls were outstanding) instead of the current members."""
        pipeline = self.pipeline

        def framed(algorithm: str) -> Any:
            rank, size = pipeline.rank, pipeline.size
            pipeline.rank, pipeline.size = frame.index(pipeline.original_rank), len(frame)
            try:
                call = build(algorithm)
            finally:
                pipeline.rank, pipeline.size = rank, size
            if call.algorithm == "auto":
                # auto chooses at each attempt, over the members it runs on (attempt); a
                # choice now would be for members this communicator no longer has
                call.algorithm = "native"
            return call
        return framed

    def track(self, call: Any) -> Call:
        """Enter the call in the ledger and start its first attempt: the ledger's
        :class:`~.ledger.Call` is the record its request polls."""
        self.frame_now()  # a call started with nothing outstanding opens a new frame
        return self.ledger.enter(call)

    def start_persistent(self, call: Any, compiled: Any) -> Call:
        """A persistent call's start is one call of the ledger (compiled per attempt); it
        runs over the members at each start by the contract for the members it was made for
        (its ``_init``'s frame)."""
        self.pipeline.call_log.record(call)
        self.frame_now()
        return self.ledger.enter(call)

    def compile(self, algorithm: str, count: int, itemsize: int) -> Plan:
        """After failures with ``recovery="bcube"``, bml keeps the original BCube addresses
        (peers are original ranks); otherwise the requested algorithm over the current
        members. Every transfer runs on the one communicator."""
        pipeline = self.pipeline
        if pipeline.recovery == "bcube":
            members = self.membership.members
            sched = bcube_preserving(algorithm, members[pipeline.rank], pipeline.home_shape,
                                     pipeline.failed, count)
            if sched is not None:
                current = {orig: cur for cur, orig in enumerate(members)}
                return Plan(sched, [pipeline.comm], lambda level, peer: (0, current[peer]))
        return super().compile(algorithm, count, itemsize)  # no level communicators

    def settle_compressed(self, stages: Generator[list, None, Any], channel: Any, what: str,
                          abandon: Callable[[], None]) -> Generator[list, None, Any]:
        """A compressed call's exchange settled among the survivors: it completes on every
        survivor or on none (:func:`.compressed.settle`)."""
        return settle(self.pipeline, stages, channel, what, abandon)

    @contextlib.contextmanager
    def failure_noted(self) -> Iterator[None]:
        """An MPI failure here is noted (and the communicator revoked), not raised: the
        agreement on the call decides."""
        with self.heartbeat.watching():
            try:
                yield
            except MPI.Exception as exc:
                if not is_failure(exc, self.pipeline.comm):
                    raise
                self.ledger.note_failure(exc)

    def is_failure(self, exc: MPI.Exception) -> bool:
        """Whether ``exc`` reports a failed process or a revoked communicator (ULFM)."""
        return is_failure(exc, self.pipeline.comm)

    def progress_mark(self) -> tuple:
        """The ledger's votes, commits and failures, and each pending call's run."""
        return self.ledger.progress_mark()

    # -- what the ledger calls ----------------------------------------------------------------
    def attempt(self, call: Call) -> None:
        """Start (or restart) ``call`` over the current members; a failure is only noted
        here, the agreement decides."""
        pipeline = self.pipeline
        call.restart(pipeline.size)
        if self.ledger.broken:
            return
        prepared = call.prepared
        skip = False
        if not collective_record(prepared.collective).size_free:
            # its counts are per member: prepared again for the survivors, which may leave
            # this rank nothing to exchange
            prepared = retarget(prepared, self.membership.members, pipeline.rank)
            skip = prepared.extra.get("skip")
        algorithm = call.algorithm
        if algorithm == "auto" and not skip:  # chosen for the call as it runs now
            algorithm = prepared.auto(pipeline.plans)
        prepared = dataclasses.replace(prepared, algorithm=algorithm)
        call.effective = prepared
        label = (f"bmlmpi fault-tolerant {algorithm} {prepared.collective} (rank "
                 f"{pipeline.rank} of {pipeline.size}, call {call.seq}, attempt "
                 f"{call.attempts})")
        with self.failure_noted():
            run = pipeline.check_and_launch(prepared, label, launch=not skip)
            call.run = Skipped() if skip else run
            self.ledger.defer_behind_holder(call)
        if call.slot is not None:
            call.slot.run = call.run

    def check_vanished(self) -> None:
        """Raise when the heartbeat saw a member gone that MPI never reported
        (:meth:`~.membership.Membership.check_vanished`)."""
        self.membership.check_vanished()

    def recover(self) -> None:
        """After a 0 vote: let the abandoned attempts drain, shrink to the survivors, adopt
        their communicator, reconcile, run ``on_failure`` and start every uncommitted call
        again over the survivors (:mod:`.membership`)."""
        pipeline, ledger, membership = self.pipeline, self.ledger, self.membership
        agreed = time.time()
        noticed = ledger.noticed or agreed
        ledger.drain()
        new, members, lost = membership.shrink()
        self.adopt(new, members, lost)
        membership.recovered(
            RecoveryRecord(lost, noticed, agreed, time.time(), pipeline.size), "died")
        numbers = pipeline.call_numbers
        numbers.agree_tags(membership.reconcile(ledger.committed, len(ledger.pending),
                                                numbers.launches))
        if lost and pipeline.on_failure is not None:
            pipeline.on_failure(pipeline, lost)
        ledger.restart()

    # -- how the communicator is replaced -----------------------------------------------------
    def adopt(self, new: MPI.Comm, members: list[int], lost: tuple[int, ...]) -> None:
        """Make ``new`` (the survivors, in ``members`` order) the communicator's own: the
        pipeline adopts it, the members and the ledger learn of it, the heartbeat watches
        the members and forgets the ranks lost."""
        membership = self.membership
        self.pipeline.adopt_comm(new, membership.positions(members),
                                 fresh_shape(len(members)))
        membership.adopt(members, lost)
        self.ledger.recovered()
        self.heartbeat.watch(members)
        self.heartbeat.forget(lost)
