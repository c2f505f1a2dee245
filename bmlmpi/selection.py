"""Which algorithm ``auto`` runs, read from the algorithm records alone.

Every rule below is a field of a record (:class:`bmlmpi.schedules.algorithms.Algorithm`); this
module names no algorithm, so a record changes what ``auto`` does without a line here.

The rule: ``BMLMPI_ALGORITHM`` (when set and not ``auto``) wins; an empty buffer has nothing
to exchange (the record whose ``empty`` claims the collective: a schedule with no steps, else
the ``default`` record); one rank runs the ``default`` record (the MPI library's own call: a
copy, through the blocking fast path); otherwise the cost model (:func:`bmlmpi.model.estimate`)
prices every candidate — each record that opts in with ``auto=True``, serves the collective,
allows the rank count (``max_ranks``) and applies (``applies(ctx)``) — on one shared-memory
node with this machine's calibration (α, β, the Python executor's per-step and per-message
overheads, the reduction cost and measured timings of the MPI library's own blocking call as
user code calls it — :mod:`bmlmpi.calibrate`, measured once per host, MPI library and rank
count, cached on disk) and takes the cheapest, except that a candidate whose record carries a
``margin`` above 1 stays unless another is predicted that many times faster (the default
record's time is measured, a schedule's is a model scaled by a few noisy runs).
Every rank holds the same calibration, so every rank reaches the same choice without talking.
A record marked ``shared_memory`` is a candidate only where the calibration measured shared
memory (σ per step, β_copy, γ_shm), and there the tiered records' node tier is priced as it
(:func:`bmlmpi.schedules.algorithms.node_tier`), else by the message model.
Records with ``max_ranks`` are offered up to that many ranks (``AUTO_TREE_MAX_RANKS`` for
those whose schedules cost seconds to build beyond it), and the records' ``applies`` read the
size bounds (``BMLMPI_TREE_ARRAY_BOUND``).

Without a calibration (``BMLMPI_CALIBRATE=0``), or without the calibration's timings of the
MPI library's own call of the collective, a fixed rule measured on the development machine
stands in: the ``default`` record below ``BMLMPI_AUTO_BML_BYTES`` (64 KiB), from there the
record whose ``fixed`` claims the collective (:func:`bmlmpi.schedules.algorithms.fixed_choice`).
That holds for a collective whose record is
:attr:`~bmlmpi.schedules.collectives.Collective.calibrated` (the allreduce: every calibration
measures it); for the others :func:`explain_collective` runs the ``default`` record where
there is no calibration at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import config
from .schedules import algorithms as records
from .schedules.algorithms import AUTO_TREE_MAX_RANKS, Context, tree_array_bound
from .schedules.collectives import collective as collective_record

__all__ = ["AUTO_TREE_MAX_RANKS", "Candidate", "Explanation", "algorithms",
           "calibration_wanted", "candidates", "check_algorithm", "choose",
           "choose_collective", "env_algorithm", "explain", "explain_collective",
           "prefer_kept", "auto_decides", "tree_array_bound"]


def algorithms(collective: str = "allreduce") -> list[str]:
    """The algorithms implemented for ``collective`` (the allreduce by default), ``auto``
    first and the MPI library's own call last
    (:func:`bmlmpi.schedules.algorithms.algorithms`)."""
    return records.algorithms(collective)


def _every_algorithm() -> list[str]:
    names = [records.AUTO]
    for coll in records.NAMES:
        names += [n for n in records.algorithms(coll) if n not in names]
    return names


def check_algorithm(name: str, collective: str | None = None) -> str:
    """``name`` in lower case if it is implemented (for ``collective``, else for any)."""
    name = name.lower()
    known = _every_algorithm() if collective is None else records.algorithms(collective)
    if name not in known:
        what = "implemented" if collective is None else f"implemented for {collective}"
        raise ValueError(f"unknown algorithm {name!r}; {what}: {', '.join(known)}")
    return name


def env_algorithm() -> str | None:
    env = config.get("BMLMPI_ALGORITHM")
    if env is None:
        return None
    try:
        return check_algorithm(env)
    except ValueError as exc:
        raise config.ConfigError(f"BMLMPI_ALGORITHM={env!r}: {exc}") from None


def candidates(count: int, size: int, nodes=None, collective: str = "allreduce",
               root: int = 0, counts=None) -> list[str]:
    """What ``auto`` prices (:func:`bmlmpi.schedules.algorithms.candidates`): every record
    that opts in to ``auto`` and applies, in registration order."""
    return records.candidates(Context(size, count, collective=collective, root=root,
                                      counts=counts, nodes=nodes))


@dataclass(frozen=True)
class Candidate:
    """One algorithm ``auto`` priced: ``predicted`` seconds (what the choice compares),
    ``model`` seconds (the α-β model with the calibration's overheads, before its measured
    correction; None for a record without a schedule, whose time is measured) and the
    ``correction`` factor between."""

    name: str
    predicted: float
    model: float | None
    correction: float


@dataclass(frozen=True)
class Explanation:
    """Why ``auto`` runs ``chosen`` for one signature: the ``rule`` that decided
    (``BMLMPI_ALGORITHM``, ``asked``, ``empty``, ``one rank``, ``fixed rule``, ``cost
    model``, ``no candidate``; and where the user's calls are timed
    (:mod:`bmlmpi.auto_tuning`): ``exploring``, ``measured``, ``table``, ``model``, ``rule``),
    in words (``why``), the ``candidates`` it priced, cheapest first, and the ``tuning``
    report of the signature's measured choice (:class:`bmlmpi.tuner.TuningReport`: per
    candidate the predicted and the measured time; None where nothing is timed).
    ``applicable``: where nothing was priced (the fixed rule), every record that opts in to
    ``auto`` and applies, in registration order: what the user's calls time instead."""

    collective: str
    count: int
    itemsize: int
    size: int
    chosen: str
    rule: str
    why: str
    candidates: tuple[Candidate, ...] = ()
    tuning: Any = None
    applicable: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def __str__(self) -> str:
        lines = [f"{self.collective} of {self.count} x {self.itemsize} B on {self.size} "
                 f"ranks: {self.chosen} ({self.rule}: {self.why})"]
        for c in self.candidates:
            model = ("measured" if c.model is None
                     else f"model {c.model * 1e6:.1f} us x {c.correction:.2f}")
            mark = "  <- chosen" if c.name == self.chosen else ""
            lines.append(f"  {c.name:<13} {c.predicted * 1e6:10.1f} us  ({model}){mark}")
        if self.tuning is not None:
            lines.append(f"timed on the user's calls: {self.tuning}")
        return "\n".join(lines)


