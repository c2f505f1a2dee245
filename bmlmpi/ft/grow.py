"""Growing back to the full shape: spawned processes take the places of failed ranks (ULFM).

After failures the survivors run on N−x ranks (a fresh schedule, or the BML slides' BCube-
preserving recovery schedule) for as long as the job lasts. :meth:`Growth.replace_failed`
gives the job its shape back: the survivors spawn one process per lost original rank, each
takes over the BCube address (the original rank) of the rank it replaces, receives the
current model state from a survivor, and every later call runs the full BCube(n, k) schedule
again. The spawned side enters through :func:`join`.

Protocol (every wait against the communicator's ``timeout``; the blocking MPI calls —
Open MPI 5 has no non-blocking spawn, merge or split — run in the helper thread of
:func:`~bmlmpi.ft.membership.deadline_call` while the caller waits on the deadline):

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ..api import Communicator
from ..execute import wait_for, wait_request
from .errors import FaultToleranceError, is_failure
from .membership import deadline_call

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


def receive_settings(parent: MPI.Intercomm, timeout: float) -> dict[str, Any]:
    """The settings the survivors send a replacement they spawned (its first message)."""
    settings = _receive(parent, 0, timeout, "the survivors' settings for this replacement")
    if not isinstance(settings, dict) or settings.get("magic") != _MAGIC:
        raise FaultToleranceError("bmlmpi.ft.join: the parent job did not send bmlmpi "
                                  "replacement settings")
    return settings


def receive_state(comm: Any, donor: int) -> Any:
    """The state the survivors' donor hands a replacement over the grown communicator."""
    return _receive(comm.comm, donor, comm.timeout, "the model state from the survivors")


def rejoin(comm: Any, inter: MPI.Intercomm, *, high: bool, algorithm: str,
           shape: Sequence[int], validate: bool, policy: Any) -> None:
    """Merge ``inter``, order by original rank, and build the fault-tolerant communicator
    ``comm`` over everyone (the plain communicator's construction with ``policy``, the
    fault-tolerant one, the same on survivors and replacements)."""
    me = comm.original_rank
    merged = deadline_call(lambda: inter.Merge(high=high),
                           "merging the survivors and the replacements", comm.timeout)
    full = deadline_call(lambda: merged.Split(0, me),
                         "ordering the grown communicator by original rank", comm.timeout)
    deadline_call(lambda: Communicator.__init__(comm, full, algorithm, tuple(shape),
                                                timeout=comm.timeout, validate=validate,
                                                policy=policy),
                  "building the grown communicator", comm.timeout)
    for c in (full, merged, inter):
        with contextlib.suppress(MPI.Exception):
            c.Free()
    if comm.rank != me:
        raise FaultToleranceError(f"the grown communicator put original rank {me} at rank "
                                  f"{comm.rank}")


def agree_grown(comm: Any, ledger: Any) -> None:
    """The grow's closing agreement over ``comm``'s communicator; a death it reports is noted
    in ``ledger`` (the next call recovers from it)."""
    flag = np.array([1], dtype=np.intc)
    try:
        wait_request(comm.comm.Iagree(flag), comm.timeout,
                     "bmlmpi: the grown communicator's closing agreement")
    except MPI.Exception as exc:
        if not is_failure(exc, comm.comm):
            raise
        ledger.note_failure(exc)


class Growth:
    """Replaces the failed ranks of ``owner`` (the fault-tolerant communicator, whose
    ``ledger`` and ``membership`` it reads and updates) with spawned processes (module
    docstring); ``records``: one :class:`GrowRecord` per grow-back."""

    def __init__(self, owner: Any, ledger: Any, membership: Any):
        self.owner = owner
        self.ledger = ledger
        self.membership = membership
        self.records: list[GrowRecord] = []

    def replace_failed(self, state: Any, command: str | None,
                       args: Sequence[str] | None) -> tuple[int, ...]:
        """What :meth:`~bmlmpi.ft.communicator.FaultTolerantCommunicator.replace_failed`
        does, on a usable communicator."""
        owner = self.owner
        if self.ledger.pending:
            raise RuntimeError("replace_failed with allreduces outstanding; Wait them first")
        lost = tuple(sorted(self.membership.failed))
        if not lost:
            return ()
        started = time.time()
        program = command or sys.executable
        argv = list(sys.orig_argv[1:] if args is None else args)
        with owner.heartbeat.watching():
            info = MPI.Info.Create()
            info.Set("wdir", os.getcwd())
            comm = owner.comm
            try:
                inter = deadline_call(
                    lambda: comm.Spawn(program, argv, maxprocs=len(lost), info=info, root=0),
                    f"spawning {len(lost)} replacement(s) for original rank(s) {list(lost)}",
                    owner.timeout)
            except FaultToleranceError as exc:
                raise FaultToleranceError(f"{exc}; the communicator is unchanged") from exc
            finally:
                info.Free()
            inter.Set_errhandler(MPI.ERRORS_RETURN)
            spawned = time.time()
            donor = self.membership.members[0]
            if owner.rank == 0:
                for i, replaced in enumerate(lost):
                    _send(inter, self._settings(replaced, donor), i, owner.timeout,
                          f"bmlmpi: the settings of the replacement for rank {replaced}")
            rejoin(owner, inter, high=False, algorithm=owner.algorithm, shape=owner.home_shape,
                   validate=owner.validate, policy=owner.policy)
            with contextlib.suppress(MPI.Exception):
                comm.Free()
            self.membership.regrown(owner.size)
            owner.heartbeat.watch(self.membership.members)
            rebuilt = time.time()
            if owner.original_rank == donor:
                for replaced in lost:
                    _send(owner.comm, state, replaced, owner.timeout,
                          f"bmlmpi: the state for the replacement of rank {replaced}")
            agree_grown(owner, self.ledger)
        self.records.append(GrowRecord(lost, started, spawned, rebuilt, time.time(),
                                       owner.size))
        return lost

    def _settings(self, replaced: int, donor: int) -> dict[str, Any]:
        owner, heartbeat = self.owner, self.owner.heartbeat
        return {"magic": _MAGIC, "rank": replaced, "size": owner.original_size,
                "shape": tuple(owner.home_shape), "algorithm": owner.algorithm,
                "recovery": owner.recovery, "timeout": owner.timeout,
                "validate": owner.validate, "token": heartbeat.token,
                "period": heartbeat.period, "hang": heartbeat.hang_timeout, "ulfm": owner.ulfm,
                "seq": self.ledger.seq, "committed": self.ledger.committed, "donor": donor}
