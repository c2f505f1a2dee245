"""Which algorithm ``auto`` runs.

The rule: ``BMLMPI_ALGORITHM`` (when set and not ``auto``) wins; one rank or an empty buffer
has nothing to exchange (``bml``, which has no steps); otherwise the cost model
(:func:`bmlmpi.model.choose`) prices every candidate's schedule on one shared-memory node with
this machine's calibration (α, β, the Python executor's per-step and per-message overheads,
the reduction cost and measured native ``MPI_Allreduce`` timings — :mod:`bmlmpi.calibrate`,
measured once per host, MPI library and rank count, cached on disk) and takes the cheapest,
except that native stays unless a schedule is predicted ``NATIVE_MARGIN`` (10 %) faster.
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

import os

IMPLEMENTED = ("auto", "bml", "ring", "tree", "multitree", "hierarchical", "native")
SCHEDULED = ("bml", "ring", "tree", "multitree", "hierarchical")
DEFAULT_BML_BYTES = 64 * 1024
#: ``auto`` leaves native only for a schedule predicted at least this much faster (measured
#: on the development machine: the picks that a 10 % margin turns back to native were all
#: near-ties the sweep measured in native's favour).
NATIVE_MARGIN = 1.10
AUTO_TREE_MAX_RANKS = 16


def algorithms() -> list[str]:
    """The implemented algorithms, ``auto`` first and ``native`` last."""
    return list(IMPLEMENTED)


def check_algorithm(name: str) -> str:
    name = name.lower()
    if name not in IMPLEMENTED:
        raise ValueError(f"unknown algorithm {name!r}; implemented: {', '.join(IMPLEMENTED)}")
    return name


def env_algorithm() -> str | None:
    env = os.environ.get("BMLMPI_ALGORITHM", "").strip()
    return check_algorithm(env) if env else None


def tree_array_bound() -> int | None:
    env = os.environ.get("BMLMPI_TREE_ARRAY_BOUND", "").strip()
    if not env:
        return None
    bound = int(env)
    if bound < 0:
        raise ValueError(f"BMLMPI_TREE_ARRAY_BOUND must be >= 0, got {bound}")
    return bound


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


def choose(count: int, itemsize: int, size: int, calib=None, shape=None, nodes=None) -> str:
    """The algorithm ``auto`` uses for ``count`` elements of ``itemsize`` bytes on ``size``
    ranks (``nodes``: which ranks share a node, :class:`bmlmpi.topology.nodes.Nodes`)."""
    env = env_algorithm()
    if env and env != "auto":
        return env
    if size == 1 or count == 0:
        return "bml"
    if calib is None:
        threshold = int(os.environ.get("BMLMPI_AUTO_BML_BYTES", DEFAULT_BML_BYTES))
        return "bml" if count * itemsize >= threshold else "native"
    from .model import estimate

    names = candidates(count, size, nodes)
    builders = None
    if "hierarchical" in names:
        from .schedules.hierarchical import hierarchical_schedule
        builders = {"hierarchical": lambda r, n, c, i: hierarchical_schedule(r, n, c, nodes)}
    times = estimate(names, count, itemsize, size, calib=calib, shape=shape, builders=builders)
    return prefer_native(times)


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
    return os.environ.get("BMLMPI_CALIBRATE", "1").strip().lower() not in ("0", "no", "false")
