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
nodes from MPI placement, or ``BMLMPI_RANKS_PER_NODE``), priced like the others.
The tree candidates are offered up to ``AUTO_TREE_MAX_RANKS`` ranks (generating the multi-tree
set costs seconds beyond that), and between the two trees the size bound
``BMLMPI_TREE_ARRAY_BOUND`` (elements) decides when it is set: single tree at or below it,
multi-tree above, as in the MXNet proposal.

Without a calibration (``BMLMPI_CALIBRATE=0``), a fixed rule measured on the development
machine stands in: native below 64 KiB, bml from there (``BMLMPI_AUTO_BML_BYTES``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import config

IMPLEMENTED = ("auto", "bml", "ring", "tree", "multitree", "hierarchical", "native")
SCHEDULED = ("bml", "ring", "tree", "multitree", "hierarchical")
DEFAULT_BML_BYTES: int = config.variable("BMLMPI_AUTO_BML_BYTES").default
#: ``auto`` leaves native only for a schedule predicted at least this much faster: a near-tie
#: is not worth a schedule's noisier estimate, and keeping native costs at most this factor.
#: (It was 1.10 while "native" was timed as bmlmpi's polled pass-through, a slower baseline
#: that the margin partly made up for; against the real blocking call it is the 1.05 that
#: ``auto`` is held to.)
NATIVE_MARGIN = 1.05
AUTO_TREE_MAX_RANKS = 16


#: The collectives besides allreduce, and the scheduled algorithms each one runs.
FAMILY_SCHEDULED: dict[str, tuple[str, ...]] = {
    "reduce_scatter": (), "allgather": (), "reduce": (), "bcast": (),
}


def algorithms(collective: str = "allreduce") -> list[str]:
    """The algorithms implemented for ``collective`` (default: allreduce), ``auto`` first
    and ``native`` last."""
    if collective == "allreduce":
        return list(IMPLEMENTED)
    try:
        scheduled = FAMILY_SCHEDULED[collective]
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; known: allreduce, "
                         f"{', '.join(FAMILY_SCHEDULED)}") from None
    return ["auto", *scheduled, "native"]


def choose_collective(collective: str, count: int, itemsize: int, size: int) -> str:
    """The algorithm ``auto`` runs for a reduce-scatter, allgather, reduce or broadcast of
    ``count`` elements in all: ``BMLMPI_ALGORITHM`` where it names an algorithm of this
    collective, else native."""
    env = config.get("BMLMPI_ALGORITHM")
    if env and env.lower() in FAMILY_SCHEDULED[collective]:
        return env.lower()
    return "native"


def check_algorithm(name: str) -> str:
    name = name.lower()
    if name not in IMPLEMENTED:
        raise ValueError(f"unknown algorithm {name!r}; implemented: {', '.join(IMPLEMENTED)}")
    return name


def env_algorithm() -> str | None:
    env = config.get("BMLMPI_ALGORITHM")
    if env is None:
        return None
    try:
        return check_algorithm(env)
    except ValueError as exc:
        raise config.ConfigError(f"BMLMPI_ALGORITHM={env!r}: {exc}") from None


def tree_array_bound() -> int | None:
    return config.get("BMLMPI_TREE_ARRAY_BOUND")


