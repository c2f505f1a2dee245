"""Which algorithm ``auto`` runs.

The rule: ``BMLMPI_ALGORITHM`` (when set and not ``auto``) wins; an empty buffer has nothing to
exchange (``bml``, which has no steps); one rank runs ``native`` (a copy, through the blocking
fast path); otherwise the cost model
(:func:`bmlmpi.model.estimate`) prices every candidate's schedule on one shared-memory node with
this machine's calibration (α, β, the Python executor's per-step and per-message overheads,
the reduction cost and measured timings of the MPI library's blocking ``MPI_Allreduce`` as
user code calls it — :mod:`bmlmpi.calibrate`, measured once per host, MPI library and rank
count, cached on disk) and takes the cheapest, except that native stays unless a schedule is
predicted ``NATIVE_MARGIN`` (5 %) faster: the most ``auto`` may then give away against the
better of native and the best schedule is that margin, the issue's target for ``auto``.
Every rank holds the same calibration, so every rank reaches the same choice without talking.
``hierarchical`` is a candidate where more than one node holds more than one rank (real
nodes from MPI placement, or ``BMLMPI_RANKS_PER_NODE``), priced like the others, its node
tier by the shared-memory model where the calibration measured shared memory (it runs there
in shared memory), else by the message model. ``shm`` is a candidate where all ranks are on
one node and the calibration measured its constants (σ per step, β_copy, γ_shm), for every
collective of the family.
The tree candidates are offered up to ``AUTO_TREE_MAX_RANKS`` ranks (generating the multi-tree
set costs seconds beyond that), and between the two trees the size bound
``BMLMPI_TREE_ARRAY_BOUND`` (elements) decides when it is set: single tree at or below it,
multi-tree above, as in the MXNet proposal.

Without a calibration (``BMLMPI_CALIBRATE=0``), a fixed rule measured on the development
machine stands in: native below 64 KiB, bml from there (``BMLMPI_AUTO_BML_BYTES``).

The other collectives (``collective=``: reduce_scatter, allgather, reduce, bcast) follow the
same rule over their own algorithms (:func:`algorithms`); the calibration's native points for
that collective price the native call, and where it has none the fixed rule stands in (bml,
or the collective's first algorithm where bml does not serve it). The candidates, the size
bounds and which algorithm serves which collective all come from the algorithm records
(:mod:`bmlmpi.schedules.algorithms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import config
from .schedules import algorithms as records
from .schedules.algorithms import AUTO_TREE_MAX_RANKS, Context, tree_array_bound

#: ``auto`` leaves native only for a schedule predicted at least this much faster: a near-tie
#: is not worth a schedule's noisier estimate, and keeping native costs at most this factor.
NATIVE_MARGIN = 1.05

__all__ = ["AUTO_TREE_MAX_RANKS", "NATIVE_MARGIN", "Candidate", "Explanation", "algorithms",
           "calibration_wanted", "candidates", "check_algorithm", "choose",
           "choose_collective", "env_algorithm", "explain", "explain_collective",
           "prefer_native", "tree_array_bound"]


def algorithms(collective: str = "allreduce") -> list[str]:
    """The algorithms implemented for ``collective`` (the allreduce by default), ``auto``
    first and ``native`` last (:func:`bmlmpi.schedules.algorithms.algorithms`)."""
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
    """What ``auto`` prices: every algorithm of ``collective`` whose record applies, then
    ``native``."""
    return records.candidates(Context(size, count, collective=collective, root=root,
                                      counts=counts, nodes=nodes))


@dataclass(frozen=True)
class Candidate:
    """One algorithm ``auto`` priced: ``predicted`` seconds (what the choice compares),
    ``model`` seconds (the α-β model with the calibration's overheads, before its measured
    correction; None for native, which is measured) and the ``correction`` factor between."""

    name: str
    predicted: float
    model: float | None
    correction: float


@dataclass(frozen=True)
class Explanation:
    """Why ``auto`` runs ``chosen`` for one signature: the ``rule`` that decided
    (``BMLMPI_ALGORITHM``, ``asked``, ``empty``, ``one rank``, ``fixed rule``, ``cost
    model``, ``family``), in words (``why``), and the ``candidates`` it priced, cheapest
    first."""

    collective: str
    count: int
    itemsize: int
    size: int
    chosen: str
    rule: str
    why: str
    candidates: tuple[Candidate, ...] = ()

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
    if count == 0:
        # nothing to exchange: a schedule with no steps (bml's allreduce), else native
        chosen = "bml" if collective == "allreduce" else records.NATIVE
        return decided(chosen, "empty", f"an empty buffer has nothing to exchange ({chosen})")
    if size == 1:
        # nothing to exchange: the collective on one rank is a copy, and native is the
        # blocking fast path (a schedule's empty run costs ~10 µs of Python per call)
        return decided(records.NATIVE, "one rank", "nothing to exchange: native is a copy "
                                                   "through the blocking fast path")
    threshold = config.get("BMLMPI_AUTO_BML_BYTES")
    fixed = "bml" if collective == "allreduce" else _fixed_choice(collective)
    if calib is None or (collective != "allreduce"
                         and calib.native_seconds(count * itemsize, collective) is None):
        # no calibration, or none of this collective's native call: the fixed rule
        chosen = fixed if count * itemsize >= threshold else records.NATIVE
        what = ("no calibration (BMLMPI_CALIBRATE=0)" if calib is None
                else f"the calibration has no native {collective} timings")
        return decided(chosen, "fixed rule",
                       f"{what}: native below BMLMPI_AUTO_BML_BYTES={threshold} B, {fixed} "
                       f"from it; this call is {count * itemsize} B")
    from .model import estimate

    names = candidates(count, size, nodes, collective, root, counts)
    if not calib.has_shm:  # shared memory not measured here (several nodes, or one rank)
        names = [n for n in names if n != "shm"]
    # hierarchical's node tier runs in shared memory where the nodes' ranks share it; it is
    # priced so where the calibration measured shared memory (σ, β_copy, γ_shm)
    intra = "shm" if calib.has_shm else "ring"
    kw = dict(calib=calib, shape=shape, nodes=nodes, collective=collective, root=root,
              counts=counts, intra=intra)
    times = estimate(names, count, itemsize, size, **kw)
    raw = estimate([n for n in times if n != records.NATIVE], count, itemsize, size,
                   corrected=False, **kw)
    chosen = prefer_native(times)
    cands = sorted((Candidate(n, t, raw.get(n), t / raw[n] if raw.get(n) else 1.0)
                    for n, t in times.items()), key=lambda c: c.predicted)
    best = cands[0]
    if chosen == records.NATIVE and best.name != records.NATIVE:
        why = (f"native kept: {best.name} is predicted {best.predicted * 1e6:.1f} us against "
               f"native's measured {times['native'] * 1e6:.1f} us, less than the "
               f"{NATIVE_MARGIN:g}x margin a schedule must win by")
    elif chosen == records.NATIVE:
        why = "native is the cheapest (its time measured by the calibration)"
    elif records.NATIVE in times:
        why = (f"{chosen} is predicted {times[chosen] * 1e6:.1f} us, at least "
               f"{NATIVE_MARGIN:g}x faster than native's measured {times['native'] * 1e6:.1f} us")
    else:
        why = f"{chosen} is predicted the cheapest"
    return decided(chosen, "cost model", why, cands)


def choose(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None, *,
           collective: str = "allreduce", root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` uses (:func:`explain`'s choice)."""
    return explain(count, itemsize, size, calib, shape, nodes, collective=collective,
                   root=root, counts=counts).chosen


