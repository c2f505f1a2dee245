"""The pipeline's side of the flight recorder (:mod:`bmlmpi.recorder`): a call entered, its
end, a call refused before it had a record, the call in progress the watchdog names.

The parts that start or end a call on the checked path (the checked launch, the progress
engine, persistent calls, the fault-tolerant ledger) are handed the communicator and write
through its :class:`CallLog` (``Communicator.call_log``), so that a communicator whose
recorder is off (``BMLMPI_TRACE_CALLS=0``) costs each of them one ``None`` test and no
branch of their own. The fast path fills its slots inline (the 8 B hot path) and the
compression layer records its calls itself.
"""

from __future__ import annotations

from typing import Any

from .calls import CollectiveCall, earns_dump
from .fast_path import FAST_OPS
from .ops import op_name
from .recorder import FlightRecorder, Signature, Slot


class CallLog:
    """What the pipeline writes to one communicator's flight recorder (None: it is off)."""

    __slots__ = ("recorder", "__weakref__")  # the watchdog holds it weakly

    def __init__(self, recorder: FlightRecorder | None) -> None:
        self.recorder = recorder

    def record(self, call: CollectiveCall) -> Slot | None:
        """Enter ``call`` in the flight recorder (its slot, also kept as ``call.slot``; None
        when the recorder is off)."""
        rec = self.recorder
        call.slot = None if rec is None else rec.begin(call.traced())
        return call.slot

    def done(self, slot: Slot | None) -> None:
        """Record that ``slot``'s call completed (None: the recorder is off)."""
        if slot is not None:
            self.recorder.done(slot)

    def failed(self, slot: Slot | None, exc: BaseException, run: Any = None) -> None:
        """Record that ``slot``'s call raised ``exc``; dump the recorder where the failure
        earns it (:func:`bmlmpi.calls.earns_dump`: a hang or a failure between ranks, not a
        refused argument)."""
        rec = self.recorder
        if rec is None or slot is None:
            return
        rec.failed_call(slot, exc, run, dump=earns_dump(exc))

    def refused(self, collective: str, algorithm: str, op: Any, exc: BaseException) -> None:
        """A call this rank refused before it was prepared: recorded (failed) all the same,
        so that the sequence numbers of every rank's recorder stay in step."""
        rec = self.recorder
        if rec is not None:
            name = op_name(op) if id(op) in FAST_OPS else None
            self.failed(rec.begin(Signature(collective, None, None, name, None, algorithm,
                                            None)), exc)

    def in_progress(self) -> int | None:
        """The number of the newest call that has not ended (as its exceptions and the
        flight recorder number it); None when none is running or the recorder is off."""
        rec = self.recorder
        if rec is None:
            return None
        running = [s.seq for s in rec.slots if s.seq > 0 and s.t1 == 0.0]
        return max(running) if running else None

    def watchdog_fired(self, report: str) -> None:
        """The watchdog is about to abort the job (its thread): the blocked call is failed in
        the recorder, which is dumped."""
        rec = self.recorder
        if rec is None:
            return
        running = [s for s in rec.slots if s.seq > 0 and s.t1 == 0.0]
        if running:
            rec.fail(max(running, key=lambda s: s.seq), TimeoutError(report))
        try:
            rec.dump("watchdog abort")
        except OSError:
            pass


__all__ = ["CallLog"]
