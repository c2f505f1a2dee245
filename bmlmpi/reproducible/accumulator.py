"""The exact local accumulator: a training loop adds micro-batch gradients into it, and its
contents, added into a reproducible collective, give the total the collective would give
over every addend, however the samples were split across ranks and micro-batches.

It holds, per real position, ``Format.bins`` W-bit bins (int32) at fixed boundaries: bin
``k`` sums the addends' slices ``bits [k*W, k*W + W)`` of ``|x|`` with ``x``'s sign, from
``k = floor((E - P) / W)`` for the block's largest exponent ``E`` so far up to the block's
top (:mod:`bmlmpi.reproducible.format` names ``P``, ``W`` and the blocks). Adding is exact and
order-independent (integer additions). When an addend raises a block's ``E``, the bins that
fall below the new lowest one are dropped: every cut a collective can agree on for that block
lies at or above it, so they can never count. Since slices telescope,
``sum_{k >= c/W} bin_k 2^(kW) = sum_x trunc_c(x)`` for any cut ``c`` on the W grid at or
above the lowest bin: exporting at the agreed cut (:meth:`Accumulator.export`) gives exactly
the words :func:`~bmlmpi.reproducible.format.encode` would give for every addend at that
cut, summed.

Capacity: ``2^23`` calls of :meth:`Accumulator.add` (a bin adds less than ``2^W`` per call
and is an int32); its contents count as that many addends against the format's ``2^H``.
Memory: ``bins * 4`` bytes per real position (float16, bfloat16, float32: 20; float64: 36),
plus a byte of special bits per position and a few bytes per block.

It starts at ``+0``, as a zeroed gradient buffer does: ``-0`` addends leave ``+0``, and its
contents never make a collective's result ``-0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import format as layout

#: calls of add() an accumulator takes (int32 bins, slices below 2^W = 2^8)
MAX_ADDS = 1 << 23


class Accumulator:
    """An exact sum of arrays of one shape and dtype (module docstring).

    ``Accumulator(shape, dtype)``; ``fmt="bfloat16"`` with ``dtype=np.uint16`` for bfloat16
    bit patterns. :meth:`add` an array, :meth:`value` for the sum the reproducible collective
    gives for these addends on one rank; for a collective, :meth:`block_exponents` joins the
    pre-exchange and :meth:`export` / :meth:`specials` give this rank's words and bytes.
    """

    def __init__(self, shape: Any, dtype: Any, *, fmt: str | None = None):
        self.shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list))
                                            else (shape,)))
        self.dtype = np.dtype(dtype)
        self.format = layout.format_for(self.dtype, fmt)
        self._fmt_name = fmt
        per = self.dtype.itemsize // self.format.storage.itemsize
        self.positions = int(np.prod(self.shape, dtype=np.int64)) * per
        nblocks = layout.blocks(self.positions, self.format)
        self._bins = np.zeros((self.format.bins, self.positions), np.int32)
        self._top = np.full(nblocks, layout.SENTINEL, np.int32)
        self._flags = np.zeros(nblocks, np.int16)
        self._spec = np.full(self.positions, layout.NOT_NEG_ZERO, np.uint8)
        self.adds = 0

    def add(self, array: Any, *, parallel: bool | None = None) -> None:
        """Add ``array`` (this accumulator's shape and dtype) exactly."""
        a = np.asarray(array)
        if a.shape != self.shape or a.dtype != self.dtype:
            raise ValueError(f"the accumulator holds {self.shape} {self.dtype}, got "
                             f"{a.shape} {a.dtype}")
        if self.adds >= MAX_ADDS:
            raise OverflowError(f"an accumulator takes {MAX_ADDS} additions")
        f = self.format
        new = layout.block_exponents(a, self._fmt_name, parallel=parallel)
        bits = np.ascontiguousarray(a).reshape(-1).view(f.storage).view(f.bits)
        from ..kernels import reproducible as rk
        rk.run("acc_add", self._bins.nbytes, bits, self._bins, self._top, self._flags,
               self._spec, new, f.block, f.nbits, f.mbits, f.bias, f.emask, f.P, f.W,
               parallel=parallel)
        self.adds += 1

    def block_exponents(self) -> np.ndarray:
        """This accumulator's part of the pre-exchange (as
        :func:`~bmlmpi.reproducible.format.block_exponents` of one array): MAX-reduce it with
        the other contributions' into the agreed array."""
        return np.stack([self._top, self._flags], axis=1).astype(np.int16)

    def export(self, agreed: np.ndarray, *, parallel: bool | None = None) -> np.ndarray:
        """The words at the agreed cuts: equal in value to encoding every addend at those cuts
        and summing (two-word formats: the same ``hi * 2^36 + lo``, with ``0 <= lo < 2^36``).
        ValueError if a block's agreed exponent is below this accumulator's."""
        f = self.format
        agreed = layout.check_agreed(agreed, f)
        if agreed.shape != (self._top.size, 2):
            raise ValueError(f"the agreed block exponents must be int16 of shape "
                             f"({self._top.size}, 2), got {agreed.shape}")
        out = np.empty((self.positions,) if f.words == 1 else (self.positions, 2), np.int64)
        bad = np.zeros(self._top.size, np.int64)
        from ..kernels import reproducible as rk
        rk.run("acc_export", out.nbytes, self._bins, self._top, agreed,
               out.reshape(-1), bad, f.block, f.P, f.W, f.words == 2,
               parallel=parallel)
        if bad.any():
            raise ValueError(f"{int(bad.sum())} blocks' agreed exponents lie below this "
                             f"accumulator's: the agreed array must include its "
                             f"block_exponents()")
        return out

    def specials(self) -> np.ndarray:
        """Per real position the special bits of the addends (:data:`format.NAN`, ...), with
        :data:`format.NOT_NEG_ZERO` set: a copy, to OR-reduce with the other ranks' bytes."""
        return self._spec.copy()

    def value(self) -> np.ndarray:
        """The sum of the addends so far, as the reproducible collective returns it for these
        addends on one rank: truncated at this accumulator's own cuts, rounded once."""
        agreed = self.block_exponents()
        words = self.export(agreed)
        out = layout.decode(words, agreed, self.dtype, self._spec, fmt=self._fmt_name)
        return out.reshape(self.shape)


__all__ = ["MAX_ADDS", "Accumulator"]
