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
* **All-to-all(v)**: the survivors' blocks among themselves are delivered exactly (each
  where the frame's counts and displacements put it); the blocks from frame members lost
  are filled with zeros in every survivor's ``recvbuf`` (in place too: there they held this
  rank's blocks for the lost ranks, which nobody receives), and the call raises
  :class:`ContributionsLost` on every survivor, naming them (original ranks). A member
  lost while an ``Alltoallv``'s counts were gathered (before its exchange started) is
  lost to the call the same way: the call is still made for the frame
  (:meth:`~.policy.FaultTolerantPolicy.pair_counts`).

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
allgather or all-to-all. Ranks already gone when the frame was set are not its concern: the
frame holds only the members then. Calls started with nothing outstanding after a recovery
are made for the survivors: give their counts, displacements and root for the new ``size``,
in the new ranks.
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
    """An allgather or all-to-all lost the contributions of ranks that died during it
    (``lost``): an allgather's slots of theirs hold zeros, every survivor's slot its data;
    an all-to-all's blocks from them hold zeros, the survivors' blocks among themselves
    were delivered. Raised on every survivor; the communicator stays usable (over the
    survivors)."""

    def __init__(self, message: str, lost: tuple[int, ...]):
        super().__init__(message)
        self.lost = lost  # original ranks whose slots (blocks) are zero


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
        return _exchange_among(call, before, keep, lost, rank)
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


def _exchange_among(call: CollectiveCall, before: list[int], keep: list[int],
                    lost: tuple[int, ...], rank: int) -> CollectiveCall:
    """An all-to-all made for ``before`` as it runs over the survivors (``keep``: their
    positions in ``before``): the pair matrix's rows and columns of the survivors, each
    block where the frame's displacements put it; the blocks from the ranks ``lost``
    zeroed in ``out`` (never stale data: in place they held this rank's blocks for them)."""
    n = len(before)
    old = call.rank
    rows = call.counts
    sends = rows[old * n:(old + 1) * n]
    recvs = tuple(rows[j * n + old] for j in range(n))
    rd = call.displs or offsets(recvs)
    kept = set(keep)
    for i in range(n):
        if i not in kept:
            call.out[rd[i]:rd[i] + recvs[i]] = 0
    send_displs = None
    if call.src is not None:  # in place the blocks are sent from ``out`` at ``displs``
        sd = call.send_displs or offsets(sends)
        send_displs = tuple(sd[i] for i in keep)
    err = ContributionsLost(f"this {call.mpi_name} lost original ranks {list(lost)}: the "
                            f"survivors' blocks among themselves were delivered, the blocks "
                            f"from the ranks lost hold zeros", lost)
    return dataclasses.replace(call, rank=rank, size=len(keep),
                               counts=tuple(rows[i * n + j] for i in keep for j in keep),
                               displs=tuple(rd[i] for i in keep), send_displs=send_displs,
                               native_block=False, extra={**call.extra, "error": err})


def complete_lost_counts(table: np.ndarray, lost: list[int]) -> None:
    """An ``Alltoallv``'s gathered counts (``size × 2·size``: every rank's send counts, then
    its receive counts) whose rows at the positions ``lost`` were lost while they were
    gathered: each lost row rebuilt from what the others' rows say of it (what it sends
    rank j is what j expects from it; what it receives from j, what j sends it). The
    blocks of those ranks are not exchanged (:func:`retarget`); their counts only keep the
    call's pair matrix whole, the same on every survivor."""
    size = table.shape[0]
    for i in lost:
        table[i, :size] = table[:, size + i]
        table[i, size:] = table[:, i]


class Skipped:
    """The run of a call that has nothing to exchange (its root was lost): complete at once,
    so that every survivor votes for it and raises its error after the commit."""

    progress = 0
    reqs: list[Any] = []

    def test(self) -> bool:
        return True

    def describe_timeout(self, timeout: float) -> str:
        return "a call with nothing to exchange"
