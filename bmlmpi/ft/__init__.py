"""Failure-aware allreduce: the survivors finish the call and carry on (ULFM).

``bmlmpi.Communicator(comm, fault_tolerant=True)`` builds a :class:`FaultTolerantCommunicator`.
When ranks die before, during or between its allreduces, every survivor's call completes with
the reduction over exactly the survivors' inputs (``AVG`` divides by their number), the same on
all of them; afterwards ``size`` and ``rank`` describe the survivors, ``failed`` lists the
original ranks lost, ``survivors`` the original ranks left, and ``on_failure(comm, lost)`` runs.
Each public method's docstring states its failure contract.

Mechanism (user-level failure mitigation, mpi4py ≥ 4 on Open MPI ≥ 5 started with
``--with-ft ulfm``, i.e. ``bmlmpi-run --ft``), one module per job:

1. **Run** (:mod:`.communicator`, :mod:`.policy`). An allreduce runs the plain communicator's
   launch path (plan, kernel warm-up, schedule run or native ``MPI_Iallreduce``), which calls
   the fault-tolerant policy where a call differs under failures, on one private
   communicator with ``ERRORS_RETURN``. Unlike the plain communicator there are no per-level
   communicators: every transfer goes over this one, so revoking and shrinking touch exactly
   one object (the schedule's ``level`` still says which BCube link a transfer stands for).
   Each call keeps what it needs to run again: the send buffer, or a copy of the input for
   ``MPI.IN_PLACE``.
2. **Detect** (:mod:`.errors`). A request fails with ``ERR_PROC_FAILED``/
   ``ERR_PROC_FAILED_PENDING`` (a peer died) or ``ERR_REVOKED`` (another survivor noticed
   first). A hung peer never fails a request: the heartbeat (:mod:`.heartbeat`) fences it
   with SIGKILL after ``hang_timeout`` seconds without a beat, and ULFM then reports it. The
   detecting rank revokes the communicator so that every rank still waiting on anything stops.
3. **Agree** (:mod:`.ledger`). A call commits on every survivor or on none: once its run has
   completed locally or failed, each rank votes in ``MPI_Comm_iagree``, calls in the order they
   were started.
4. **Shrink and rebuild** (:mod:`.membership`). After a 0 vote the survivors shrink the
   communicator, check that all committed the same calls, drop the cached plans (the tree
   algorithms' link-weight matrix keeps the survivors' rows; the calibration of ``auto`` is
   kept), call ``on_failure`` and start every uncommitted call again over the survivors.
   Failures during the re-run repeat the cycle (successive failures).

Re-partitioning (which schedule the survivors run, :func:`.recovery.bcube_preserving`,
:mod:`.recovery`):

* ``recovery="fresh"`` — the survivors run the requested algorithm (bml, ring, tree, native …)
  as if the communicator had been built over them: bml on a fresh mixed-radix BCube of the
  default factorisation of N−x, k·(N−x) pieces. Right for a flat network (shared memory, a
  Fat-Tree), and the default when no BCube shape was given.
* ``recovery="bcube"`` — bml keeps the original BCube addresses and routes around the dead
  servers with auxiliary multi-hop steps (the BML slides), so a server only ever talks to a
  server one switch away. The default when the user gave a BCube shape (``topology=`` or
  ``BMLMPI_BCUBE``). When the planner finds no such schedule (or the cube exceeds
  ``MAX_PLANNED_SERVERS``) the fresh schedule is used instead. Other algorithms always run
  fresh.

The rest of the collective family (reduce-scatter, allgather, reduce, broadcast, all-to-all,
and the persistent forms) runs on the same ledger; each collective's failure contract — what the
survivors hold, what raises (:class:`RootFailed`, :class:`ContributionsLost`), where the next
call runs — is in :mod:`bmlmpi.ft.family`.

Non-blocking calls (``Iallreduce``) work as on the plain communicator; a ``Test`` or ``Wait``
that meets a failure performs the recovery (a collective over the survivors) before returning,
a start never does. A call's arguments are for its frame
(:attr:`FaultTolerantCommunicator.call_members`): the survivors when nothing else is
outstanding on this rank, else the frame of the calls outstanding, so that calls started
together are made for the same members on every survivor (:mod:`bmlmpi.ft.family`).

Deadlines: every wait of this communicator polls non-blocking requests against ``timeout``
(``BMLMPI_TIMEOUT``) seconds without progress and raises :class:`bmlmpi.DeadlineExceeded`;
``hang_timeout`` (``BMLMPI_HANG_TIMEOUT``, default 30 s) is the heartbeat age that gets a peer
fenced, ``heartbeat`` (``BMLMPI_HEARTBEAT``) the beat period. Fencing reaches ranks on this
rank's host only (SIGKILL); a hung rank on another host surfaces at the deadline — fencing
across hosts needs the launcher (:mod:`.heartbeat`).

Without ULFM: on Open MPI started without ``--with-ft ulfm`` (it is then off: the environment
lacks ``OMPI_MCA_mpi_ft_enable``) or on an MPI whose ``MPI_Comm_is_revoked`` is missing (the
MPICH wheel), construction raises :class:`FaultToleranceUnavailable`. ``BMLMPI_ULFM=1`` skips
the check (an Open MPI whose parameter file enables ULFM); where support cannot be told, waits
end at the deadline.

Process exit (:mod:`.exit`): :func:`install_exit_handlers` and :func:`finish` make a rank's end
visible to the others and hang-free. A rank that still exits non-zero without them is noticed
by the heartbeat (its process is gone but MPI never said so) and the survivors raise
:class:`FaultToleranceError` instead of hanging.

A link that goes down (:mod:`.link_watch`): ``watch_links=`` names this server's NICs; when one
goes down the rank fences itself (the BML slides: the server at the end of a failed link is masked)
and the others recover from its death as from any other.

Growing back (:mod:`.grow`): :meth:`FaultTolerantCommunicator.replace_failed` spawns one
process per lost rank (``MPI_Comm_spawn`` from the survivors), merges it in at the original
rank it replaces, hands it the current model state and goes back to the full BCube schedule;
the spawned program enters through :func:`join`. Timings in ``regrowths``
(:class:`GrowRecord`).

Mini-batch rescaling after failures: :func:`bmlmpi.rescaled_batch` (:mod:`.rescale`).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and its module: loaded on first use (PEP 562), so that the MPI-free parts
#: (the heartbeat, the mini-batch rule) import without MPI.
_EXPORTS = {
    "ContributionsLost": "family",
    "DEFAULT_HANG_TIMEOUT": "communicator",
    "FAILURE_CLASSES": "errors",
    "FaultToleranceError": "errors",
    "FaultToleranceUnavailable": "errors",
    "FaultTolerantCommunicator": "communicator",
    "GrowRecord": "grow",
    "Joined": "grow",
    "RECOVERY_MODES": "communicator",
    "RankMasked": "errors",
    "RecoveryRecord": "membership",
    "RootFailed": "family",
    "finish": "exit",
    "install_exit_handlers": "exit",
    "is_failure": "errors",
    "join": "communicator",
    "ulfm_support": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bmlmpi.ft' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