def explain(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None, *,
            collective: str = "allreduce", root: int = 0, counts=None) -> Explanation:
    """What ``auto`` runs for ``count`` elements (the work buffer's) of ``itemsize`` bytes on
    ``size`` ranks (``nodes``: which ranks share a node, :class:`bmlmpi.topology.nodes.Nodes`)
    for ``collective`` (its ``root`` and block ``counts``), and why. ``BMLMPI_ALGORITHM``
    applies where it names an algorithm of the collective; for another collective ``auto``
    decides."""
    def decided(chosen: str, rule: str, why: str, cands=()) -> Explanation:
        return Explanation(collective, count, itemsize, size, chosen, rule, why, tuple(cands))

    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return decided(env, "BMLMPI_ALGORITHM", f"BMLMPI_ALGORITHM={env} overrides auto")
    default = records.default(collective).name
    if count == 0:
        chosen = records.for_empty(collective)
        return decided(chosen, "empty", f"an empty buffer has nothing to exchange ({chosen})")
    if size == 1:
        # nothing to exchange: the collective on one rank is a copy, and the default record's
        # call is the blocking fast path (a schedule's empty run costs ~10 µs of Python)
        return decided(default, "one rank", f"nothing to exchange: {default} is a copy "
                                            "through the blocking fast path")
    threshold = config.get("BMLMPI_AUTO_BML_BYTES")
    fixed = records.fixed_choice(collective)
    if calib is None or (not collective_record(collective).calibrated
                         and calib.native_seconds(count * itemsize, collective) is None):
        # no calibration, or none of this collective's own call: the fixed rule
        chosen = fixed if count * itemsize >= threshold else default
        what = ("no calibration (BMLMPI_CALIBRATE=0, refused, or not taken yet: a "
                "communicator takes it after its first auto call)" if calib is None
                else f"the calibration has no {default} {collective} timings")
        return dataclasses.replace(
            decided(chosen, "fixed rule",
                    f"{what}: {default} below BMLMPI_AUTO_BML_BYTES={threshold} B, {fixed} "
                    f"from it; this call is {count * itemsize} B"),
            applicable=tuple(candidates(count, size, nodes, collective, root, counts)))
    from .model import estimate

    names = candidates(count, size, nodes, collective, root, counts)
    if not calib.has_shm:  # shared memory not measured here (several nodes, or one rank)
        names = [n for n in names if not records.get(n).shared_memory]
    if not names:
        return decided(default, "no candidate", f"no record that opts in to auto serves "
                                                f"{collective}: {default}, the first that does")
    # the tiered records' node tier runs in shared memory where the nodes' ranks share it;
    # it is priced so where the calibration measured shared memory (σ, β_copy, γ_shm)
    kw = dict(calib=calib, shape=shape, nodes=nodes, collective=collective, root=root,
              counts=counts, intra=records.node_tier(calib.has_shm))
    times = estimate(names, count, itemsize, size, **kw)
    raw = estimate([n for n in times if records.get(n).scheduled], count, itemsize, size,
                   corrected=False, **kw)
    chosen = prefer_kept(times)
    cands = sorted((Candidate(n, t, raw.get(n), t / raw[n] if raw.get(n) else 1.0)
                    for n, t in times.items()), key=lambda c: c.predicted)
    best = cands[0]
    margins = _margins(times)
    if chosen != best.name:
        why = (f"{chosen} kept: {best.name} is predicted {best.predicted * 1e6:.1f} us against "
               f"{chosen}'s {_how(chosen)} {times[chosen] * 1e6:.1f} us, less than the "
               f"{margins[chosen]:g}x margin a schedule must win by")
    elif not records.get(chosen).scheduled:
        why = f"{chosen} is the cheapest (its time measured by the calibration)"
    elif margins:
        kept = min(margins, key=times.__getitem__)
        why = (f"{chosen} is predicted {times[chosen] * 1e6:.1f} us, at least "
               f"{margins[kept]:g}x faster than {kept}'s {_how(kept)} "
               f"{times[kept] * 1e6:.1f} us")
    else:
        why = f"{chosen} is predicted the cheapest"
    return decided(chosen, "cost model", why, cands)


