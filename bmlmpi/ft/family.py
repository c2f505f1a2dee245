"""Failure contracts of the collective family on the fault-tolerant communicator.

A reduce-scatter, allgather, reduce or broadcast is one call of the ledger like an allreduce
(:mod:`.ledger`): it commits on every survivor or on none, a failure during it is recovered
inside a ``Wait``/``Test`` (agree, shrink, ``on_failure``), and it then runs again over the
survivors with its input restored. Its arguments describe the members it was made for, its
*frame* (:attr:`~.communicator.FaultTolerantCommunicator.call_members`); this module says
what a run over fewer members is (:func:`retarget`), one contract per collective, counted in
the frame (its ranks, counts and root). In every case the communicator stays usable and
``size``/``rank`` describe the survivors.

* **Broadcast**: root alive — every survivor's ``buf`` holds the root's data. Root lost —
  :class:`RootFailed` on every survivor, each ``buf`` as it was before the call.
* **Reduce**: root alive — the root's ``recvbuf`` holds the reduction over exactly the
  survivors' inputs (``AVG`` divides by their number). Root lost — :class:`RootFailed` on
  every survivor (there is no root to hold a result).
* **Reduce-scatter**: each survivor receives *its own block* (the block of its rank in the
  frame, with the frame's ``recvcounts``) reduced over exactly the survivors' inputs
  (``AVG``: by their number); the blocks of lost ranks are delivered to nobody. Nothing
  raises.
* **Allgather(v)**: each survivor's slot holds that survivor's contribution; the slots of
  frame members lost are filled with zeros (never stale data) and the call raises
  :class:`ContributionsLost` on every survivor, naming them (original ranks).
* **All-to-all(v)**: no contract of its own yet. A call whose frame lost a rank writes no
  survivor's ``recvbuf`` and raises :class:`ContributionsLost` on every survivor, naming
  the ranks lost.

A rank that dies after delivering everything a call needed from it counts as dying after the
call (the ledger's rule): the call commits with its data, and the next call recovers.

**Calls outstanding at a failure.** A call's frame is the members when it is started with no
other call of this rank outstanding (started and not yet completed by ``Wait``, by a ``Test``
that returned True, or by either raising); a call started while others are outstanding keeps
their frame, even when a recovery inside one of their ``Test``/``Wait`` has shrunk the
communicator since. Every survivor thus starts the same calls for the same frame, wherever
its own recovery fell, and every call ends the same way on every survivor. A persistent
call's frame is its ``_init``'s, at every ``Start``. A start never recovers (a failure it
meets is left to the next ``Test``/``Wait``), and a recovery restarts every uncommitted call,
in start order, over the survivors by the contracts above: a call whose frame lost a rank
before it was even started (the rank died after the frame was set) raises as if the rank had
died during it — :class:`RootFailed` for its root, :class:`ContributionsLost` for an
allgather. Ranks already gone when the frame was set are not its concern: the frame holds
only the members then. Calls started with nothing outstanding after a recovery are made for
the survivors: give their counts, displacements and root for the new ``size``, in the new
ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..calls import CollectiveCall, offsets
from .errors import FaultToleranceError


class RootFailed(FaultToleranceError):
    """The root of a reduce or broadcast died during the call: no survivor has its result.
    Raised on every survivor; the communicator stays usable (over the survivors)."""

    def __init__(self, message: str, root: int):
        super().__init__(message)
        self.root = root  # original rank


class ContributionsLost(FaultToleranceError):
    """An allgather lost the contributions of ranks that died during it: their slots hold
    zeros, every survivor's slot its data. Raised on every survivor; the communicator stays
    usable (over the survivors)."""

    def __init__(self, message: str, lost: tuple[int, ...]):
        super().__init__(message)
        self.lost = lost  # original ranks whose slots are zero


def retarget(call: CollectiveCall, members: list[int], rank: int) -> CollectiveCall:
    """``call`` (made for its frame, ``call.extra["members"]``) as it runs over
    ``members`` (original ranks in current rank order), this rank being ``rank`` now: the
    module docstring's contracts. A call that cannot run (its root lost) comes back with
    ``extra["error"]`` set and nothing to exchange."""
    before = call.extra.get("members")
    if before is None or list(before) == list(members):
        return call
    alive = set(members)
    keep = [i for i, o in enumerate(before) if o in alive]
    lost = tuple(o for o in before if o not in alive)
    size = len(members)
    what = call.collective
    if what in ("bcast", "reduce"):
        root = before[call.root]
        if root not in alive:
            err = RootFailed(f"the root of this {call.mpi_name} (original rank {root}) died "
                             f"during it; the survivors hold no result", root)
            return dataclasses.replace(call, extra={**call.extra, "error": err,
                                                    "skip": True})
        return dataclasses.replace(call, rank=rank, size=size, root=members.index(root))
    if what == "alltoall":
        # no contract of its own yet: no survivor's recvbuf is written, and every survivor
        # raises, naming the ranks lost (never a partial exchange passed off as whole)
        err = ContributionsLost(f"this {call.mpi_name} lost original ranks {list(lost)}; an "
                                f"all-to-all has no failure contract yet: no recvbuf was "
                                f"written", lost)
        return dataclasses.replace(call, extra={**call.extra, "error": err, "skip": True})
    counts = tuple(call.counts[i] for i in keep)
    if what == "reduce_scatter":
        inp = call.out if call.src is None else call.src
        off = offsets(call.counts)
        packed = (np.concatenate([inp[off[i]:off[i] + call.counts[i]] for i in keep])
                  if keep else inp[:0].copy())
        return dataclasses.replace(call, rank=rank, size=size, counts=counts, src=packed,
                                   native_block=False)
    # allgather: the survivors' slots where they were, the lost ones zeroed
    displs = call.displs or offsets(call.counts)
    for i, o in enumerate(before):
        if o not in alive:
            call.out[displs[i]:displs[i] + call.counts[i]] = 0
    err = ContributionsLost(f"this {call.mpi_name} lost the contributions of original ranks "
                            f"{list(lost)} (their slots hold zeros)", lost)
    return dataclasses.replace(call, rank=rank, size=size, counts=counts,
                               displs=tuple(displs[i] for i in keep), native_block=False,
                               extra={**call.extra, "error": err})


class Skipped:
    """The run of a call that has nothing to exchange (its root was lost): complete at once,
    so that every survivor votes for it and raises its error after the commit."""

    progress = 0
    reqs: list[Any] = []

    def test(self) -> bool:
        return True

    def describe_timeout(self, timeout: float) -> str:
        return "a call with nothing to exchange"