def explain_collective(collective: str, count: int, itemsize: int, size: int, calib=None,
                       shape=None, nodes=None, root: int = 0, counts=None) -> Explanation:
    """What ``auto`` runs for a reduce-scatter, allgather, reduce or broadcast of ``count``
    elements in all, and why: ``BMLMPI_ALGORITHM`` where it names an algorithm of this
    collective; with a calibration, :func:`explain`'s priced choice; without one, native (the
    family's fixed rule: no schedule of these collectives was measured against native on an
    uncalibrated machine)."""
    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return Explanation(collective, count, itemsize, size, env, "BMLMPI_ALGORITHM",
                           f"BMLMPI_ALGORITHM={env} overrides auto")
    if calib is None:
        return Explanation(collective, count, itemsize, size, records.NATIVE, "fixed rule",
                           "no calibration: the family runs native (no schedule of these "
                           "collectives was measured against native here)")
    return explain(count, itemsize, size, calib, shape, nodes, collective=collective,
                   root=root, counts=counts)


def choose_collective(collective: str, count: int, itemsize: int, size: int, calib=None,
                      shape=None, nodes=None, root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` runs for a reduce-scatter, allgather, reduce or broadcast
    (:func:`explain_collective`'s choice)."""
    return explain_collective(collective, count, itemsize, size, calib, shape, nodes, root,
                              counts).chosen


def _fixed_choice(collective: str) -> str:
    """The schedule the fixed rule runs for large messages of ``collective``: bml where it
    serves it, else the first that does."""
    names = records.algorithms(collective)[1:-1]
    return "bml" if "bml" in names else (names[0] if names else records.NATIVE)


def prefer_native(times: dict[str, float], margin: float = NATIVE_MARGIN) -> str:
    """The cheapest of the predicted ``times``, except that native is kept unless a schedule
    is predicted at least ``margin`` times faster: native's time is measured directly, a
    schedule's is a model scaled by a few noisy runs, and a near-tie is not worth the risk."""
    best = min(times, key=times.__getitem__)  # ties: the earlier candidate
    if best != "native" and "native" in times and times["native"] <= margin * times[best]:
        return "native"
    return best


def calibration_wanted(algorithm: str) -> bool:
    env = env_algorithm()
    if algorithm != "auto" or (env and env != "auto"):
        return False
    return config.get("BMLMPI_CALIBRATE")
