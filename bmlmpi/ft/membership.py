"""Membership of the fault-tolerant communicator: who is still taking part.

* **Shrink** (:meth:`Membership._recover`): after a 0 vote every survivor lets the abandoned
  requests complete (with errors, the communicator being revoked), shrinks the communicator
  (the lost ranks are the old group minus the new one, the same on all), reconciles, runs
  ``on_failure`` and starts every uncommitted call again over the survivors, restoring each
  call's input first. ``MPI_Comm_ishrink`` fails with ``MPI_ERR_INTERN`` in Open MPI 5.0 (its
  libnbc schedule aborts on the revoked communicator), so the blocking ``MPI_Comm_shrink`` runs
  in a helper thread (:meth:`Membership._deadline_call`, with ``MPI_THREAD_MULTIPLE``, mpi4py's
  default) while the caller waits on it against the deadline.
* **Adopt**: the survivors' communicator becomes the communicator's own; the cached plans,
  choices and argument checks are dropped; the link-weight matrix keeps the survivors' rows.
* **Reconcile**: every survivor must have committed the same calls, or
  :class:`~bmlmpi.ft.errors.FaultToleranceError`.
* **Mask** (:meth:`Membership.mask_link`): a failed link is handled as the failure of one of its
  servers (the BML slides); the masked rank stops taking part.
* **Vanished** ranks: the heartbeat saw a process gone that MPI never reported (a non-zero
  exit): the survivors cannot agree to drop it and raise ``FaultToleranceError``.

:class:`Membership` is a part of :class:`~bmlmpi.ft.communicator.FaultTolerantCommunicator`;
it owns ``_members``, ``failed``, ``recoveries`` and ``_masked``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..execute import wait_for, wait_request
from .errors import FaultToleranceError, is_failure
from .recovery import fresh_shape

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


class Membership:
    """Shrinks, adopts, reconciles and masks the members of the communicator."""

    def _recover(self) -> None:
        agreed = time.time()
        noticed = self._noticed or agreed
        for call in self._pending:
            self._drain(call.run)
        old = self._comm
        # MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0 (its libnbc schedule
        # aborts on the revoked communicator); the blocking shrink works.
        new = self._deadline_call(old.Shrink, "shrinking the communicator to the survivors")
        translated = MPI.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())),
                                               old.Get_group())
        members = [self._members[r] for r in translated]
        lost = tuple(sorted(set(self._members) - set(members)))
        self._adopt(new, members, lost)
        self.recoveries.append(RecoveryRecord(lost, noticed, agreed, time.time(), self.size))
        self._account(lost, "died")
        self._reconcile()
        if lost and self.on_failure is not None:
            self.on_failure(self, lost)
        for call in self._pending:
            self._attempt(call)

    def _account(self, lost: tuple[int, ...], how: str) -> None:
        """bmlmpi's own line about a survived failure, on the survivors' rank 0 (the MPI
        library's lines about it are left out by ``bmlmpi-run --ft``)."""
        if lost and self.rank == 0:
            ranks = ", ".join(str(r) for r in lost)
            log.warning("bmlmpi: rank %s %s; %d of %d ranks carry on", ranks, how,
                        self.size, self.original_size)

    def _deadline_call(self, fn: Callable[[], Any], what: str) -> Any:
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
        wait_for(lambda: not helper.is_alive(), self.timeout,
                 lambda t: f"bmlmpi: {what} did not finish within {t:g} s")
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, MPI.Exception):
                raise FaultToleranceError(f"{what} failed: {exc.Get_error_string()}") from exc
            raise exc
        return box["value"]

    def _adopt(self, new: MPI.Comm, members: list[int], lost: tuple[int, ...]) -> None:
        """Make ``new`` (the survivors, in ``members`` order) this communicator's own."""
        self._adopt_comm(new, [self._members.index(m) for m in members],
                         fresh_shape(len(members)))
        self._members = members
        self.failed = tuple(sorted(set(self.failed) | set(lost)))
        self._broken = False
        self._noticed = None
        self._events += 1
        self._hb.watch(members)
        self._hb.forget(lost)

    def _reconcile(self) -> None:
        """Every survivor must have committed the same calls; say so loudly if not.

        Survivors may have *started* different numbers of calls (a rank that lagged had not
        yet started the last ones when the failure came): calls commit in start order, so
        the pending calls of every survivor are a prefix of the same sequence, and each
        starts the ones it has not started yet later, in order, as the others did. What
        must agree is where the next attempt's tags begin: the launch count is set to the
        largest (the next attempts then use the same tags on every survivor)."""
        mine = np.array([self._committed, len(self._pending), self._tag_count], dtype=np.int64)
        every = np.empty((self.size, 3), dtype=np.int64)
        req = self._comm.Iallgather(mine, every)
        state = {"failed": False}

        def done() -> bool:
            try:
                return req.Test()
            except MPI.Exception as exc:
                if not is_failure(exc, self._comm):
                    raise
                state["failed"] = True  # another failure: the next attempt's vote handles it
                return True

        wait_for(done, self.timeout,
                 lambda t: f"bmlmpi: survivors did not compare states within {t:g} s")
        if state["failed"]:
            return
        if (every[:, 0] == every[0, 0]).all():
            self._tag_count = int(every[:, 2].max())
            return
        raise FaultToleranceError(f"survivors disagree on the allreduces committed before "
                                  f"the failure (committed, pending per rank: "
                                  f"{every[:, :2].tolist()})")

    def _check_vanished(self) -> None:
        vanished = self._hb.vanished
        if not vanished:
            return
        failed = set()
        with contextlib.suppress(MPI.Exception, NotImplementedError):
            group = self._comm.Get_failed()
            n = group.Get_size()
            if n:
                idx = MPI.Group.Translate_ranks(group, list(range(n)), self._comm.Get_group())
                failed = {self._members[i] for i in idx if i != MPI.UNDEFINED}
        for peer, why in list(vanished.items()):
            if peer not in self._members or peer in failed:
                vanished.pop(peer, None)
                continue
            raise FaultToleranceError(
                f"{why}, but MPI never reported it (Open MPI's runtime does not report a rank "
                f"that exits with a non-zero status), so the survivors cannot agree to drop "
                f"it. End ranks with bmlmpi.ft.finish() or bmlmpi.ft.install_exit_handlers().")

    # -- masking (link failures) ----------------------------------------------------------
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
        if self._pending:
            raise RuntimeError("mask_rank/mask_link with allreduces outstanding; Wait them "
                               "first")
        if victim not in self._members:
            raise ValueError(f"original rank {victim} is not a member (members: "
                             f"{self._members})")
        if self.size == 1:
            raise ValueError("cannot mask the last member")
        with self._hb.watching():
            vec = np.array([victim, -victim], dtype=np.int64)
            res = np.empty_like(vec)
            wait_request(self._comm.Iallreduce(vec, res, MPI.MAX), self.timeout,
                         "bmlmpi mask_rank: members did not agree")
            if res[0] != -res[1]:
                raise ValueError("members named different ranks to mask")
            if self._members[self.rank] == victim:
                self._masked = True
                self._hb.close()
                self._comm = MPI.COMM_NULL
                return False
            group = MPI.Group.Excl(self._comm.Get_group(), [self._members.index(victim)])
            new = self._deadline_call(lambda: self._comm.Create_group(group),
                                 f"masking original rank {victim}")
            members = [m for m in self._members if m != victim]
            self._adopt(new, members, (victim,))
            now = time.time()
            self.recoveries.append(RecoveryRecord((victim,), now, now, now, self.size))
            self._account((victim,), "was masked")
        if self.on_failure is not None:
            self.on_failure(self, (victim,))
        return True
