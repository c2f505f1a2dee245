"""Reproducible reductions: sums whose bits depend on the multiset of addends alone.

:mod:`.format` is the wire format (the method, its parameters, accuracy and cost are stated
there): block exponents agreed by a MAX pre-exchange, addends truncated to integers at the
agreed cut, any integer-SUM schedule, one rounding. :mod:`.accumulator` is the exact local
accumulator (:class:`Accumulator`) whose contents join a collective as one more
contribution. Everything here is MPI-free; the kernels are in :mod:`bmlmpi.kernels.reproducible`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from . import format
from .accumulator import MAX_ADDS, Accumulator
from .format import Format, format_for

__all__ = ["MAX_ADDS", "Accumulator", "Format", "format", "format_for", "warmup"]


def warmup(names: Iterable[str] | None = None) -> None:
    """Compile, or load from the disk cache, every reproducible kernel for these formats
    (default: all registered) in its one-thread and parallel forms, e.g. before a job's first
    reproducible call, outside any deadline."""
    for name in format.names() if names is None else names:
        f = format.get(name)
        fmt = name if name == "bfloat16" else None
        x = np.zeros(2 * f.block, f.storage)
        for parallel in (False, True):
            agreed = format.block_exponents(x, fmt, parallel=parallel)
            words = format.encode(x, agreed, fmt, parallel=parallel)
            special = format.specials(x, agreed, fmt, parallel=parallel)
            format.decode(words, agreed, f.storage, special, fmt=fmt, parallel=parallel)
            format.sum_contributions(np.stack([x, x]), agreed, fmt=fmt, parallel=parallel)
            acc = Accumulator(x.shape, f.storage, fmt=fmt)
            acc.add(x, parallel=parallel)
            acc.export(agreed, parallel=parallel)
