"""Growing back to the full shape: spawned processes take the places of failed ranks (ULFM).

After failures the survivors run on N−x ranks (a fresh schedule, or the BML slides' BCube-
preserving recovery schedule) for as long as the job lasts. :meth:`Growth.replace_failed`
gives the job its shape back: the survivors spawn one process per lost original rank, each
takes over the BCube address (the original rank) of the rank it replaces, receives the
current model state from a survivor, and every later call runs the full BCube(n, k) schedule
again. The spawned side enters through :func:`join`.

Protocol (every wait against the communicator's ``timeout``; the blocking MPI calls —
Open MPI 5 has no non-blocking spawn, merge or split — run in the helper thread of
:meth:`~bmlmpi.ft.membership.Membership._deadline_call` while the caller waits on the deadline):

1. **Spawn.** The members call ``MPI_Comm_spawn`` (collective over the survivors'
   communicator, root = current rank 0, the *donor*) for x processes running ``command
   args`` — by default this process's own command line (``sys.orig_argv``), so the program
   itself calls :func:`join` — in this working directory.
2. **Introduce.** Over the intercommunicator the donor sends spawned process i (spawn order)
   its settings: the i-th lost original rank (ascending), the original size and BCube shape,
   algorithm, recovery mode, deadline, validation, the heartbeat's token, period and hang
   timeout, and the ledger's counters.
3. **Merge and order.** Both sides merge the intercommunicator and split the result with the
   original rank as key: rank r of the new communicator is original rank r again, so the
   BCube addresses are the original job's.
4. **Rebuild.** Every process runs the plain communicator's construction on the new
   communicator (a private duplicate, link weights from MPI placement, calibration where
   ``auto`` wants it), the survivors and the replacements alike; the members are all the
   original ranks, ``failed`` is empty, the shape is the original BCube, cached plans are
   gone, and the heartbeat watches everyone.
5. **Hand over.** The donor sends ``state`` (pickled) to every replacement; :func:`join`
   returns it.
6. **Agree.** A closing ``MPI_Comm_iagree`` over the new communicator.

Cost: one process start (an interpreter with numpy, mpi4py and bmlmpi imported: about a
second here, measured in ``perf/ft/grow.py``), a few collectives, and one message of the
state's size per replacement.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ..api import Communicator
from ..execute import wait_for, wait_request
from .errors import FaultToleranceError, is_failure

GROW_TAG = 30_001          # settings and state messages (their own communicators: no clash)
_MAGIC = "bmlmpi-replacement-1"


@dataclass
class GrowRecord:
    """One grow-back, with wall-clock times (``time.time()``) for measurements."""

    replaced: tuple[int, ...]  # original ranks given back to the job
    started: float             # replace_failed entered (join: settings received)
    spawned: float             # the replacements exist (the intercommunicator)
    rebuilt: float             # the full communicator exists on this rank
    done: float                # state handed over and the closing agreement passed
    size: int                  # members afterwards (the original size)
    joined: bool = False       # this process was the replacement (its record from join)


class Joined(NamedTuple):
    """What :func:`join` returns to a replacement process."""

    comm: Any                  # the FaultTolerantCommunicator, at the replaced rank
    state: Any                 # what the survivors passed to replace_failed


def _send(comm: MPI.Comm, obj: Any, dest: int, timeout: float, what: str) -> None:
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    wait_request(comm.Isend(data, dest=dest, tag=GROW_TAG), timeout, what)


def _receive(comm: MPI.Comm, source: int, timeout: float, what: str) -> Any:
    """A pickled object of unknown length: matched probe, then receive (both bounded)."""
    box: dict[str, MPI.Message] = {}
    status = MPI.Status()

    def arrived() -> bool:
        msg = comm.Improbe(source=source, tag=GROW_TAG, status=status)
        if msg is not None:
            box["msg"] = msg
        return msg is not None

    wait_for(arrived, timeout, lambda t: f"bmlmpi: {what} did not arrive within {t:g} s")
    data = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
    wait_request(box["msg"].Irecv(data), timeout, f"bmlmpi: {what} was not received")
    return pickle.loads(data.tobytes())


class Growth:
    """Replaces the failed ranks with spawned processes (part of the fault-tolerant
    communicator; see the module docstring)."""

    def replace_failed(self, state: Any = None, *, command: str | None = None,
                       args: Sequence[str] | None = None) -> tuple[int, ...]:
        """Spawn one process per failed (or masked) original rank and go back to the full
        communicator: afterwards ``size`` is the original size, ``rank`` the original rank,
        ``failed`` empty and bml runs the full BCube schedule. Returns the original ranks
        replaced (``()`` without collectives when nothing failed). ``state`` (any picklable
        object, e.g. the model's parameters) is handed from current rank 0 to every
        replacement, whose :func:`join` returns it. ``command``/``args`` (default: this
        process's interpreter and command line) start the replacement program, which must
        call :func:`join` before anything else that communicates.

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
        if self._pending:
            raise RuntimeError("replace_failed with allreduces outstanding; Wait them first")
        lost = tuple(sorted(self.failed))
        if not lost:
            return ()
        started = time.time()
        program = command or sys.executable
        argv = list(sys.orig_argv[1:] if args is None else args)
        with self._hb.watching():
            info = MPI.Info.Create()
            info.Set("wdir", os.getcwd())
            try:
                inter = self._deadline_call(
                    lambda: self._comm.Spawn(program, argv, maxprocs=len(lost), info=info,
                                             root=0),
                    f"spawning {len(lost)} replacement(s) for original rank(s) {list(lost)}")
            except FaultToleranceError as exc:
                raise FaultToleranceError(f"{exc}; the communicator is unchanged") from exc
            finally:
                info.Free()
            inter.Set_errhandler(MPI.ERRORS_RETURN)
            spawned = time.time()
            donor = self._members[0]
            if self.rank == 0:
                for i, replaced in enumerate(lost):
                    _send(inter, self._settings(replaced, donor), i, self.timeout,
                          f"bmlmpi: the settings of the replacement for rank {replaced}")
            old = self._comm
            self._rejoin(inter, high=False, algorithm=self.algorithm, shape=self.home_shape,
                         validate=self.validate)
            with contextlib.suppress(MPI.Exception):
                old.Free()
            self.failed = ()
            self._hb.watch(self._members)
            rebuilt = time.time()
            if self.original_rank == donor:
                for replaced in lost:
                    _send(self._comm, state, replaced, self.timeout,
                          f"bmlmpi: the state for the replacement of rank {replaced}")
            self._agree_grown()
        self.regrowths.append(GrowRecord(lost, started, spawned, rebuilt, time.time(),
                                         self.size))
        return lost

    # -- both sides --------------------------------------------------------------------------
    def _settings(self, replaced: int, donor: int) -> dict[str, Any]:
        return {"magic": _MAGIC, "rank": replaced, "size": self.original_size,
                "shape": tuple(self.home_shape), "algorithm": self.algorithm,
                "recovery": self.recovery, "timeout": self.timeout, "validate": self.validate,
                "token": self._token, "period": self._hb.period,
                "hang": self._hb.hang_timeout, "ulfm": self.ulfm, "seq": self._seq,
                "committed": self._committed, "donor": donor}

    def _rejoin(self, inter: MPI.Intercomm, *, high: bool, algorithm: str,
                shape: Sequence[int], validate: bool) -> None:
        """Merge, order by original rank, and build the communicator over everyone."""
        me = self.original_rank
        merged = self._deadline_call(lambda: inter.Merge(high=high),
                                "merging the survivors and the replacements")
        full = self._deadline_call(lambda: merged.Split(0, me),
                              "ordering the grown communicator by original rank")
        # the plain communicator's construction, the same on survivors and replacements
        self._deadline_call(lambda: Communicator.__init__(self, full, algorithm, tuple(shape),
                                                     timeout=self.timeout, validate=validate),
                       "building the grown communicator")
        for c in (full, merged, inter):
            with contextlib.suppress(MPI.Exception):
                c.Free()
        if self.rank != me:
            raise FaultToleranceError(f"the grown communicator put original rank {me} at rank "
                                      f"{self.rank}")
        self._members = list(range(self.size))

    def _agree_grown(self) -> None:
        flag = np.array([1], dtype=np.intc)
        try:
            wait_request(self._comm.Iagree(flag), self.timeout,
                         "bmlmpi: the grown communicator's closing agreement")
        except MPI.Exception as exc:
            if not is_failure(exc, self._comm):
                raise
            self._note_failure(exc)  # the next call recovers from it

    # -- the replacement's side ----------------------------------------------------------------
    @classmethod
    def from_parent(cls, parent: MPI.Intercomm, timeout: float,
                    on_failure: Callable[[Any, tuple[int, ...]], None] | None) -> Joined:
        """The replacement's communicator, grown from the survivors that spawned it over
        ``parent`` (what :func:`bmlmpi.ft.join` builds)."""
        started = time.time()
        settings = _receive(parent, 0, timeout, "the survivors' settings for this replacement")
        if not isinstance(settings, dict) or settings.get("magic") != _MAGIC:
            raise FaultToleranceError("bmlmpi.ft.join: the parent job did not send bmlmpi "
                                      "replacement settings")
        self = object.__new__(cls)
        self.timeout = float(settings["timeout"])
        self.ulfm = settings["ulfm"]
        self.original_rank = settings["rank"]
        self.original_size = settings["size"]
        self.home_shape = tuple(settings["shape"])
        self.recovery = settings["recovery"]
        self.on_failure = on_failure
        spawned = time.time()
        self._rejoin(parent, high=True, algorithm=settings["algorithm"],
                     shape=self.home_shape, validate=settings["validate"])
        self._init_ledger()
        self._seq = settings["seq"]
        self._committed = settings["committed"]
        self._start_heartbeat(settings["token"], settings["period"], settings["hang"],
                              replacement=True)
        rebuilt = time.time()
        with self._hb.watching():
            state = _receive(self._comm, settings["donor"], self.timeout,
                             "the model state from the survivors")
            self._agree_grown()
        self.regrowths.append(GrowRecord((self.original_rank,), started, spawned, rebuilt,
                                         time.time(), self.size, joined=True))
        return Joined(self, state)
