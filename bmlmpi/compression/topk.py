"""Top-k sparsification with error feedback (Deep Gradient Compression's gradient sparsification).
MPI-free: this module decides what a rank sends and keeps.

Algorithm, per compressed call on one registered array of n elements (the steps of
:class:`.protocol.Compressor`, step 2 being this class's):

1. y = g + r: the new gradient plus what this array kept at the previous call.
2. Keep the k elements of y with the largest magnitude on this rank (k = ``k``, or
   ⌈``ratio``·n⌉; at most n); drop the rest. Each rank picks its own k positions: the
   positions differ across ranks, so the sum travels as index/value pairs (the sparse
   exchange, at most N·k pairs after the union) or densely with zeros where dropped; the
   compressed allreduce prices both and takes the cheaper (``path="auto"``).
3. The kept values are sent (rounded to ``wire`` with the agreed scale, if one is given).
4. r ← y − sent: the dropped values (and the rounded-away parts) wait in the residual and are
   added at the next call, so every element is eventually sent: a gradient component that is
   never among the k largest still grows in r until it is.

Where k ≥ n nothing is dropped: with no wire format the call is the plain sum of the inputs
(the residual stays zero). Every rank must pass the same k or ratio, wire format and path:
the compressed allreduce's agreement refuses a mismatch on every rank.

Not included: DGC's momentum correction, local gradient clipping, momentum factor masking and
warm-up belong to the optimizer and the training loop, which see the residual through
``residuals``.

Selection cost: one ``np.argpartition`` (O(n)) per call, plus the shared steps' few passes.
Source: Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the Communication
Bandwidth for Distributed Training" (ICLR 2018), Sec. 3.1 (gradient sparsification with local
accumulation); error feedback as in Stich et al., "Sparsified SGD with Memory" (NeurIPS 2018).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .protocol import Compressor, register


@register
class TopK(Compressor):
    """Keep the ``k`` largest-magnitude elements of each call's y = g + r on this rank (or
    ⌈``ratio``·n⌉ of n; give one of the two), send them (in ``wire`` if given), and keep the
    rest as the residual for the next call (module docstring). ``path``, ``record``:
    :class:`.protocol.Compressor`.

    Spec (``bmlmpi.compression.parse``): ``topk:K[:WIRE]`` with an integer K ≥ 1, or
    ``topk:R[:WIRE]`` with a ratio 0 < R < 1 written with a decimal point (``topk:0.01``).
    """

    spec_names = ("topk",)
    spec_form = "topk:K[:WIRE] or topk:RATIO[:WIRE]"

    def __init__(self, k: int | None = None, ratio: float | None = None,
                 wire: str | None = None, path: str = "auto", record: bool = False):
        if (k is None) == (ratio is None):
            raise ValueError("top-k takes one of k (elements kept per call) or ratio")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
                raise ValueError(f"top-k's k must be an integer >= 1, got {k!r}")
            k = int(k)
            name = f"topk({k},{wire})"
        else:
            if not (isinstance(ratio, (int, float)) and math.isfinite(ratio)
                    and 0.0 < ratio <= 1.0):
                raise ValueError(f"top-k's ratio must lie in (0, 1], got {ratio!r}")
            ratio = float(ratio)
            name = f"topk({ratio:g},{wire})"
        super().__init__(name, wire, path, record)
        self.k, self.ratio = k, ratio

    @property
    def filters(self) -> bool:
        """Top-k drops every element beyond the k largest (only where k < n)."""
        return True

    def kept_count(self, n: int) -> int:
        """How many of ``n`` elements one call keeps."""
        if self.k is not None:
            return min(self.k, n)
        return min(n, math.ceil(self.ratio * n))

    def select(self, key: Any, y: np.ndarray, t: int) -> np.ndarray | None:
        """Step 2 of the module docstring: every element but the k largest in magnitude."""
        n = y.size
        k = self.kept_count(n)
        if k >= n:
            return None
        dropped = np.ones(n, bool)
        dropped[np.argpartition(np.abs(y), n - k)[n - k:]] = False
        return dropped

    def settings(self) -> tuple:
        return (self.k, self.ratio)

    @classmethod
    def from_spec(cls, name: str, args: list[str]) -> Compressor:
        if not 1 <= len(args) <= 2:
            raise ValueError(f"use {cls.spec_form}")
        wire = args[1] if len(args) == 2 and args[1] != "none" else None
        amount = args[0]
        if "." in amount or "e" in amount.lower():
            ratio = float(amount)
            if not 0.0 < ratio < 1.0:
                raise ValueError(f"a top-k ratio lies in (0, 1), got {amount}")
            return topk(ratio=ratio, wire=wire)
        return topk(int(amount), wire=wire)


def topk(k: int | None = None, *, ratio: float | None = None,
         wire: str | None = None) -> TopK:
    """Top-k sparsification with error feedback: keep ``k`` (or ⌈``ratio``·n⌉) elements of
    each call's gradient plus residual, the largest in magnitude."""
    return TopK(k, ratio, wire)


__all__ = ["TopK", "topk"]
