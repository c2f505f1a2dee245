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
nodes from MPI placement, or ``BMLMPI_RANKS_PER_NODE``), priced like the others. ``shm`` is
a candidate where all ranks are on one node and the calibration measured its constants
(σ per step, β_copy, γ_shm).
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

from . import config
from .schedules import algorithms as records
from .schedules.algorithms import AUTO_TREE_MAX_RANKS, Context, tree_array_bound

DEFAULT_BML_BYTES: int = config.variable("BMLMPI_AUTO_BML_BYTES").default
#: ``auto`` leaves native only for a schedule predicted at least this much faster: a near-tie
#: is not worth a schedule's noisier estimate, and keeping native costs at most this factor.
NATIVE_MARGIN = 1.05

__all__ = ["AUTO_TREE_MAX_RANKS", "NATIVE_MARGIN", "algorithms", "calibration_wanted",
           "candidates", "check_algorithm", "choose", "choose_collective", "env_algorithm",
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


def choose(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None, *,
           collective: str = "allreduce", root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` uses for ``count`` elements (the work buffer's) of ``itemsize``
    bytes on ``size`` ranks (``nodes``: which ranks share a node,
    :class:`bmlmpi.topology.nodes.Nodes`) for ``collective`` (its ``root`` and block
    ``counts``). ``BMLMPI_ALGORITHM`` applies where it names an algorithm of the collective;
    for another collective ``auto`` decides."""
    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return env
    if count == 0:
        # nothing to exchange: a schedule with no steps (bml's allreduce), else native
        return "bml" if collective == "allreduce" else records.NATIVE
    if size == 1:
        # nothing to exchange: the collective on one rank is a copy, and native is the
        # blocking fast path (a schedule's empty run costs ~10 µs of Python per call)
        return records.NATIVE
    threshold = config.get("BMLMPI_AUTO_BML_BYTES")
    fixed = "bml" if collective == "allreduce" else _fixed_choice(collective)
    if calib is None or (collective != "allreduce"
                         and calib.native_seconds(count * itemsize, collective) is None):
        # no calibration, or none of this collective's native call: the fixed rule
        return fixed if count * itemsize >= threshold else records.NATIVE
    from .model import estimate

    names = candidates(count, size, nodes, collective, root, counts)
    if not calib.has_shm:  # shared memory not measured here (several nodes, or one rank)
        names = [n for n in names if n != "shm"]
    times = estimate(names, count, itemsize, size, calib=calib, shape=shape, nodes=nodes,
                     collective=collective, root=root, counts=counts)
    return prefer_native(times)


def choose_collective(collective: str, count: int, itemsize: int, size: int, calib=None,
                      shape=None, nodes=None, root: int = 0, counts=None) -> str:
    """The algorithm ``auto`` runs for a reduce-scatter, allgather, reduce or broadcast of
    ``count`` elements in all: ``BMLMPI_ALGORITHM`` where it names an algorithm of this
    collective; with a calibration, :func:`choose`'s priced choice; without one, native (the
    family's fixed rule: no schedule of these collectives was measured against native on an
    uncalibrated machine)."""
    env = env_algorithm()
    if env and env != records.AUTO and env in records.algorithms(collective):
        return env
    if calib is None:
        return records.NATIVE
    return choose(count, itemsize, size, calib, shape, nodes, collective=collective,
                  root=root, counts=counts)


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
