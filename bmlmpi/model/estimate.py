"""Estimate each algorithm's time for one allreduce from the cost model. MPI-free.

:func:`estimate` prices every candidate's schedule — the same schedule functions the executor
runs — on a network (by default one machine's shared memory, :class:`SharedMemoryNode`) with a
machine's :class:`Calibration` (α, β, the Python executor's overheads, the reduction cost γ and
the native ``MPI_Allreduce`` timings, all measured by :mod:`bmlmpi.calibrate`) and returns the
predicted seconds of each; :func:`cheapest` names the lowest. The decision ``auto`` takes
from these estimates is :func:`bmlmpi.selection.choose`. ``native`` has no schedule: its time is
interpolated from the calibration's measured (bytes, seconds) points.

Every collective is priced the same way (``collective=``, with its ``root`` and block
``counts``): the algorithm records (:mod:`bmlmpi.schedules.algorithms`) build the schedules,
the model prices them; the native call's time comes from the calibration's points measured for
that collective (none: no native estimate).

Every input is the same on every rank (the calibration is agreed collectively), so every rank
reaches the same choice without communicating.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..schedules import algorithms as records
from ..schedules.algorithms import Context
from ..schedules.collectives import collective as collective_record
from ..schedules.types import Schedule
from .cost import Cost, layout_copied, price, price_symmetric
from .network import (
    BCubeNetwork,
    FatTree,
    LinkMatrixNetwork,
    Network,
    SharedMemoryNode,
    TwoTierNetwork,
)


@dataclass(frozen=True)
class Calibration:
    """A machine's cost parameters, in seconds.

    ``alpha``: one step's latency (a small exchange between two ranks); ``beta``: seconds per
    byte through one rank's port (a large exchange, all ranks at once); ``step_overhead`` and
    ``msg_overhead``: what bmlmpi's Python executor adds per step and per message posted;
    ``gamma``: seconds per byte reduced; ``native``: measured (bytes, seconds) points of the
    MPI library's own allreduce on the same ranks. Shared memory (all 0 when not measured:
    ranks on several nodes, or one rank): ``shm_sync`` per shared-memory step (barrier, flag,
    wait), ``shm_copy`` seconds per byte copied and ``shm_reduce`` seconds per byte read by a
    reduction, while every rank of the node works at once.
    """

    alpha: float
    beta: float
    step_overhead: float = 0.0
    msg_overhead: float = 0.0
    gamma: float = 0.0
    native: tuple[tuple[int, float], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: (algorithm, bytes, measured ÷ modelled seconds) of bmlmpi's own schedules run by the
    #: executor on the calibrated ranks: what the α-β model misses on this machine (cores
    #: shared by several ranks, cache effects, the kernels), applied by :meth:`correction`.
    corrections: tuple[tuple[str, int, float], ...] = ()
    #: (collective, bytes, seconds) of the MPI library's own call of each collective other
    #: than allreduce (``native`` holds allreduce's), as user code calls it.
    natives: tuple[tuple[str, int, float], ...] = ()
    #: (collective, algorithm, bytes, measured ÷ modelled seconds) of the other collectives'
    #: schedules, as ``corrections`` holds the allreduce's (bytes: the work buffer's).
    family_corrections: tuple[tuple[str, str, int, float], ...] = ()
    shm_sync: float = 0.0
    shm_copy: float = 0.0
    shm_reduce: float = 0.0

    @property
    def has_shm(self) -> bool:
        """Whether the shared-memory constants were measured."""
        return self.shm_copy > 0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "step_overhead", "msg_overhead", "gamma", "shm_sync",
                     "shm_copy", "shm_reduce"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"calibration {name} must be a finite number >= 0, got {v!r}")
        pts = tuple(sorted((int(b), float(s)) for b, s in self.native))
        if any(s < 0 or not math.isfinite(s) for _, s in pts):
            raise ValueError(f"calibration native times must be finite and >= 0: {pts}")
        object.__setattr__(self, "native", pts)
        fixes = tuple(sorted((str(a), int(b), float(f)) for a, b, f in self.corrections))
        if any(not (math.isfinite(f) and f > 0) or b <= 0 for _, b, f in fixes):
            raise ValueError(f"calibration corrections must be positive and finite: {fixes}")
        object.__setattr__(self, "corrections", fixes)
        family = tuple(sorted((str(c), str(a), int(b), float(f))
                              for c, a, b, f in self.family_corrections))
        if any(not (math.isfinite(f) and f > 0) or b <= 0 for _, _, b, f in family):
            raise ValueError(f"calibration corrections must be positive and finite: {family}")
        object.__setattr__(self, "family_corrections", family)
        others = tuple(sorted((str(c), int(b), float(t)) for c, b, t in self.natives))
        if any(t < 0 or not math.isfinite(t) for _, _, t in others):
            raise ValueError(f"calibration native times must be finite and >= 0: {others}")
        object.__setattr__(self, "natives", others)

    def correction(self, algorithm: str, nbytes: int, collective: str = "allreduce") -> float:
        """The factor on ``algorithm``'s modelled time at ``nbytes`` of ``collective``:
        interpolated linearly in log2(bytes) between the measured sizes, the nearest measured
        factor outside them, and 1 when the algorithm was not measured for it."""
        pts = [(math.log2(b), f) for c, a, b, f in self.every_correction()
               if c == collective and a == algorithm]
        if not pts:
            return 1.0
        x = math.log2(max(nbytes, 1))
        if x <= pts[0][0]:
            return pts[0][1]
        for (x0, f0), (x1, f1) in zip(pts, pts[1:], strict=False):
            if x <= x1:
                return f0 + (f1 - f0) * (x - x0) / (x1 - x0)
        return pts[-1][1]

    def native_seconds(self, nbytes: int, collective: str = "allreduce") -> float | None:
        """The native call's time for ``nbytes`` of ``collective`` (the bytes of its work
        buffer), interpolated linearly between measured sizes and extrapolated along the last
        segment; None when nothing was measured."""
        pts = tuple((b, t) for c, b, t in self.every_native() if c == collective)
        if not pts:
            return None
        if len(pts) == 1 or nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, s0), (b1, s1) in zip(pts, pts[1:], strict=False):
            if nbytes <= b1:
                return s0 + (s1 - s0) * (nbytes - b0) / (b1 - b0)
        (b0, s0), (b1, s1) = pts[-2], pts[-1]
        return max(s1, s1 + (s1 - s0) * (nbytes - b1) / (b1 - b0))

    def every_correction(self) -> Iterator[tuple[str, str, int, float]]:
        """(collective, algorithm, bytes, factor) of every correction: the allreduce's are
        kept in ``corrections``, the other collectives' in ``family_corrections``."""
        for a, b, f in self.corrections:
            yield ("allreduce", a, b, f)
        yield from self.family_corrections

    def every_native(self) -> Iterator[tuple[str, int, float]]:
        """(collective, bytes, seconds) of every timing of the MPI library's own call: the
        allreduce's are kept in ``native``, the other collectives' in ``natives``."""
        for b, t in self.native:
            yield ("allreduce", b, t)
        yield from self.natives

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["native"] = [list(p) for p in self.native]
        d["corrections"] = [list(c) for c in self.corrections]
        d["natives"] = [list(c) for c in self.natives]
        d["family_corrections"] = [list(c) for c in self.family_corrections]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        return cls(alpha=float(d["alpha"]), beta=float(d["beta"]),
                   step_overhead=float(d.get("step_overhead", 0.0)),
                   msg_overhead=float(d.get("msg_overhead", 0.0)),
                   gamma=float(d.get("gamma", 0.0)),
                   native=tuple((int(b), float(s)) for b, s in d.get("native", ())),
                   meta=dict(d.get("meta", {})),
                   corrections=tuple((str(a), int(b), float(f))
                                     for a, b, f in d.get("corrections", ())),
                   natives=tuple((str(c), int(b), float(t))
                                 for c, b, t in d.get("natives", ())),
                   family_corrections=tuple((str(c), str(a), int(b), float(f)) for c, a, b, f
                                            in d.get("family_corrections", ())),
                   shm_sync=float(d.get("shm_sync", 0.0)),
                   shm_copy=float(d.get("shm_copy", 0.0)),
                   shm_reduce=float(d.get("shm_reduce", 0.0)))


