"""What a communicator keeps for its compressed calls: one :class:`CompressionChannel` per
bmlmpi Communicator, made by the communicator and reached through its ``compression``
property.

It holds:

* the private duplicate communicator compressed calls send on (so their tags never meet
  bmlmpi's own schedules), made on the first compressed call (which every rank makes in the
  same order) and again after the communicator's own MPI communicator changed (a
  fault-tolerant communicator that shrank);
* the tag blocks (:class:`bmlmpi.call_numbers.TagBlocks`) that give each compressed call
  its own block of :data:`.engine.TAG_SPAN` tags (a Run uses tags ``base + [0,
  TAG_STEPS)``; the sparse exchanges fold theirs into the same span), :data:`TAG_CALLS`
  blocks in turn, as many as the MPI's tag upper bound holds (at most 32): two calls in
  flight never share a tag as long as fewer than that many are outstanding, which
  :class:`.engine.StagedRequest` guarantees by running one channel's calls one after another
  (:attr:`CompressionChannel.queue`);
* the plans compiled on the duplicate (per algorithm, count, item size and kernel op), the
  BCube level groups as ranks of the duplicate, and the α-β price of the network measured by
  the first compressed call that asked (:mod:`.network_price`).

What it asks of its communicator is public: ``comm``, ``timeout``, ``size``, ``rank``,
``level_comms``, ``plans`` (its ``schedule()``) and, for the compressed call itself
(:mod:`.layer`), ``algorithm``, ``plans.auto()``, ``calibration``, ``shape``, ``recorder``,
``Iallreduce``, ``agree_compressed()`` (the call's place in the communicator's first-call
agreement) and its policy's ``settle_compressed()``, which the fault-tolerant policy settles
among the survivors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..agreement import drain
from ..call_numbers import TagBlocks
from ..execute import Plan, tag_upper_bound, wait_request
from .engine import TAG_SPAN, CallQueue
from .layer import start as start_compressed
from .sparse import level_members

#: distinct tag blocks, at most (fewer where the MPI's tag upper bound is lower)
TAG_CALLS = 32


class CompressionChannel:
    """One communicator's compression state (module docstring). ``owner``: the bmlmpi
    Communicator that made it."""

    def __init__(self, owner: Any):
        self.owner = owner
        self._dup: MPI.Comm | None = None
        self._base: MPI.Comm | None = None
        self._tags = TagBlocks(TAG_SPAN - 1, TAG_SPAN, TAG_CALLS)  # one block until comm
        self._plans: dict[tuple, Plan] = {}
        self._levels: list[list[int]] | None = None
        #: (α, β) measured by the first compressed call that asked (:mod:`.network_price`); None
        #: until then
        self.links: tuple[float, float] | None = None
        #: this channel's staged requests, oldest first (:class:`.engine.StagedRequest`)
        self.queue = CallQueue()

    @property
    def comm(self) -> MPI.Comm:
        """The private duplicate of the owner's communicator (made on first use, collective;
        remade after the owner's communicator changed)."""
        base = self.owner.comm
        if self._dup is not None and self._base is not base:
            # a fault-tolerant communicator shrank: the old duplicate holds failed ranks
            self._dup = None
        if self._dup is None:
            dup, req = base.Idup()
            wait_request(req, self.owner.timeout, "bmlmpi.compression: not every rank made "
                                                  "its first compressed call")
            dup.Set_errhandler(MPI.ERRORS_RETURN)
            self._dup, self._base = dup, base
            self._tags = TagBlocks(tag_upper_bound(dup), TAG_SPAN, TAG_CALLS)
            self._plans = {}
            self._levels = None
        return self._dup

    @property
    def blocks(self) -> int:
        """How many tag blocks the calls cycle through."""
        return self._tags.blocks

    def next_tag_base(self) -> int:
        """The tag block of the next compressed call (after :attr:`comm`), taken
        (:class:`bmlmpi.call_numbers.TagBlocks`)."""
        return self._tags.take()

    def revoke(self) -> None:
        """Revoke the duplicate (ULFM), so that no survivor waits on it; nothing where there is
        none or the MPI cannot."""
        if self._dup is not None:
            try:
                self._dup.Revoke()
            except (MPI.Exception, NotImplementedError):
                pass

    def drop(self) -> None:
        """Forget the duplicate (after a failure made it unusable); the next compressed call
        makes a new one."""
        dup, self._dup = self._dup, None
        self._plans = {}
        self._levels = None
        if dup is not None:
            try:
                dup.Free()
            except MPI.Exception:
                pass

    def free(self) -> bool:
        """Free the duplicate (the owner's ``Free``), unless MPI may still use it: while a
        call of this channel is queued (one given up at its deadline stays queued) or after
        one ended in an error (its stage's other requests may still be posted), it is left to
        MPI, as freeing a communicator under a pending operation crashes some MPI libraries.
        True when nothing is left."""
        if self.queue or self.queue.unsettled:
            return False
        dup, self._dup = self._dup, None
        self._plans = {}
        self._levels = None
        if dup is not None:
            drain(dup)
            dup.Free()
        return True

    def plan(self, algorithm: str, count: int, itemsize: int, op: str) -> Plan:
        """The compiled plan of ``algorithm`` on the duplicate (cached per signature), its
        kernels compiled outside any deadline."""
        key = (algorithm, count, itemsize, op)
        plan = self._plans.get(key)
        if plan is None:
            plan = Plan.flat(self.owner.plans.schedule(algorithm, count, itemsize), self.comm)
            fan_in = max((len(offs) for lane in plan.lanes for st in lane
                          for _, _, offs in st.reduces), default=0)
            if fan_in:
                dtypes = [] if op in kernels.wire_ops() else [np.dtype(f"f{itemsize}")]
                kernels.warmup(dtypes, [op], sources=sorted({1, fan_in}))
            self._plans[key] = plan
        return plan

    def level_members(self) -> Sequence[Sequence[int]]:
        """For each BCube level, this rank's level group as ranks of the duplicate."""
        if self._levels is None:
            self._levels = level_members(self.owner.level_comms, self.comm)
        return self._levels

    def start(self, sendbuf: Any, recvbuf: Any, op: Any, compression: Any,
              key: Any = None) -> Any:
        """Start a compressed allreduce on the owner (:func:`.layer.start`)."""
        return start_compressed(self, sendbuf, recvbuf, op, compression, key)


__all__ = ["TAG_CALLS", "CompressionChannel"]
