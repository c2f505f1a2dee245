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

:class:`Ledger` is a part of :class:`~bmlmpi.ft.communicator.FaultTolerantCommunicator`; it
owns ``_pending``, ``_seq``, ``_committed``, ``_broken``, ``_noticed`` and ``_events``.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import numpy as np
from mpi4py import MPI

from ..api import NativeRun, PreparedCall
from ..execute import Run, poll_until, request_done, wait_for
from .errors import is_failure


class Call:
    """One allreduce, tracked until every survivor has committed it: the communicator's
    record behind a :class:`~bmlmpi.ft.communicator.FaultTolerantRequest`."""

    def __init__(self, owner: Ledger, seq: int, prepared: PreparedCall):
        self.owner = owner
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

    def test(self) -> bool:
        return self.owner._test_call(self)

    def wait(self) -> None:
        self.owner._wait_call(self)


class Ledger:
    """Runs, votes on and commits the pending calls, in the order they were started."""

    def _note_failure(self, exc: BaseException | None = None) -> None:
        """Remember that this communicator is broken and make every other rank notice."""
        if self._broken:
            return
        self._broken = True
        self._noticed = time.time()
        self._events += 1
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            self._comm.Revoke()
        recorder = self.recorder  # None while the base class constructs
        if recorder is not None:
            what = f"{type(exc).__name__}: {exc}" if exc is not None else "a peer's revoke"
            with contextlib.suppress(OSError):
                recorder.dump(f"fault-tolerant communicator noticed a failure ({what})")

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

    def _defer_behind_holder(self, call: Call) -> None:
        """As the plain communicator's calls (``bmlmpi.progress.Progress.start``): ``call``'s
        new run posts nothing while an earlier pending call's run on the same communicator
        holds its tags (tag slots cycle), or the two would take each other's messages. Runs
        of an earlier attempt are on another communicator and do not count."""
        if type(call.run) is Run:
            call.run.defer_behind(itertools.takewhile(
                lambda run: run is not call.run, (c.run for c in self._pending)))

    def _commit(self, call: Call) -> None:
        self._pending.pop(0)
        self._committed += 1
        call.effective.finish(call.size)
        call.committed = True
        self._call_done(call.slot)

    def _drain(self, run: Run | NativeRun | None) -> None:
        """Let an abandoned attempt's requests complete (with errors, once revoked) so that
        nothing lands in the buffer after the call starts again."""
        if run is None:
            return
        left = list(run.reqs or ())

        def drained() -> bool:
            nonlocal left
            left = [r for r in left if not request_done(r)]
            return not left
        poll_until(drained, min(self.timeout, 10.0))

    def _progress_mark(self) -> tuple:
        return (self._events, tuple(c.run.progress if c.run is not None else -1
                                    for c in self._pending))

    def _test_call(self, call: Call) -> bool:
        try:
            with self._hb.watching():
                self._advance()
            if call.committed:
                self._raise_outcome(call)
        except BaseException as exc:
            self._call_failed(call.slot, exc, call.run)
            raise
        return call.committed

    @staticmethod
    def _raise_outcome(call: Call) -> None:
        """A committed call whose contract raises on every survivor (:mod:`.family`)."""
        error = call.effective.outcome()
        if error is not None:
            raise error

    def _wait_call(self, call: Call) -> None:
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

        try:
            with self._hb.watching():
                wait_for(lambda: (self._advance(), call.committed)[1], self.timeout, describe,
                         progress=self._progress_mark)
            self._raise_outcome(call)
        except BaseException as exc:
            self._call_failed(call.slot, exc, call.run)
            raise