def symmetric_on(name: str, network: Network, collective: str = "allreduce") -> bool:
    """Whether ``name``'s schedule set is equivariant under ``network``'s symmetry, so that
    :func:`price_symmetric` prices it exactly from rank 0 (see :mod:`bmlmpi.model.cost`): the
    record's :attr:`~bmlmpi.schedules.algorithms.Algorithm.symmetric` network kinds, for the
    collectives whose record is :attr:`~bmlmpi.schedules.collectives.Collective.symmetric`
    (a rooted collective or uneven blocks are not)."""
    if not collective_record(collective).symmetric:
        return False
    kinds = records.get(name).symmetric
    if isinstance(network, SharedMemoryNode | FatTree):
        return records.PORTS in kinds
    return isinstance(network, BCubeNetwork) and records.BCUBE in kinds


def algorithm_cost(name: str, count: int, itemsize: int, size: int, network: Network, *,
                   shape: Any = None, nodes: Any = None, collective: str = "allreduce",
                   root: int = 0, counts: Sequence[int] | None = None,
                   intra: str = "ring") -> Cost:
    """Price algorithm ``name`` for ``count`` elements of ``itemsize`` bytes on ``network``
    (``collective`` with its ``root`` and block ``counts``; ``nodes`` for the tiered ones,
    ``intra`` their node tier: ``ring`` messages or ``shm`` shared-memory steps)."""
    alg = records.get(name)
    if not alg.scheduled or not alg.serves(collective):
        raise ValueError(f"no {collective} schedule for algorithm {name!r}; known: "
                         f"{', '.join(records.scheduled(collective))}")
    if network.size != size:
        raise ValueError(f"{network.name} has {network.size} ranks, not {size}")
    if shape is None and isinstance(network, BCubeNetwork):
        shape = network.cube.radices  # bml on BCube hardware follows its wiring
    links = network.weights if isinstance(network, LinkMatrixNetwork | TwoTierNetwork) else None
    ctx = Context(size, count, itemsize, collective=collective, root=root,
                  counts=None if counts is None else tuple(counts), shape=shape, links=links,
                  nodes=nodes, intra=intra)

    def make(r: int) -> Schedule:
        return alg.build(ctx.at(r))
    if not collective_record(collective).in_place:  # its layouts may copy more than plainly
        scheds = [make(r) for r in range(size)]
        return replace(price(scheds, network), copied=max(layout_copied(s) for s in scheds))
    if symmetric_on(name, network, collective):
        first = make(0)
        # With fewer elements than pieces some ranges are empty, unevenly across ranks, and
        # rank 0 no longer stands for the others: then every rank's schedule is priced.
        if count >= size * max(first.streams, 1):
            return price_symmetric(first, network)
        return price([first, *(make(r) for r in range(1, size))], network)
    return price([make(r) for r in range(size)], network)