def candidates(count: int, size: int, nodes=None) -> list[str]:
    names = ["bml", "ring"]
    if nodes is not None and nodes.count > 1 and nodes.max_local > 1:
        names.append("hierarchical")  # only where ranks share nodes: else it is bml or ring
    if size <= AUTO_TREE_MAX_RANKS:
        bound = tree_array_bound()
        if bound is None:
            names += ["tree", "multitree"]
        else:
            names.append("tree" if count <= bound else "multitree")
    return names + ["native"]


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
    model``), in words (``why``), and the ``candidates`` it priced, cheapest first."""

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

    def as_dict(self) -> dict:
        d = asdict(self)
        d["nbytes"] = self.nbytes
        return d

    def __str__(self) -> str:
        lines = [f"{self.collective} of {self.count} x {self.itemsize} B on {self.size} "
                 f"ranks: {self.chosen} ({self.rule}: {self.why})"]
        for c in self.candidates:
            model = "measured" if c.model is None else f"model {c.model * 1e6:.1f} us x " \
                                                      f"{c.correction:.2f}"
            mark = "  <- chosen" if c.name == self.chosen else ""
            lines.append(f"  {c.name:<13} {c.predicted * 1e6:10.1f} us  ({model}){mark}")
        return "\n".join(lines)


def explain(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None,
            collective: str = "allreduce") -> Explanation:
    """What ``auto`` runs for ``count`` elements of ``itemsize`` bytes on ``size`` ranks
    (``nodes``: which ranks share a node, :class:`bmlmpi.topology.nodes.Nodes`), and why."""
    def decided(chosen: str, rule: str, why: str, cands=()) -> Explanation:
        return Explanation(collective, count, itemsize, size, chosen, rule, why, tuple(cands))

    env = env_algorithm()
    if env and env != "auto":
        return decided(env, "BMLMPI_ALGORITHM", f"BMLMPI_ALGORITHM={env} overrides auto")
    if count == 0:
        return decided("bml", "empty", "an empty buffer has nothing to exchange (bml: no "
                                       "steps)")
    if size == 1:
        # nothing to exchange: MPI_Allreduce on one rank is a copy, and native is the
        # blocking fast path (a schedule's empty run costs ~10 µs of Python per call)
        return decided("native", "one rank", "nothing to exchange: native is a "
                                             "copy through the blocking fast path")
    if calib is None:
        threshold = config.get("BMLMPI_AUTO_BML_BYTES")
        chosen = "bml" if count * itemsize >= threshold else "native"
        return decided(chosen, "fixed rule",
                       f"no calibration (BMLMPI_CALIBRATE=0): native below "
                       f"BMLMPI_AUTO_BML_BYTES={threshold} B, bml from it; this call is "
                       f"{count * itemsize} B")
    from .model import estimate

    names = candidates(count, size, nodes)
    builders = None
    if "hierarchical" in names:
        from .schedules.hierarchical import hierarchical_schedule
        builders = {"hierarchical": lambda r, n, c, i: hierarchical_schedule(r, n, c, nodes)}
    times = estimate(names, count, itemsize, size, calib=calib, shape=shape, builders=builders)
    raw = estimate([n for n in times if n != "native"], count, itemsize, size, calib=calib,
                   shape=shape, builders=builders, corrected=False)
    chosen = prefer_native(times)
    cands = sorted((Candidate(n, t, raw.get(n), t / raw[n] if raw.get(n) else 1.0)
                    for n, t in times.items()), key=lambda c: c.predicted)
    best = cands[0]
    if chosen == "native" and best.name != "native":
        why = (f"native kept: {best.name} is predicted {best.predicted * 1e6:.1f} us against "
               f"native's measured {times['native'] * 1e6:.1f} us, less than the "
               f"{NATIVE_MARGIN:g}x margin a schedule must win by")
    elif chosen == "native":
        why = "native is the cheapest (its time measured by the calibration)"
    elif "native" in times:
        why = (f"{chosen} is predicted {times[chosen] * 1e6:.1f} us, at least "
               f"{NATIVE_MARGIN:g}x faster than native's measured {times['native'] * 1e6:.1f} us")
    else:
        why = f"{chosen} is predicted the cheapest"
    return decided(chosen, "cost model", why, cands)


def choose(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None) -> str:
    """The algorithm ``auto`` uses for ``count`` elements of ``itemsize`` bytes on ``size``
    ranks (``nodes``: which ranks share a node, :class:`bmlmpi.topology.nodes.Nodes`)."""
    return explain(count, itemsize, size, calib, shape, nodes).chosen


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
