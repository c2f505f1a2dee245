"""Pricing schedules on a network: the α-β model with link contention. MPI-free.

Every send of a step is routed (:meth:`Network.route`, with the transfer's ``level``) and adds
its element count to each link of its path. The step costs

    α + max over links (elements on the link / link bandwidth) · itemsize · β

where β is the time per byte on the reference link (bandwidth 1) and α the fixed cost of a
step (latency, synchronisation). A schedule costs the sum of its steps; the steps of all ranks
are aligned by index (step i of every rank is the same logical step). Receives are the same
messages as the sends and add nothing.

A schedule whose pieces do not lie in the collective's plain layout (BML's reduce-scatter
and allgather on MPI's blocks) copies more between the rank's buffers and its work buffer than
the plain layout does (:func:`layout_copied`); :attr:`Cost.copied` holds the busiest rank's
extra elements, priced at the machine's copy rate.

The bandwidth part, divided by ``count``, is in units of T_F (the full buffer over one
reference link) — the paper's GST; :attr:`Cost.t_f` holds it exactly (a :class:`Fraction`
when every bandwidth is rational). :meth:`Cost.seconds` adds the per-step terms of a machine:
α, the executor's overhead per step and per message a rank posts, and γ per byte a rank
reduces (the α-β-γ model; γ = 0 gives the paper's model).

A shared-memory step (:class:`~bmlmpi.schedules.types.ShmOp`) moves no message: it costs
σ (its synchronisation: a memory barrier, a flag, a wait) + the bytes its busiest rank copies
(publish, fetch, a reduction's copy into its segment) · β_copy + the bytes that rank's
reductions read · γ_shm, with the machine's constants from :mod:`bmlmpi.calibrate`.

Two ways to price:

* :func:`price` — the schedules of all ranks; exact on any network.
* :func:`price_symmetric` — one rank's schedule, on a network whose link orbits are known
  (``network.symmetric``), for schedule sets equivariant under that symmetry: the load every
  link of an orbit carries is this rank's load on the whole orbit times size / orbit size.
  O(this rank's transfers); what prices BML on BCube(16,4) (65,536 servers) without building
  the other 65,535 schedules. With balanced ranges that differ by one element, ranks differ by
  at most one element per transfer; the rank priced should be one with the largest ranges
  (rank 0 for every algorithm here).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..schedules.collectives import collective
from ..schedules.types import Schedule
from .network import Bandwidth, Link, Network

Number = int | Fraction | float


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step: ``time`` is the busiest link's elements / bandwidth (reference-link element
    times); ``messages`` and ``reduced`` are the most messages posted and elements reduced by
    one rank; ``active`` is false when no rank moves anything (the step costs nothing)."""

    time: Number
    link: Link | None
    messages: int
    reduced: int
    active: bool
    shm: bool = False   # a shared-memory step: priced by ``copied`` and ``read`` instead
    copied: int = 0     # elements the busiest rank copies in shared memory
    read: int = 0       # elements that rank's shared-memory reductions read


@dataclass(frozen=True)
class Cost:
    """The price of one allreduce: its steps, the network and the element count."""

    algorithm: str
    network: str
    count: int
    steps: tuple[StepCost, ...]
    copied: int = 0  # layout copies: elements the busiest rank copies beyond the plain layout


    @property
    def nsteps(self) -> int:
        """Steps in which something moves."""
        return sum(1 for s in self.steps if s.active)

    @property
    def time(self) -> Number:
        """Σ over steps of the busiest link's element time (no α)."""
        return sum((s.time for s in self.steps), 0)

    @property
    def t_f(self) -> Number:
        """The bandwidth part in units of T_F (``count`` elements over a bandwidth-1 link)."""
        if self.count == 0:
            return 0
        t = self.time
        return t / self.count if isinstance(t, float) else Fraction(t) / self.count

    def step_t_f(self) -> list[Number]:
        """Each step's bandwidth part in units of T_F."""
        if self.count == 0:
            return [0 for _ in self.steps]
        return [s.time / self.count if isinstance(s.time, float)
                else Fraction(s.time) / self.count for s in self.steps]

    def seconds(self, itemsize: int, alpha: float, beta: float, *, step_overhead: float = 0.0,
                msg_overhead: float = 0.0, gamma: float = 0.0, shm_sync: float = 0.0,
                shm_copy: float = 0.0, shm_reduce: float = 0.0) -> float:
        """Time in seconds: per active step α + ``step_overhead`` + ``msg_overhead`` · messages
        + busiest-link time · itemsize · β + γ · reduced · itemsize; per shared-memory step
        ``shm_sync`` + copied · itemsize · ``shm_copy`` + read · itemsize · ``shm_reduce``;
        and the layout copies, :attr:`copied` · itemsize · ``shm_copy`` (β where the copy rate
        was not measured: one machine's MPI moves a message by copying it too)."""
        if itemsize <= 0:
            raise ValueError(f"itemsize must be positive, got {itemsize}")
        total = 0.0
        for s in self.steps:
            if s.shm:
                total += (shm_sync + s.copied * itemsize * shm_copy
                          + s.read * itemsize * shm_reduce)
            elif s.active:
                total += (alpha + step_overhead + msg_overhead * s.messages
                          + float(s.time) * itemsize * beta + gamma * s.reduced * itemsize)
        if self.copied:
            total += self.copied * itemsize * (shm_copy if shm_copy > 0 else beta)
        return total