@functools.lru_cache(maxsize=64)
def _default_network(size: int) -> Network:
    return SharedMemoryNode(size)


@functools.lru_cache(maxsize=4096)
def _cached_cost(name: str, count: int, itemsize: int, size: int, network: Network,
                 shape: Any, nodes: Any, collective: str, root: int,
                 counts: tuple[int, ...] | None, intra: str = "ring") -> Cost:
    return algorithm_cost(name, count, itemsize, size, network, shape=shape, nodes=nodes,
                          collective=collective, root=root, counts=counts, intra=intra)


def _params(calib: Calibration | None, alpha: float | None, beta: float | None) -> Calibration:
    if calib is None:
        if alpha is None or beta is None:
            raise ValueError("an estimate needs a Calibration or both alpha and beta")
        return Calibration(alpha=alpha, beta=beta)
    if alpha is not None or beta is not None:
        return Calibration(alpha=calib.alpha if alpha is None else alpha,
                           beta=calib.beta if beta is None else beta,
                           step_overhead=calib.step_overhead, msg_overhead=calib.msg_overhead,
                           gamma=calib.gamma, native=calib.native, meta=calib.meta,
                           corrections=calib.corrections, natives=calib.natives,
                           family_corrections=calib.family_corrections,
                           shm_sync=calib.shm_sync, shm_copy=calib.shm_copy,
                           shm_reduce=calib.shm_reduce)
    return calib


