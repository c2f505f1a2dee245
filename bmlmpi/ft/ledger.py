"""The vote/agree/commit ledger of the fault-tolerant communicator.

Every allreduce is a :class:`Call`, kept in start order until every survivor has committed
it. Once a call's run has completed locally or failed, each rank votes (1 = completed) in
``MPI_Comm_iagree``, calls in the order they were started. The agreed flag is the same on
every survivor even when the agreement itself reports a failure (Open MPI writes it; checked
on the development machine), so the decision is uniform: 1 commits the call (AVG divides by
the attempt's size, staged device results are copied back), 0 starts a recovery
(:mod:`.membership`). A rank that dies after delivering everything a call needed from it
(every survivor completed) counts as dying after that call: the call commits with its input,
and the next call notices the death.

:class:`Ledger` is a part of the fault-tolerant policy (:class:`~bmlmpi.ft.policy.
FaultTolerantPolicy`): it holds the pending calls, the count of calls started and committed,
whether the communicator is broken (a failure noted, not yet recovered) and since when, and a
count of events that shows progress. It reads the communicator's public side (``comm``,
``heartbeat``, ``recorder``, ``timeout``) and records the end of a call through its public
``call_log`` (:class:`~bmlmpi.call_log.CallLog`); starting an attempt, recovering and
checking for vanished peers it asks of the policy (``attempt``, ``recover``,
``check_vanished``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..api import NativeRun
from ..calls import ArgumentMismatch, CollectiveCall, RemoteArgumentError
from ..execute import Run, poll_until, request_done, wait_for
from ..executors import defer_behind
from .errors import is_failure


class Call:
    """One call, tracked until every survivor has committed it: the record behind the
    :class:`bmlmpi.Request` a fault-tolerant call returns (:class:`bmlmpi.handles.CallRecord`).
    """

    def __init__(self, ledger: Ledger, seq: int, prepared: CollectiveCall):
        self.ledger = ledger
        self.seq = seq
        self.algorithm = prepared.requested  # "auto" is resolved again for each attempt
        self.prepared = prepared
        self.effective = prepared           # as the current attempt runs it (.family)
        self.out = prepared.out
        saved = prepared.src is None
        self.saved = prepared.out.copy() if saved else None  # IN_PLACE input, for a re-run
        self.run: Run | NativeRun | None = None
        self.size = 0                       # communicator size of the current attempt
        self.ok = False                     # the current attempt completed locally
        self.vote: np.ndarray | None = None
        self.agree: MPI.Request | None = None
        self.committed = False
        self.attempts = 0
        self.slot = prepared.slot           # the call in the flight recorder

    def restart(self, size: int) -> None:
        """Forget the last attempt: the next runs over ``size`` ranks, from the input as it
        was when the call started."""
        self.run = None
        self.ok = False
        self.vote = self.agree = None
        self.size = size
        self.attempts += 1
        if self.saved is not None:
            np.copyto(self.out, self.saved)

    def test(self) -> bool:
        """Advance every outstanding call of the communicator; True once this call is
        committed on every survivor (its recvbuf then holds the result over exactly the
        survivors' inputs, the same on all of them).

        Failure contract: a failure met here is recovered inside this call (a collective over
        the survivors: every survivor must go on calling ``Test`` or ``Wait``), ``on_failure``
        runs inside it, and the call is then re-run over the survivors; ``Test`` returns False
        until that re-run commits. It raises only from a recovery that cannot complete:
        :class:`~bmlmpi.ft.FaultToleranceError` or :class:`bmlmpi.DeadlineExceeded`, after
        which this call is committed on no rank that raised, and the communicator must not be
        used again."""
        return self.ledger.test(self)

    def wait(self) -> None:
        """Return once this call is committed on every survivor (see :meth:`test`).

        Failure contract: failures are recovered inside, as in :meth:`test`. Raises
        :class:`bmlmpi.DeadlineExceeded` after ``timeout`` s without progress (a hung peer
        the heartbeat could not fence, e.g. on another host, or an MPI that never reports a
        failure) and :class:`~bmlmpi.ft.FaultToleranceError` when the survivors cannot
        recover (a rank gone without MPI noticing, survivors that committed different calls,
        a failed shrink). After either, this call and every later one is uncommitted on this
        rank, its recvbuf undefined, and the communicator must not be used again: end the
        rank with :func:`bmlmpi.ft.finish`, whose bounded barrier the others meet."""
        self.ledger.wait(self)


class Ledger:
    """Runs, votes on and commits the pending calls, in the order they were started.

    ``owner``: the fault-tolerant communicator (its public ``comm``, ``heartbeat``,
    ``recorder``, ``timeout``, ``ulfm``, ``rank``, ``size``, ``call_log``); ``policy``: the
    :class:`~bmlmpi.ft.policy.FaultTolerantPolicy` that starts attempts and recovers.
    ``seq``/``committed``: the counts to continue from (a replacement's, :mod:`.grow`)."""

    def __init__(self, owner: Any, policy: Any, seq: int = 0, committed: int = 0):
        self.owner = owner
        self.policy = policy
        self.pending: list[Call] = []
        self.seq = seq                      # calls started
        self.committed = committed          # calls committed
        self.broken = False                 # a failure noted (the communicator revoked)
        self.noticed: float | None = None   # when this rank noticed it
        self.events = 0                     # votes, commits, failures: progress to a waiter
        # calls started and not yet completed by the caller's Test (True) or Wait, returned
        # or raised: while any is, new calls keep the frame (the communicator's
        # ``call_members``), whatever recoveries happen meanwhile
        self.outstanding: set[int] = set()

    def enter(self, prepared: CollectiveCall) -> Call:
        """Keep ``prepared`` as the next call and start its first attempt; the agreement
        refusing its arguments raises here with the call taken out again."""
        self.seq += 1
        call = Call(self, self.seq, prepared)
        self.pending.append(call)
        self.outstanding.add(call.seq)
        with self.owner.heartbeat.watching():
            try:
                self.policy.attempt(call)
                self.advance(starting=True)
            except (ArgumentMismatch, RemoteArgumentError):
                self.pending.remove(call)
                self.outstanding.discard(call.seq)
                raise
        return call

    def restart(self) -> None:
        """Start every uncommitted call again (after a recovery), in call order."""
        for call in self.pending:
            self.policy.attempt(call)

    def note_failure(self, exc: BaseException | None = None) -> None:
        """Remember that this communicator is broken and make every other rank notice."""
        if self.broken:
            return
        self.broken = True
        self.noticed = time.time()
        self.events += 1
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            self.owner.comm.Revoke()
        recorder = self.owner.recorder  # None while the base class constructs
        if recorder is not None:
            what = f"{type(exc).__name__}: {exc}" if exc is not None else "a peer's revoke"
            with contextlib.suppress(OSError):
                recorder.dump(f"fault-tolerant communicator noticed a failure ({what})")

    def recovered(self) -> None:
        """The members changed (a shrink or a mask): no failure is outstanding."""
        self.broken = False
        self.noticed = None
        self.events += 1

    def advance(self, starting: bool = False) -> None:
        """Advance every pending call, then settle agreements in call order. ``starting``:
        inside a start, which commits what it can but leaves a 0 vote's recovery to the next
        ``Test``/``Wait`` (a start never changes the members)."""
        self.policy.check_vanished()
        comm = self.owner.comm
        if not self.broken:
            for call in self.pending:
                run = call.run
                if run is None or call.ok:
                    continue
                before = run.progress
                try:
                    call.ok = run.test()
                except MPI.Exception as exc:
                    if not is_failure(exc, comm):
                        raise
                    self.note_failure(exc)
                    break
                if call.ok or run.progress != before:
                    self.events += 1
        while self.pending:
            head = self.pending[0]
            if head.agree is None:
                if not (head.ok or self.broken):
                    return
                head.vote = np.array([1 if head.ok else 0], dtype=np.intc)
                head.agree = comm.Iagree(head.vote)
            try:
                done = head.agree.Test()
            except MPI.Exception as exc:
                if not is_failure(exc, comm):
                    raise
                # the vote was still agreed (and written); remember the failure it reports
                self.note_failure(exc)
                done = True
            if not done:
                return
            if head.vote[0] == 1:
                self.events += 1
                self._commit(head)
            else:
                if not starting:
                    self.events += 1
                    self.policy.recover()
                return

    def defer_behind_holder(self, call: Call) -> None:
        """As the plain communicator's calls (``bmlmpi.progress.Progress.start``): ``call``'s
        new run posts nothing while an earlier pending call's run on the same communicator
        holds its tags (tag slots cycle), or the two would take each other's messages. Runs
        of an earlier attempt are on another communicator and do not count."""
        defer_behind(call.run, itertools.takewhile(
            lambda run: run is not call.run, (c.run for c in self.pending)))

    def _commit(self, call: Call) -> None:
        self.pending.pop(0)
        self.committed += 1
        call.effective.finish(call.size)
        call.committed = True
        self.owner.call_log.done(call.slot)

    def drain(self) -> None:
        """Let the abandoned attempts' requests complete (with errors, once revoked) so that
        nothing lands in a buffer after its call starts again; at most ``min(timeout, 10)``
        seconds for all the pending calls together, however many are outstanding."""
        left = [r for call in self.pending if call.run is not None
                for r in (call.run.reqs or ())]

        def drained() -> bool:
            nonlocal left
            left = [r for r in left if not request_done(r)]
            return not left
        poll_until(drained, min(self.owner.timeout, 10.0))

    def progress_mark(self) -> tuple:
        """What changes when the pending calls advance (for a waiter's deadline)."""
        return (self.events, tuple(c.run.progress if c.run is not None else -1
                                   for c in self.pending))

    def test(self, call: Call) -> bool:
        try:
            with self.owner.heartbeat.watching():
                self.advance()
            if call.committed:
                self.outstanding.discard(call.seq)
                self._raise_outcome(call)
        except BaseException as exc:
            self.outstanding.discard(call.seq)
            self.owner.call_log.failed(call.slot, exc, call.run)
            raise
        return call.committed

    @staticmethod
    def _raise_outcome(call: Call) -> None:
        """A committed call whose contract raises on every survivor (:mod:`.family`)."""
        error = call.effective.outcome()
        if error is not None:
            raise error

    def wait(self, call: Call) -> None:
        owner = self.owner

        def describe(t: float) -> str:
            head = self.pending[0] if self.pending else None
            where = "nothing"
            if head is not None:
                if head.agree is not None:
                    where = f"the agreement on call {head.seq}"
                elif head.run is not None and not head.ok:
                    where = head.run.describe_timeout(t)
                else:
                    where = f"call {head.seq} (communicator revoked: {self.broken})"
            hint = ("" if owner.ulfm else
                    "; this MPI may not implement ULFM, so a failed rank is never reported")
            return (f"bmlmpi fault-tolerant communicator (rank {owner.rank} of {owner.size}): "
                    f"no progress in {t:g} s; waiting on {where}{hint}")

        try:
            with owner.heartbeat.watching():
                wait_for(lambda: (self.advance(), call.committed)[1], owner.timeout, describe,
                         progress=self.progress_mark)
            self.outstanding.discard(call.seq)
            self._raise_outcome(call)
        except BaseException as exc:
            self.outstanding.discard(call.seq)
            self.owner.call_log.failed(call.slot, exc, call.run)
            raise