def _busiest(loads: dict[Link, int], network: Network) -> tuple[Number, Link | None]:
    best: Number = 0
    where: Link | None = None
    bandwidths: dict[Link, Bandwidth] = {}
    for link, elems in loads.items():
        bw = bandwidths.get(link)
        if bw is None:
            bw = bandwidths[link] = network.bandwidth(link)
        t = elems if bw == 1 else (elems / bw if isinstance(bw, float) else Fraction(elems) / bw)
        if t > best or (where is None and elems):
            best, where = t, link
    return best, where


def _rank_work(step) -> tuple[int, int]:
    return (len(step.sends) + len(step.recvs),
            sum(t.hi - t.lo for t in step.recvs if t.reduce))


def _shm_work(step) -> tuple[int, int]:
    """(elements copied, elements read by reductions) of one rank's shared-memory step."""
    copied = read = 0
    for o in step.shm:
        if o.kind == "reduce":
            read += o.n * (1 + len(o.peers))
            copied += o.n if o.publish or not o.peers else 0
        else:
            copied += o.n
    return copied, read


def _check_network(size: int, network: Network) -> None:
    if network.size != size:
        raise ValueError(f"schedules are for {size} ranks but {network.name} has "
                         f"{network.size}")


def price(scheds: Sequence[Schedule], network: Network) -> Cost:
    """Price the schedules of all ranks on ``network`` (exact; cost O(all transfers · hops))."""
    if not scheds:
        raise ValueError("price: no schedules")
    first = scheds[0]
    ranks = sorted(s.rank for s in scheds)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"price: duplicate ranks in {ranks}")
    for s in scheds:
        if (s.size, s.count) != (first.size, first.count):
            raise ValueError(f"price: rank {s.rank} has size/count {s.size}/{s.count}, rank "
                             f"{first.rank} {first.size}/{first.count}")
    _check_network(first.size, network)
    nsteps = max(len(s.steps) for s in scheds)
    out = []
    for i in range(nsteps):
        loads: dict[Link, int] = defaultdict(int)
        messages = reduced = copied = read = 0
        active = shm = False
        for s in scheds:
            if i >= len(s.steps):
                continue
            step = s.steps[i]
            if step.shm:
                c, rd = _shm_work(step)
                copied, read, shm = max(copied, c), max(read, rd), True
                continue
            m, r = _rank_work(step)
            messages, reduced = max(messages, m), max(reduced, r)
            active = active or m > 0
            for t in step.sends:
                for link in network.route(s.rank, t.peer, t.level):
                    loads[link] += t.hi - t.lo
        time, link = _busiest(loads, network)
        out.append(StepCost(time, link, messages, reduced, active or shm, shm and not active,
                            copied, read))
    return Cost(first.algorithm, network.name, first.count, tuple(out))


def price_symmetric(sched: Schedule, network: Network) -> Cost:
    """Price a whole schedule set from one rank's schedule, by the network's symmetry.

    Valid when the set is equivariant under a rank-transitive symmetry whose link orbits are
    ``network.link_class`` (see the module docstring); :func:`price` on small sizes checks it.
    """
    if not network.symmetric:
        raise ValueError(f"{network.name} has no rank-transitive symmetry: price all ranks' "
                         f"schedules with price()")
    _check_network(sched.size, network)
    out = []
    for step in sched.steps:
        per_class: dict[Hashable, int] = defaultdict(int)
        sample: dict[Hashable, Link] = {}
        for t in step.sends:
            for link in network.route(sched.rank, t.peer, t.level):
                cls = network.link_class(link)
                per_class[cls] += t.hi - t.lo
                sample.setdefault(cls, link)
        # Scale each orbit's total to the load of one of its links.
        loads: dict[Link, Number] = {}
        for cls, elems in per_class.items():
            n = network.class_size(cls)
            loads[sample[cls]] = elems * network.size // n if elems * network.size % n == 0 \
                else Fraction(elems * network.size, n)
        time, link = _busiest(loads, network)  # type: ignore[arg-type]
        m, r = _rank_work(step)
        if step.shm:
            c, rd = _shm_work(step)
            out.append(StepCost(0, None, 0, 0, True, True, c, rd))
            continue
        out.append(StepCost(time, link, m, r, m > 0))
    return Cost(sched.algorithm, network.name, sched.count, tuple(out))



def _copied(copies: Sequence, count: int, result_is_work: bool) -> int:
    if result_is_work and tuple((c.lo, c.hi, c.at) for c in copies) == (
            ((0, count, 0),) if count else ()):
        return 0  # the executor runs on the output buffer itself
    return sum(c.hi - c.lo for c in copies)


def layout_copied(sched: Schedule) -> int:
    """Elements ``sched`` copies between its rank's buffers and the work buffer beyond what
    its collective's plain layout copies (:mod:`bmlmpi.schedules.collectives`): 0 for a
    schedule in the plain layout, the whole result for BML's allgather on several levels."""
    coll = collective(sched.collective)
    n, r, root, counts = sched.count, sched.rank, sched.root, sched.counts
    mine = (_copied(sched.input_copies(), n, False)
            + _copied(sched.output_copies(), n, True))
    plain = (_copied(coll.plain_inputs(r, n, root, counts), n, False)
             + _copied(coll.plain_outputs(r, n, root, counts), n, True))
    return max(0, mine - plain)


__all__ = ["Cost", "StepCost", "layout_copied", "price", "price_symmetric"]
