"""The trees every rank derives alike, kept. MPI-free.

Which schedule an algorithm name runs is :mod:`.algorithms`' (the records). This module keeps
what those builders and fault-tolerant recovery share: the trees generated from the
link-weight matrix ``links`` (a ``size × size`` array, or None for a flat network), once per
(size, root, matrix) — the multi-tree set costs seconds of CPU at 64 ranks, the single tree
milliseconds; every rank derives the same trees from the same matrix without talking. The
survivors' BML schedule on the old addresses is :func:`bmlmpi.ft.recovery.bcube_preserving`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

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