def _how(name: str) -> str:
    """How ``auto`` knows ``name``'s time: measured (no schedule to price) or predicted."""
    return "predicted" if records.get(name).scheduled else "measured"


def choose(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None, *,
           collective: str = "allreduce", root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` uses (:func:`explain`'s choice)."""
    return explain(count, itemsize, size, calib, shape, nodes, collective=collective,
                   root=root, counts=counts).chosen


def explain_collective(collective: str, count: int, itemsize: int, size: int, calib=None,
                       shape=None, nodes=None, root: int = 0, counts=None) -> Explanation:
    """What ``auto`` runs for ``collective`` of ``count`` elements in all, and why:
    ``BMLMPI_ALGORITHM`` where it names an algorithm of this collective; :func:`explain`'s
    choice; except that without a calibration a collective whose record is not
    :attr:`~bmlmpi.schedules.collectives.Collective.calibrated` (every one but the
    allreduce) runs the ``default`` record (no schedule of it was measured against the MPI
    library's own call on an uncalibrated machine)."""
    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return Explanation(collective, count, itemsize, size, env, "BMLMPI_ALGORITHM",
                           f"BMLMPI_ALGORITHM={env} overrides auto")
    if (calib is None and not collective_record(collective).calibrated
            and count > 0 and size > 1):   # (an empty call, one rank: explain's own rules)
        default = records.default(collective).name
        return Explanation(collective, count, itemsize, size, default, "fixed rule",
                           f"no calibration: the family runs {default} (no schedule of these "
                           f"collectives was measured against {default} here)",
                           applicable=tuple(candidates(count, size, nodes, collective, root,
                                                       counts)))
    return explain(count, itemsize, size, calib, shape, nodes, collective=collective,
                   root=root, counts=counts)


def choose_collective(collective: str, count: int, itemsize: int, size: int, calib=None,
                      shape=None, nodes=None, root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` runs for ``collective`` (:func:`explain_collective`'s
    choice)."""
    return explain_collective(collective, count, itemsize, size, calib, shape, nodes, root,
                              counts).chosen


def _margins(times: dict[str, float]) -> dict[str, float]:
    """The margins the records of ``times``' candidates carry (those above 1)."""
    return {n: records.get(n).margin for n in times if records.get(n).margin > 1.0}


def prefer_kept(times: dict[str, float], margins: dict[str, float] | None = None) -> str:
    """The cheapest of the predicted ``times``, except that a candidate with a margin
    (``margins``, else its record's :attr:`~bmlmpi.schedules.algorithms.Algorithm.margin`
    where above 1) is kept unless the cheapest is predicted at least that many times faster:
    the default record's time is measured directly, a schedule's is a model scaled by a few
    noisy runs, and a near-tie is not worth the risk."""
    best = min(times, key=times.__getitem__)  # ties: the earlier candidate
    margins = _margins(times) if margins is None else margins
    kept = [n for n in times if n != best and n in margins
            and times[n] <= margins[n] * times[best]]
    return min(kept, key=times.__getitem__) if kept else best


def auto_decides(collective: str, count: int, size: int) -> bool:
    """Whether :func:`explain` has a choice to make for an ``auto`` call of ``collective``
    (``count`` elements on ``size`` ranks): not where ``BMLMPI_ALGORITHM`` decides, for an
    empty call or on one rank. The same answer on every rank for the same call."""
    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return False
    return count > 0 and size > 1


def calibration_wanted(algorithm: str) -> bool:
    env = env_algorithm()
    if algorithm != records.AUTO or (env and env != records.AUTO):
        return False
    return config.get("BMLMPI_CALIBRATE")
