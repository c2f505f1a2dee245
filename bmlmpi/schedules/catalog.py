"""The schedule catalog: which Schedule each algorithm name runs. MPI-free.

One place maps a name to its schedule function, for everything that needs a schedule by name:
the communicators (through :mod:`bmlmpi.registry`, which binds it to MPI communicators), the
cost model (:mod:`bmlmpi.model.estimate`), the calibration's measured runs
(:mod:`bmlmpi.calibrate`) and fault-tolerant recovery (:func:`bcube_preserving`).

:func:`schedule` ``(name, rank, size, count, itemsize, shape, links)``: bml on ``shape``
(resolved as a communicator resolves it: explicit, else ``BMLMPI_BCUBE``, else the prime
factorisation of ``size``; at N = 2 pipelined as ring is); ring with
:func:`~bmlmpi.schedules.ring.ring_segments` (at N = 2 with
:func:`~bmlmpi.schedules.ring.ring_pipeline` instead); the P2P
parameter server (``ps``, priced by the model, never run); trees generated from the link-weight
matrix ``links`` (a ``size × size`` array, or None for a flat network). Trees are generated once
per (size, matrix) and kept: the multi-tree set costs seconds of CPU at 64 ranks, the single
tree milliseconds. Every rank derives the same trees from the same matrix without talking.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..topology.bcube import Shape, resolve_shape
from .types import Schedule

Links = np.ndarray | None


def _key(size: int, links: Links) -> bytes | None:
    return None if links is None else np.asarray(links, dtype=np.float64).tobytes()


def _matrix(size: int, key: bytes | None) -> np.ndarray:
    from ..topology.links import flat_links
    return flat_links(size) if key is None else np.frombuffer(key).reshape(size, size)


@functools.lru_cache(maxsize=16)
def _binary_tree(size: int, key: bytes | None) -> Any:
    from ..topology.trees import binary_tree
    return binary_tree(_matrix(size, key), 0)


@functools.lru_cache(maxsize=16)
def _multi_trees(size: int, key: bytes | None) -> tuple[Any, ...]:
    from ..topology.trees import multi_trees
    return multi_trees(_matrix(size, key))


def binary_tree_for(size: int, links: Links = None) -> Any:
    """The single binary reduction tree rooted at rank 0 on ``links`` (flat when None)."""
    return _binary_tree(size, _key(size, links))


def multi_trees_for(size: int, links: Links = None) -> tuple[Any, ...]:
    """One tree per root, with the link-usage penalty, on ``links`` (flat when None)."""
    return _multi_trees(size, _key(size, links))


def _bml(rank: int, size: int, count: int, itemsize: int, shape: Any, links: Links) -> Schedule:
    from .bml import bml_schedule
    from .ring import ring_pipeline
    # at N = 2 BML is ring's exchange: pipelined as ring is there (bml.py's docstring)
    pipeline = ring_pipeline(count, itemsize, size) if size == 2 else 1
    return bml_schedule(rank, size, count, resolve_shape(size, shape), pipeline)


def _ring(rank: int, size: int, count: int, itemsize: int, shape: Any,
          links: Links) -> Schedule:
    from .ring import ring_pipeline, ring_schedule, ring_segments
    if size == 2:  # pipelined pieces (measured faster at N = 2; ring.py's docstring)
        return ring_schedule(rank, size, count, 1, ring_pipeline(count, itemsize, size))
    return ring_schedule(rank, size, count, ring_segments(count, itemsize, size))


def _ps(rank: int, size: int, count: int, itemsize: int, shape: Any, links: Links) -> Schedule:
    from .ps import ps_schedule
    return ps_schedule(rank, size, count)


def _tree(rank: int, size: int, count: int, itemsize: int, shape: Any,
          links: Links) -> Schedule:
    from .tree import tree_schedule
    return tree_schedule(rank, size, count, binary_tree_for(size, links))


def _multitree(rank: int, size: int, count: int, itemsize: int, shape: Any,
               links: Links) -> Schedule:
    from .tree import multitree_schedule
    return multitree_schedule(rank, size, count, multi_trees_for(size, links))


def _hierarchical(rank: int, size: int, count: int, itemsize: int, shape: Any, links: Links,
                  nodes: Any = None) -> Schedule:
    from ..topology.nodes import resolve_nodes
    from .hierarchical import hierarchical_schedule
    if nodes is None:  # ``links`` as a placement matrix; one node of all ranks without it
        nodes = resolve_nodes(size, None if links is None else
                              np.asarray(links, dtype=np.float64).reshape(size, size))
    return hierarchical_schedule(rank, size, count, nodes)


#: ``name -> (rank, size, count, itemsize, shape, links) -> Schedule``
BUILDERS: dict[str, Callable[..., Schedule]] = {
    "bml": _bml, "ring": _ring, "ps": _ps, "tree": _tree, "multitree": _multitree,
    "hierarchical": _hierarchical,
}

#: Schedules whose transfer levels name network tiers (for the cost model), not the BCube
#: levels of the communicator's shape: they run with every transfer on the flat communicator.
TIERED = frozenset({"hierarchical"})


def schedule(name: str, rank: int, size: int, count: int, itemsize: int,
             shape: str | Sequence[int] | None = None, links: Links = None, *,
             nodes: Any = None) -> Schedule:
    """Rank ``rank``'s schedule of algorithm ``name`` for ``count`` elements of ``itemsize``
    bytes on ``size`` ranks (``shape`` and ``links`` as the module docstring says; ``nodes``,
    a :class:`bmlmpi.topology.nodes.Nodes`, tells hierarchical which ranks share a node, else
    it reads them from ``links`` as a placement matrix)."""
    try:
        build = BUILDERS[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} has no schedule; known: "
                         f"{', '.join(sorted(BUILDERS))}") from None
    if name in TIERED:
        return build(rank, size, count, itemsize, shape, links, nodes)
    return build(rank, size, count, itemsize, shape, links)


def bcube_preserving(name: str, rank: int, home_shape: Shape, failed: Iterable[int],
                     count: int) -> Schedule | None:
    """The survivors' schedule that keeps the BCube addresses of ``home_shape`` (the BML slides):
    ``rank`` and the schedule's peers are original ranks. None when it does not apply — not
    bml, nobody failed, a cube over ``MAX_PLANNED_SERVERS``, or no such schedule found — and
    the survivors run the fresh :func:`schedule` over their new ranks instead."""
    from .recovery import MAX_PLANNED_SERVERS, RecoveryError, bcube_recovery_schedule

    dead = tuple(failed)
    if name != "bml" or not dead or math.prod(home_shape) > MAX_PLANNED_SERVERS:
        return None
    try:
        return bcube_recovery_schedule(rank, home_shape, dead, count)
    except RecoveryError:
        return None
