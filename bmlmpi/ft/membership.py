"""Membership of the fault-tolerant communicator: who is still taking part.

* **Shrink** (:meth:`Membership.shrink`): after a 0 vote every survivor lets the abandoned
  requests complete (with errors, the communicator being revoked), shrinks the communicator
  (the lost ranks are the old group minus the new one, the same on all), reconciles, runs
  ``on_failure`` and starts every uncommitted call again over the survivors, restoring each
  call's input first. ``MPI_Comm_ishrink`` fails with ``MPI_ERR_INTERN`` in Open MPI 5.0 (its
  libnbc schedule aborts on the revoked communicator), so the blocking ``MPI_Comm_shrink`` runs
  in a helper thread (:func:`deadline_call`, with ``MPI_THREAD_MULTIPLE``, mpi4py's default)
  while the caller waits on it against the deadline.
* **Adopt** (:meth:`bmlmpi.ft.policy.FaultTolerantPolicy.adopt`, through the communicator's
  public ``adopt_comm``): the survivors' communicator becomes the communicator's own; the cached
  plans, choices and argument checks are dropped; the link-weight matrix keeps the survivors'
  rows.
* **Reconcile** (:meth:`Membership.reconcile`): every survivor must have committed the same
  calls, or :class:`~bmlmpi.ft.errors.FaultToleranceError`.
* **Mask** (:meth:`Membership.mask`): a failed link is handled as the failure of one of its
  servers (the BML slides); the masked rank stops taking part.
* **Vanished** ranks (:meth:`Membership.check_vanished`): the heartbeat saw a process gone that
  MPI never reported (a non-zero exit): the survivors cannot agree to drop it and raise
  ``FaultToleranceError``.

:class:`Membership` is an object the :class:`~bmlmpi.ft.communicator.FaultTolerantCommunicator`
owns: it holds the members (the original rank of each current rank), the original ranks lost,
the recovery records and whether this rank is masked. It reads the communicator's public side
(``comm``, ``heartbeat``, ``rank``, ``size``, ``timeout``); the communicator adopts what it
finds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..execute import wait_for, wait_request
from .errors import FaultToleranceError, is_failure

#: One line per survived failure, from the survivors' rank 0 (Python's last-resort handler
#: prints it on stderr when the program configured no logging).
log = logging.getLogger("bmlmpi.ft")


@dataclass
class RecoveryRecord:
    """One recovery, with wall-clock times (``time.time()``) for measurements."""

    lost: tuple[int, ...]      # original ranks
    noticed: float             # this rank saw the failure (or the 0 vote, if it saw nothing)
    agreed: float              # the vote came back 0
    shrunk: float              # the survivors' communicator exists
    size: int                  # survivors


def deadline_call(fn: Callable[[], Any], what: str, timeout: float) -> Any:
    """Run a blocking MPI call under the deadline: in a helper thread when the MPI library
    allows calls from any thread, else directly (the heartbeat still fences hung peers)."""
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        try:
            return fn()
        except MPI.Exception as exc:
            raise FaultToleranceError(f"{what} failed: {exc.Get_error_string()}") from exc
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    helper = threading.Thread(target=target, name="bmlmpi-blocking", daemon=True)
    helper.start()
    wait_for(lambda: not helper.is_alive(), timeout,
             lambda t: f"bmlmpi: {what} did not finish within {t:g} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, MPI.Exception):
            raise FaultToleranceError(f"{what} failed: {exc.Get_error_string()}") from exc
        raise exc
    return box["value"]


class Membership:
    """Shrinks, reconciles and masks the members of ``owner``, the fault-tolerant
    communicator of ``size`` original ranks (module docstring)."""

    def __init__(self, owner: Any, size: int):
        self.owner = owner
        self.members = list(range(size))   # original rank of each current rank
        self.failed: tuple[int, ...] = ()   # original ranks lost
        self.recoveries: list[RecoveryRecord] = []
        self.masked = False                 # this rank was masked out

    def shrink(self) -> tuple[MPI.Comm, list[int], tuple[int, ...]]:
        """The survivors' communicator (collective over the survivors of the revoked one),
        their original ranks in its rank order, and the original ranks lost."""
        old = self.owner.comm
        # MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0 (its libnbc schedule
        # aborts on the revoked communicator); the blocking shrink works.
        new = deadline_call(old.Shrink, "shrinking the communicator to the survivors",
                            self.owner.timeout)
        translated = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())),
                                               old.Get_group())
        members = [self.members[r] for r in translated]
        return new, members, tuple(sorted(set(self.members) - set(members)))

    def positions(self, members: list[int]) -> list[int]:
        """The current ranks of ``members`` (original ranks)."""
        return [self.members.index(m) for m in members]

    def adopt(self, members: list[int], lost: tuple[int, ...]) -> None:
        """``members`` (in current rank order) take part from now on; ``lost`` are gone."""
        self.members = members
        self.failed = tuple(sorted(set(self.failed) | set(lost)))

    def regrown(self, size: int) -> None:
        """Every original rank takes part again (:mod:`.grow`)."""
        self.members = list(range(size))
        self.failed = ()

    def recovered(self, record: RecoveryRecord, how: str) -> None:
        """Keep ``record`` of a survived loss (``how`` the ranks went) and say so."""
        self.recoveries.append(record)
        self._account(record.lost, how)

    def _account(self, lost: tuple[int, ...], how: str) -> None:
        """bmlmpi's own line about a survived failure, on the survivors' rank 0 (the MPI
        library's lines about it are left out by ``bmlmpi-run --ft``)."""
        owner = self.owner
        if lost and owner.rank == 0:
            ranks = ", ".join(str(r) for r in lost)
            log.warning("bmlmpi: rank %s %s; %d of %d ranks carry on", ranks, how,
                        owner.size, owner.original_size)

    def reconcile(self, committed: int, pending: int, tags: int) -> int:
        """Every survivor must have committed the same calls; say so loudly if not. Returns
        where the next attempt's tags begin.

        Survivors may have *started* different numbers of calls (a rank that lagged had not
        yet started the last ones when the failure came): calls commit in start order, so
        the pending calls of every survivor are a prefix of the same sequence, and each
        starts the ones it has not started yet later, in order, as the others did. What
        must agree is where the next attempt's tags begin: the launch count ``tags`` becomes
        the largest (the next attempts then use the same tags on every survivor)."""
        comm = self.owner.comm
        mine = np.array([committed, pending, tags], dtype=np.int64)
        every = np.empty((self.owner.size, 3), dtype=np.int64)
        req = comm.Iallgather(mine, every)
        state = {"failed": False}

        def done() -> bool:
            try:
                return req.Test()
            except MPI.Exception as exc:
                if not is_failure(exc, comm):
                    raise
                state["failed"] = True  # another failure: the next attempt's vote handles it
                return True

        wait_for(done, self.owner.timeout,
                 lambda t: f"bmlmpi: survivors did not compare states within {t:g} s")
        if state["failed"]:
            return tags
        if (every[:, 0] == every[0, 0]).all():
            return int(every[:, 2].max())
        raise FaultToleranceError(f"survivors disagree on the allreduces committed before "
                                  f"the failure (committed, pending per rank: "
                                  f"{every[:, :2].tolist()})")

    def check_vanished(self) -> None:
        """Raise when the heartbeat saw a member gone that MPI never reported."""
        vanished = self.owner.heartbeat.vanished
        if not vanished:
            return
        comm = self.owner.comm
        failed = set()
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            group = comm.Get_failed()
            n = group.Get_size()
            if n:
                idx = MPI.Group.Translate_ranks(group, list(range(n)), comm.Get_group())
                failed = {self.members[i] for i in idx if i != MPI.UNDEFINED}
        for peer, why in list(vanished.items()):
            if peer not in self.members or peer in failed:
                vanished.pop(peer, None)
                continue
            raise FaultToleranceError(
                f"{why}, but MPI never reported it (Open MPI's runtime does not report a rank "
                f"that exits with a non-zero status), so the survivors cannot agree to drop "
                f"it. End ranks with bmlmpi.ft.finish() or bmlmpi.ft.install_exit_handlers().")

    def mask(self, victim: int) -> MPI.Comm | None:
        """Agree with the other members on excluding original rank ``victim``: the
        communicator of the others (collective), or None on ``victim`` itself, which is then
        masked out."""
        owner = self.owner
        if victim not in self.members:
            raise ValueError(f"original rank {victim} is not a member (members: "
                             f"{self.members})")
        if owner.size == 1:
            raise ValueError("cannot mask the last member")
        comm = owner.comm
        vec = np.array([victim, -victim], dtype=np.int64)
        res = np.empty_like(vec)
        wait_request(comm.Iallreduce(vec, res, MPI.MAX), owner.timeout,
                     "bmlmpi mask_rank: members did not agree")
        if res[0] != -res[1]:
            raise ValueError("members named different ranks to mask")
        if self.members[owner.rank] == victim:
            self.masked = True
            return None
        group = MPI.Group.Excl(comm.Get_group(), [self.members.index(victim)])
        return deadline_call(lambda: comm.Create_group(group),
                             f"masking original rank {victim}", owner.timeout)
