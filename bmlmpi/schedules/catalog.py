"""The trees every rank derives alike, kept, and the schedule survivors run. MPI-free.

Which schedule an algorithm name runs is :mod:`.algorithms`' (the records). This module keeps
what those builders and fault-tolerant recovery share: the trees generated from the
link-weight matrix ``links`` (a ``size × size`` array, or None for a flat network), once per
(size, root, matrix) — the multi-tree set costs seconds of CPU at 64 ranks, the single tree
milliseconds; every rank derives the same trees from the same matrix without talking — and
:func:`bcube_preserving`, the survivors' BML schedule on the old addresses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..topology.bcube import Shape
from .types import Schedule

Links = np.ndarray | None


def _key(size: int, links: Links) -> bytes | None:
    return None if links is None else np.asarray(links, dtype=np.float64).tobytes()


def _matrix(size: int, key: bytes | None) -> np.ndarray:
    from ..topology.links import flat_links
    return flat_links(size) if key is None else np.frombuffer(key).reshape(size, size)


@functools.lru_cache(maxsize=64)
def _binary_tree(size: int, key: bytes | None, root: int) -> Any:
    from ..topology.trees import binary_tree
    return binary_tree(_matrix(size, key), root)


@functools.lru_cache(maxsize=16)
def _multi_trees(size: int, key: bytes | None) -> tuple[Any, ...]:
    from ..topology.trees import multi_trees
    return multi_trees(_matrix(size, key))


def binary_tree_for(size: int, links: Links = None, root: int = 0) -> Any:
    """The single binary reduction tree rooted at ``root`` on ``links`` (flat when None)."""
    return _binary_tree(size, _key(size, links), root)


def multi_trees_for(size: int, links: Links = None) -> tuple[Any, ...]:
    """One tree per root, with the link-usage penalty, on ``links`` (flat when None)."""
    return _multi_trees(size, _key(size, links))


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
