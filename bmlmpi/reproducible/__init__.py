"""Reproducible reductions: sums whose bits depend on the multiset of addends alone.

:mod:`.format` is the wire format (the method, its parameters, accuracy and cost are stated
there): block exponents agreed by a MAX pre-exchange, addends truncated to integers at the
agreed cut, any integer-SUM schedule, one rounding. :mod:`.accumulator` is the exact local
accumulator (:class:`Accumulator`) whose contents join a collective as one more
contribution. Everything here is MPI-free; the kernels are in :mod:`bmlmpi.kernels.reproducible`.
"""

from __future__ import annotations

from . import format
from .accumulator import MAX_ADDS, Accumulator
from .format import Format, format_for

__all__ = ["MAX_ADDS", "Accumulator", "Format", "format", "format_for"]