def estimate(algorithms: Iterable[str], count: int, itemsize: int, size: int,
             topology: Network | None = None, alpha: float | None = None,
             beta: float | None = None, *, calib: Calibration | None = None,
             shape: Any = None, nodes: Any = None, collective: str = "allreduce",
             root: int = 0, counts: Sequence[int] | None = None,
             corrected: bool = True, intra: str = "ring") -> dict[str, float]:
    """Predicted seconds of each algorithm (``native`` only when the calibration measured it;
    ``auto`` is skipped). Arguments as :func:`cheapest`; ``intra``: the node tier the tiered
    algorithms run (``shm``: priced by the shared-memory model); ``corrected=False`` leaves out the
    calibration's measured corrections (they apply only on the default network, the
    calibrated machine itself, each collective's its own)."""
    if count < 0 or itemsize <= 0 or size < 1:
        raise ValueError(f"need count >= 0, itemsize > 0, size >= 1; got {count}, {itemsize}, "
                         f"{size}")
    p = _params(calib, alpha, beta)
    network = topology if topology is not None else _default_network(size)
    shape_key = tuple(shape) if isinstance(shape, list) else shape
    counts_key = None if counts is None else tuple(int(c) for c in counts)
    out: dict[str, float] = {}
    for name in algorithms:
        name = name.lower()
        if name == "auto" or name in out:
            continue
        if name == records.NATIVE:
            t = p.native_seconds(count * itemsize, collective)
            if t is not None:
                out[name] = t
            continue
        cost = _cached_cost(name, count, itemsize, size, network, shape_key, nodes, collective,
                            root, counts_key, intra)
        seconds = cost.seconds(itemsize, p.alpha, p.beta, step_overhead=p.step_overhead,
                               msg_overhead=p.msg_overhead, gamma=p.gamma,
                               shm_sync=p.shm_sync, shm_copy=p.shm_copy,
                               shm_reduce=p.shm_reduce)
        if topology is None and corrected:
            # the calibrated machine itself: scale by what its runs measured against the model
            seconds *= p.correction(name, count * itemsize, collective)
        out[name] = seconds
    return out


def cheapest(algorithms: Iterable[str], count: int, itemsize: int, size: int,
             topology: Network | None = None, alpha: float | None = None,
             beta: float | None = None, *, calib: Calibration | None = None,
             shape: Any = None, nodes: Any = None, collective: str = "allreduce",
             root: int = 0, counts: Sequence[int] | None = None) -> str:
    """The algorithm among ``algorithms`` with the lowest predicted time for ``count``
    elements of ``itemsize`` bytes on ``size`` ranks.

    ``topology``: the network (default: one shared-memory node). ``alpha``/``beta`` override
    the calibration's (or stand alone, with no executor overheads). ``shape``: the BCube shape
    bml runs (default as bml resolves it). ``nodes``: which ranks share a node (for the tiered
    algorithms). ``collective``, ``root``, ``counts``: what is priced (an allreduce by
    default; ``count`` is always the work buffer's elements). Ties go to the earlier name.
    """
    names = [a.lower() for a in algorithms]
    times = estimate(names, count, itemsize, size, topology, alpha, beta, calib=calib,
                     shape=shape, nodes=nodes, collective=collective, root=root,
                     counts=counts)
    if not times:
        raise ValueError(f"no estimate for any of {names} (native needs calibrated timings)")
    return min(times, key=lambda n: (times[n], names.index(n)))


def crossover(cheap_small: str, cheap_large: str, itemsize: int, size: int,
              topology: Network | None = None, *, calib: Calibration,
              max_count: int = 1 << 30, shape: Any = None, nodes: Any = None,
              collective: str = "allreduce", root: int = 0) -> int | None:
    """The smallest count (to within 1%) from which ``cheap_large`` is predicted strictly
    faster than ``cheap_small``: the first power of two where it is, refined by bisection
    below it. None if it never is up to ``max_count``. Assumes one crossing (both costs are
    affine in count apart from rounding; at tiny counts the two may tie)."""
    def large_wins(c: int) -> bool:
        t = estimate([cheap_small, cheap_large], c, itemsize, size, topology, calib=calib,
                     shape=shape, nodes=nodes, collective=collective, root=root)
        return t[cheap_large] < t[cheap_small]

    lo, hi = 0, 1
    while not large_wins(hi):
        if hi >= max_count:
            return None
        lo, hi = hi, min(hi * 2, max_count)
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if large_wins(mid) else (mid, hi)
    return hi


__all__ = ["Calibration", "algorithm_cost", "cheapest", "crossover", "estimate",
           "symmetric_on"]
