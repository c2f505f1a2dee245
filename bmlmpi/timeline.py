"""``BMLMPI_TIMELINE=DIR``: a Chrome-trace timeline (open it in https://ui.perfetto.dev or
``chrome://tracing``) of every call of every communicator of this rank and of every step of
the schedules they run.

Each rank writes ``DIR/timeline-<host>-p<pid>-w<world rank>.json`` when the process exits (and
on :func:`write`): one track per rank (``pid`` = world rank), one row per lane of a schedule
(``tid``; a lockstep schedule has one). A call is one span (its collective, algorithm, bytes,
sequence number and state in its arguments), drawn from the flight recorder's start and end
times; inside it, each step of a schedule is cut into ``post`` (copies from the input it must
make first, then its ``Irecv``/``Isend`` posted), ``wait`` (until its receives are in),
``reduce`` (its reductions, where the step reduces; the blocking path of a one-lane schedule
then waits for the step's sends: a second ``wait``) and, at the end of a run with a separate
input, ``copy`` (the ranges still taken from the input). A native call is one span: MPI runs
it. ``bmlmpi-trace --timeline DIR`` (:func:`bmlmpi.cli.trace.merge_timelines`, which needs no
MPI) merges the ranks' files into one. Times are the wall
clock (``time.time``), the same clock on all ranks of a node.

The steps come from a :class:`~bmlmpi.execute.RunObserver` installed for the whole process
while the timeline is on; off (the default), nothing here runs. On, it keeps every event in
memory until written (about 200 bytes each; at most ``MAX_EVENTS``, the rest counted as
dropped), so it is for looking at a run, not for leaving on in production.

Core layer: imports :mod:`bmlmpi.config`, :mod:`bmlmpi.execute` and :mod:`bmlmpi.recorder`.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
from pathlib import Path
from typing import Any

from . import config
from .execute import Run, RunObserver, install_observer
from .recorder import EPOCH, FlightRecorder, Slot, file_slug, now, world_rank

MAX_EVENTS = 2_000_000
_US = 1e6


class Timeline(RunObserver):
    """This process's timeline: the calls the recorders hand it and the steps it observes."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self.rank = world_rank()
        self._open: dict[tuple[int, int], float] = {}  # (run, lane) -> when its phase began

    # -- events ---------------------------------------------------------------------------
    def _span(self, name: str, t0: float, t1: float, tid: int, args: dict[str, Any]) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append({"name": name, "ph": "X", "ts": (t0 + EPOCH) * _US,
                            "dur": max(0.0, (t1 - t0) * _US), "pid": self.rank, "tid": tid,
                            "args": args})

    def call(self, rec: FlightRecorder, s: Slot) -> None:
        """A call ended (done or failed): its span."""
        sig = s.sig
        end = abs(s.t1)
        nbytes = ""
        if sig.count is not None and sig.dtype is not None:
            import numpy as np
            nbytes = f" {sig.count * np.dtype(sig.dtype).itemsize} B"
        name = f"{sig.collective} {sig.chosen or sig.asked}{nbytes}"
        self._span(name, s.t0, end, 0, {
            "seq": s.seq, "comm": rec.index, "count": sig.count, "dtype": sig.dtype,
            "op": sig.op, "root": sig.root, "asked": sig.asked, "algorithm": sig.chosen,
            "state": "failed" if s.t1 < 0 else "done"})

    def _phase(self, run: Run, lane: int, name: str, t: float, what: str = "") -> None:
        key = (id(run), lane)
        t0 = self._open.get(key)
        self._open[key] = t
        if t0 is None or not name:
            return
        st = run.plan.lanes[lane][run.pos[lane]]
        args = {"step": st.index + 1, "of": run.plan.nsteps,
                "recv_from": sorted({p.world_peer for p in st.recvs}),
                "send_to": sorted({p.world_peer for p in st.sends})}
        if what:
            args["for"] = what
        self._span(name, t0, t, lane, args)

    # RunObserver: post -> posted -> received -> complete, per lane step
    def post(self, run: Run, lane: int) -> None:
        self._open[(id(run), lane)] = now()

    def posted(self, run: Run, lane: int) -> None:
        self._phase(run, lane, "post", now())

    def received(self, run: Run, lane: int) -> None:
        self._phase(run, lane, "wait", now(), "receives")

    def sent(self, run: Run, lane: int) -> None:
        self._phase(run, lane, "wait", now(), "sends")

    def complete(self, run: Run, lane: int) -> None:
        reduces = run.prog[lane][run.pos[lane]].reduces
        self._phase(run, lane, "reduce" if reduces else "", now())

    def finishing(self, run: Run) -> None:
        for lane in range(len(run.prog)):
            self._open.pop((id(run), lane), None)
        if run.src is not None and run.plan.deferred().final:
            self._open[(id(run), -1)] = now()

    def finished(self, run: Run) -> None:
        t0 = self._open.pop((id(run), -1), None)
        if t0 is not None:
            self._span("copy", t0, now(), 0, {"what": "ranges still taken from the input"})

    # -- output ---------------------------------------------------------------------------
    def path(self) -> Path:
        return self.directory / (f"timeline-{file_slug(socket.gethostname())}-p{os.getpid()}"
                                 f"-w{self.rank}.json")

    def document(self) -> dict[str, Any]:
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank} ({socket.gethostname()}, pid "
                                  f"{os.getpid()})"}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank,
                 "args": {"sort_index": self.rank}}]
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ms",
                "otherData": {"rank": self.rank, "host": socket.gethostname(),
                              "pid": os.getpid(), "dropped": self.dropped}}

    def write(self) -> Path:
        target = self.path()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.document()))
        os.replace(tmp, target)
        return target


_timeline: list[Timeline | None] = [None]


def current() -> Timeline | None:
    """The process's timeline, if ``BMLMPI_TIMELINE`` turned one on."""
    return _timeline[0]


def attach(rec: FlightRecorder) -> None:
    """Feed ``rec``'s calls to the process's timeline when ``BMLMPI_TIMELINE`` is set (the
    first communicator starts it: the step observer, and the file written at exit)."""
    directory = config.get("BMLMPI_TIMELINE")
    if directory is None:
        return
    tl = _timeline[0]
    if tl is None:
        tl = _timeline[0] = Timeline(directory)
        install_observer(tl)
        atexit.register(_write_at_exit)
    rec.timeline = tl


def write() -> Path | None:
    """Write the process's timeline now (it is also written at exit); its path, or None."""
    tl = _timeline[0]
    return None if tl is None else tl.write()


def _write_at_exit() -> None:
    try:
        write()
    except OSError as exc:
        os.write(2, f"bmlmpi timeline: could not write it: {exc}\n".encode())
