"""A communicator's plan cache and ``auto``: the compiled plan of each signature (bound to
its communicators, its kernels compiled before any deadline runs), the schedule behind it,
the algorithm ``auto`` picks for each size, the explanation of that choice, and each
signature's number (the order this communicator first ran it, which the tags carry).

:class:`PlanCache` belongs to one :class:`~bmlmpi.api.Communicator` (its ``owner``) and reads
only the owner's public state (``comm``, ``rank``, ``size``, ``shape``, ``links``,
``level_comms``, ``calibration``, ``tuning``, ``nodes()``); an allreduce's schedule is bound by the
owner's policy (:meth:`bmlmpi.call_policy.CallPolicy.compile`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from . import binding, kernels, selection
from .call_policy import CallPolicy
from .execute import Plan
from .ops import kernel_op
from .placement import Placement
from .schedules import algorithms, meet
from .schedules.collectives import collective as collective_record
from .schedules.types import Schedule
from .shm import ShmPlan

_log = logging.getLogger("bmlmpi")


class PlanCache:
    """Plans, schedules and ``auto``'s choices of one communicator, per signature."""

    def __init__(self, owner: Any, placement: Placement,
                 policy: CallPolicy):
        self.owner = owner
        self.placement = placement
        self.policy = policy
        self.plans: dict[tuple, Plan | ShmPlan] = {}
        self.choices: dict[tuple, selection.Explanation] = {}
        self.sig_ids: dict[tuple, int] = {}

    # -- plans ------------------------------------------------------------------------------
    def plan(self, algorithm: str, count: int, dtype: np.dtype, op: str) -> Plan | ShmPlan:
        """The compiled plan of an allreduce signature (cached), its kernels compiled."""
        key = (algorithm, count, dtype, op)
        plan = self.plans.get(key)
        if plan is None:
            compiled = self.policy.compile(algorithm, count, dtype.itemsize)
            plan = self.plans[key] = self.warm(compiled, dtype, op)
        return plan

    def family_plan(self, call: Any) -> Plan | ShmPlan:
        """The compiled plan of a scheduled reduce-scatter, allgather, reduce, broadcast or
        all-to-all (a :class:`~bmlmpi.calls.CollectiveCall`; cached per signature)."""
        key = call.plan_key()
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        owner = self.owner
        record = algorithms.get(call.algorithm)
        coll = collective_record(call.collective)
        itemsize = call.dtype.itemsize
        sched = record.build(algorithms.Context(
            owner.size, sum(call.counts), itemsize, owner.rank, collective=call.collective,
            root=call.root, counts=call.counts if coll.blocked or coll.relays else None,
            shape=owner.shape,
            links=owner.links, nodes=owner.nodes() if record.tiered else None,
            intra=self.intra(call.algorithm)))
        plan = self.plans[key] = self.warm(self.bind(sched, itemsize, record.tiered),
                                           call.dtype, call.op)
        return plan

    def meet_plan(self, count: int, dtype: np.dtype, unit: int) -> tuple[Plan, tuple]:
        """The compiled plan of the pipelined meet (:mod:`bmlmpi.schedules.meet`) of
        ``count`` elements of ``dtype`` in blocks of whole ``unit`` s, over the owner's
        current members, and its key (cached per signature)."""
        key = ("meet", count, dtype, unit)
        plan = self.plans.get(key)
        if plan is None:
            owner = self.owner
            sched = meet.meet_schedule(owner.rank, owner.size, count,
                                       meet.meet_pieces(count, dtype.itemsize, owner.size),
                                       unit)
            plan = self.plans[key] = self.bind(sched, dtype.itemsize, True)
        return plan, key

    def get(self, key: tuple) -> Plan | ShmPlan | None:
        """The plan cached under ``key`` (an allreduce's ``(algorithm, count, dtype, op)``,
        a family call's ``plan_key()``), None when there is none."""
        return self.plans.get(key)

    def clear(self) -> None:
        """Drop every plan (they are bound to a communicator that is gone)."""
        self.plans.clear()

    def forget(self) -> None:
        """Drop every plan and ``auto`` choice (the members changed)."""
        self.plans.clear()
        self.choices.clear()

    @staticmethod
    def warm(plan: Plan | ShmPlan, dtype: np.dtype, op: str) -> Plan | ShmPlan:
        """Compile (or load from numba's cache) the kernels ``plan`` calls now, outside any
        deadline: a first compile inside a step can take seconds on a loaded node."""
        fan_in = max((len(offs) for lane in plan.lanes for st in lane for _, _, offs in st.reduces),
                     default=0)
        if fan_in:
            kernels.warmup([dtype], [kernel_op(op)], sources=sorted({1, fan_in}))
        return plan

    # -- schedules --------------------------------------------------------------------------
    def intra(self, algorithm: str) -> str:
        """How a hierarchical schedule's node tier runs: in shared memory where every node's
        ranks share it, else a ring; ``shm`` is refused on every rank alike when the
        communicator spans nodes."""
        if algorithm == "shm":
            self.placement.node_tier().require_one_node()
        elif algorithm == "hierarchical" and self.placement.node_tier().fits:
            return "shm"
        return "ring"

    def schedule(self, algorithm: str, count: int, itemsize: int) -> Schedule:
        """This rank's allreduce schedule of ``algorithm`` over the owner's current
        members."""
        owner = self.owner
        record = algorithms.get(algorithm)
        intra = self.intra(algorithm)
        return record.build(algorithms.Context(
            owner.size, count, itemsize, owner.rank, shape=owner.shape, links=owner.links,
            nodes=owner.nodes() if record.tiered else None, intra=intra))

    def bind(self, sched: Schedule, itemsize: int, tiered: bool) -> Plan | ShmPlan:
        """``sched`` bound to the owner's communicators: shared-memory steps on the node's
        window, BCube levels on their own communicators (a tiered schedule's levels are
        network tiers, not BCube levels: every transfer on the communicator itself)."""
        owner = self.owner
        if sched.uses_shm:
            return self.placement.node_tier().bind(sched, itemsize)
        return binding.bind(sched, owner.comm, [] if tiered else owner.level_comms, owner.shape)

    def sig_id(self, key: tuple) -> int:
        """The signature's number: the order in which this communicator first ran it, the
        same on every rank that runs the same calls."""
        sig = self.sig_ids.get(key)
        if sig is None:
            sig = self.sig_ids[key] = len(self.sig_ids)
        return sig

    # -- auto -------------------------------------------------------------------------------
    def auto(self, count: int, itemsize: int) -> str:
        """``auto``'s priced allreduce choice for ``count`` elements of ``itemsize`` bytes
        (cached; local, every rank picks the same), before any call is timed."""
        return self._explained("allreduce", count, itemsize).chosen

    def auto_for(self, count: int, dtype: np.dtype, op: str, wire: Any = None) -> str:
        """``auto``'s choice for an allreduce (the owner's ``tuning``: a measured choice
        where one is committed, else the priced one), keeping one NaN rule: MIN and MAX of
        floats propagate NaN (numpy's rule, which bmlmpi's kernels follow); Open MPI's own
        MPI_MIN/MPI_MAX do not, so ``auto`` never hands those to ``native`` (the tree below
        64 KiB, the ring above). ``native`` asked for explicitly is the MPI library's rule.
        ``wire``: the carrier of a call carried in a call format (:meth:`carried_prices`)."""
        tuning = self.owner.tuning
        words, itemsize = self.carried_prices(count, dtype, wire)
        choice = tuning.choice(tuning.key("allreduce", count, dtype, op, 0, wire),
                               self._explained("allreduce", words, itemsize))
        if choice == "native" and op in ("min", "max") and dtype.kind == "f":
            choice = "tree" if count * dtype.itemsize <= 65536 else "ring"
        return choice

    def family_auto(self, call: Any) -> str:
        """``auto``'s choice for a family call (:func:`bmlmpi.selection.choose_collective`,
        then the owner's ``tuning``; a carried call's priced on its words,
        :meth:`carried_prices`)."""
        coll = collective_record(call.collective)
        words, itemsize = self.carried_prices(call.total, call.dtype, call.wire)
        per = words // call.total if call.total else 1
        counts = (tuple(c * per for c in call.counts) if coll.blocked or coll.relays
                  else None)
        why = self._explained(call.collective, words, itemsize, call.root, counts)
        tuning = self.owner.tuning
        return tuning.choice(tuning.call_key(call), why)

    @staticmethod
    def carried_prices(count: int, dtype: np.dtype, wire: Any) -> tuple[int, int]:
        """What ``auto`` prices for ``count`` values of ``dtype``: (elements, bytes each) of
        the values themselves, or of the int64 words a call format's carrier ``wire`` carries
        them in (the reproducible format's: a float32 value one word, a float64 value two,
        a complex value twice its reals'), which every candidate sums and moves instead: a
        carried signature is priced at its own wire cost, and tuned under a key of its own
        (:meth:`bmlmpi.auto_tuning.AutoTuning.key`)."""
        if wire is None:
            return count, np.dtype(dtype).itemsize
        return wire.words(count, dtype), np.dtype(np.int64).itemsize

    def _explained(self, collective: str, count: int, itemsize: int, root: int = 0,
                   counts: tuple[int, ...] | None = None) -> selection.Explanation:
        """:meth:`explain`, cached per signature (logged once, when first made)."""
        key = (collective, count, itemsize, root, counts)
        why = self.choices.get(key)
        if why is None:
            why = self.choices[key] = self.explain(collective, count, itemsize, root, counts)
            self._log_choice(why)
        return why

    def explain(self, collective: str, count: int, itemsize: int, root: int = 0,
                counts: tuple[int, ...] | None = None) -> selection.Explanation:
        """What ``auto`` runs for ``collective`` of ``count`` elements of ``itemsize`` bytes
        on the owner, and why (``counts``: a reduce-scatter's or allgather's blocks)."""
        owner = self.owner
        nodes = self.placement.nodes_for_auto()
        return selection.explain_collective(collective, count, itemsize, owner.size,
                                            owner.calibration, owner.shape, nodes, root, counts)

    def _log_choice(self, why: selection.Explanation) -> None:
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("auto (rank %d of %d) for a new signature: %s", self.owner.rank,
                       self.owner.size, why)
