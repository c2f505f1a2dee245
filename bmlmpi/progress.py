"""The plain communicator's outstanding calls: each started call's record
(:class:`Outstanding`, behind its :class:`~bmlmpi.handles.Request`) and the engine that
advances them all, oldest first, inside any request's ``Test``/``Wait``, under the
communicator's deadline (:class:`Progress`).

The engine calls the objects it is handed: the communicator (``owner``: its ``rank``,
``timeout``, its ``policy``'s progress mark, and its flight recorder through its
``call_log``, :class:`~bmlmpi.call_log.CallLog`) and its call agreement (``agreement``, a
:class:`~bmlmpi.call_agreement.CallAgreement`: the notices' check for a call, what a call
given up at its deadline tells the others, the runs MPI may still use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .call_gate import CallGate
from .execute import DeadlineExceeded, Run, wait_for
from .executors import busy_poll, defer_behind
from .handles import NativeRun
from .recorder import Slot
from .shm import ShmRun


class Outstanding:
    """A started call of the plain communicator, polled until its run completes."""

    __slots__ = ("engine", "run", "done", "seq", "failed", "slot")

    def __init__(self, engine: Progress, run: Run | ShmRun | NativeRun, seq: int,
                 slot: Slot | None = None):
        self.engine = engine
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
                self.engine.owner.call_log.failed(self.slot, exc, self.run)
                raise
            if self.done:
                self.engine.owner.call_log.done(self.slot)
        return self.done

    def test(self) -> bool:
        return self.engine.owning(self.engine.test, self)

    def wait(self) -> None:
        self.engine.owning(self.engine.wait, self)


class Progress:
    """The outstanding calls of one communicator (``owner``, the
    :class:`~bmlmpi.api.Communicator`), in start order (:attr:`active`: the communicator
    reads it too, to know whether any call is outstanding); ``agreement``: its
    :class:`~bmlmpi.call_agreement.CallAgreement`."""

    def __init__(self, owner: Any, gate: CallGate, active: list[Outstanding],
                 agreement: Any):
        self.owner = owner
        self.gate = gate
        self.agreement = agreement
        self.active = active

    def idle(self) -> bool:
        """Whether no started call is outstanding."""
        return not self.active

    def start(self, run: Run | ShmRun | NativeRun, seq: int, slot: Slot | None) -> Outstanding:
        """The record of call ``seq``, started as ``run``: polled once, then kept in
        :attr:`active` until it completes. A scheduled run whose tags a call still in flight
        holds (the same signature's call ``tag_slots`` calls earlier: tag slots cycle) posts
        nothing until that call completes, since the two would take each other's messages;
        ranks post their calls in one order, so the older call completes without it."""
        if self.active:
            defer_behind(run, (e.run for e in self.active))
        entry = Outstanding(self, run, seq, slot)
        if not entry.poll():
            self.active.append(entry)
        return entry

    def owning(self, fn: Callable[[Outstanding], Any], entry: Outstanding) -> Any:
        """``fn(entry)`` as the thread that owns the communicator's progress."""
        gate = self.gate
        mine = gate.claim(self.owner.rank)
        try:
            return fn(entry)
        finally:
            if mine:
                gate.owner = None

    def test(self, entry: Outstanding) -> bool:
        if entry.failed is not None:
            raise entry.failed
        self.progress()
        if not entry.done:
            self.agreement.interrupt(entry.seq)()
            if entry.failed is not None:
                raise entry.failed
        return entry.done

    def wait(self, entry: Outstanding) -> None:
        if entry.failed is not None:
            raise entry.failed
        if entry.done:
            return
        owner, agreement = self.owner, self.agreement
        check = agreement.interrupt(entry.seq)

        def interrupt() -> None:
            check()
            if entry.failed is not None:
                raise entry.failed
        try:
            wait_for(lambda: (self.progress(), entry.done)[1], owner.timeout,
                     entry.run.describe_timeout, progress=owner.policy.progress_mark,
                     interrupt=interrupt, busy=busy_poll(entry.run))
        except DeadlineExceeded as exc:
            if entry in self.active:
                self.active.remove(entry)
            owner.call_log.failed(entry.slot, exc, entry.run)
            agreement.held.append(entry.run)  # MPI may still use it: kept, not cancelled
            agreement.gave_up(entry.seq, exc)
            raise
        except BaseException as exc:
            # An abandoned call must not be polled by later calls.
            owner.call_log.failed(entry.slot, exc, entry.run)
            if entry in self.active:
                self.active.remove(entry)
                agreement.hold(entry.run)
            raise

    def settle(self) -> None:
        """Complete the outstanding calls that only this process's polling advances (the runs
        of schedules), oldest first, each under its deadline, before a blocking call's checked
        path, whose argument check polls no other call and whose native form
        (:meth:`bmlmpi.fast_path.FastPath.blocking_native`) is MPI's blocking call; MPI's own
        non-blocking calls progress inside those. One that fails keeps its error for its
        request's ``Wait`` and raises it here too: the blocking call is not made."""
        for entry in [e for e in self.active if type(e.run) is not NativeRun]:
            try:
                self.wait(entry)
            except BaseException as exc:
                entry.failed = exc
                raise

    def progress(self) -> None:
        """Advance every outstanding call, oldest first; drop the finished ones."""
        active = self.active
        if active:
            for e in active:
                e.poll()
            active[:] = [e for e in active if not e.done]

    def mark(self) -> tuple[int, ...]:
        """Changes whenever any outstanding call completes a step of any lane."""
        return tuple(e.run.progress for e in self.active)

    def abandon_from(self, seq: int, exc: BaseException) -> None:
        """Calls numbered ``seq`` or later are given up: each raises ``exc`` when waited on;
        their runs are held (:meth:`bmlmpi.call_agreement.CallAgreement.hold`)."""
        keep = []
        for entry in self.active:
            if entry.seq >= seq:
                entry.failed = exc
                self.agreement.hold(entry.run)
            else:
                keep.append(entry)
        self.active[:] = keep
