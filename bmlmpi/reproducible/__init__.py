"""Reproducible reductions: sums whose bits depend on the multiset of addends alone.

:mod:`.format` is the wire format (the method, its parameters, accuracy and cost are stated
there): block exponents agreed by a MAX pre-exchange, addends truncated to integers at the
agreed cut, any integer-SUM schedule, one rounding. Everything here is MPI-free; the kernels
are in :mod:`bmlmpi.kernels.reproducible`.
"""

from __future__ import annotations

from . import format
from .format import Format, format_for

__all__ = ["Format", "format", "format_for"]
