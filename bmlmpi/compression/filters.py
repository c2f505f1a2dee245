"""Gradient compressors with error feedback: TDF's hybrid gradient filter (G-SMP, G-RP) and the
16-bit wire formats (G-LNP). MPI-free: this module decides what a rank sends and keeps.

Algorithm (Timed Dataflow, "TDF's push operation", in this order):

1. y = g + r: the new gradient plus what this array kept at the previous iteration (Eq. 2).
2. G-SMP selects j with |y_j| < φ / (1 + d·ln t) (Eq. 1; t = 1, 2, … counts the calls on this
   array, so the threshold starts at φ and shrinks). G-RP selects each j with probability p.
   Element j is dropped when selected by **both** filters (each alone: by that one). A filter
   that is off selects everything, so ``threshold`` alone drops G-SMP's selection, ``random``
   alone G-RP's, and ``tdf`` their intersection.
3. The rest is rounded to the wire format (G-LNP, :mod:`.wire`) with a scale every rank agrees
   on; sent_j = the value the receivers decode (0 where dropped).
4. r ← y − sent: the dropped values and the rounded-away parts, added at the next call. y =
   sent + r holds exactly: the rounding error of a float32 rounded to 16 bits is itself a
   float32 (Sterbenz), and dropped elements keep y_j whole.

G-RP's seed is the same on every rank (mixed with t and the array's key, never the rank): all
ranks drop the same random positions, so the kept positions of the ranks overlap as much as
G-SMP lets them and the sparse allreduce's union (its fill-in) stays small; with per-rank seeds
the union of N random keeps of density 1−p is 1−p^N, which undoes the saving of an allreduce
(a parameter server, TDF's setting, sums sparse pushes and does not care). Error feedback
sends every dropped position later, so no position is starved.

Steps 1, 3 and 4 are every compressor's (:class:`.protocol.Compressor`); step 2 is
:class:`TDF`'s :meth:`~TDF.select`. :class:`ReducedPrecision` is step 3 alone (a wire format,
nothing dropped).

Cost: a few passes over the array per call (numpy); memory: one residual per registered array.
Source: "Timed Dataflow: Reducing Communication Overhead for Distributed Machine Learning"
(TDF, Sec. III-C); error feedback as in PyTorch's PowerSGD hook and GRACE.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .protocol import Compressor, register
from .wire import check_wire


def gsmp_threshold(phi: float, d: float, t: int) -> float:
    """G-SMP's threshold at iteration ``t`` ≥ 1: φ / (1 + d·ln t)."""
    return phi / (1.0 + d * math.log(t))


def gsmp_selects(y: np.ndarray, phi: float, d: float, t: int) -> np.ndarray:
    """G-SMP's selection: |y_j| < φ / (1 + d·ln t)."""
    return np.abs(y) < gsmp_threshold(phi, d, t)


def grp_selects(n: int, p: float, seed: int, t: int, key: int) -> np.ndarray:
    """G-RP's selection: each of ``n`` elements with probability ``p``, the same on every rank
    (the generator is seeded with (seed, t, key) only)."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, t, key & 0xFFFFFFFF])
    return rng.random(n) < p


def key_of(key: Any) -> int:
    """A stable 32-bit integer for an array's key, equal on every rank for the same array. A
    direct call's default key holds the result buffer's address, which differs between
    processes: only its length and dtype enter here, so every rank drops the same positions."""
    import hashlib
    if isinstance(key, tuple) and len(key) == 4 and key[0] == "buffer":
        key = ("buffer", key[2], key[3])
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=4).digest(), "little")


@register
class TDF(Compressor):
    """TDF's hybrid gradient filter (module docstring) with error feedback: drop what G-SMP
    AND G-RP select, each alone when the other is off, send the rest in ``wire``.

    ``phi``/``d``: G-SMP (off when ``phi`` is None); ``p``/``seed``: G-RP (off when ``p`` is
    None); ``wire``, ``path``, ``record``: :class:`.protocol.Compressor`. The ranks agree on
    whether anything can be dropped, not on the thresholds: a rank's filter decides what that
    rank sends (a per-rank ``seed`` only makes G-RP's positions overlap less).
    """

    spec_names = ("threshold", "random", "tdf")
    spec_form = "threshold:PHI[:D], random:P[:SEED], tdf:PHI:D:P[:WIRE]"

    def __init__(self, name: str, phi: float | None = None, d: float = 0.0,
                 p: float | None = None, seed: int = 0, wire: str | None = None,
                 path: str = "auto", record: bool = False):
        super().__init__(name, wire, path, record)
        if phi is not None and (not math.isfinite(phi) or phi < 0):
            raise ValueError(f"threshold phi must be a finite number >= 0, got {phi}")
        if not math.isfinite(d) or d < 0:
            raise ValueError(f"threshold decay d must be a finite number >= 0, got {d}")
        if p is not None and not 0.0 <= p <= 1.0:
            raise ValueError(f"random drop fraction p must be in [0, 1], got {p}")
        self.phi, self.d, self.p, self.seed = phi, d, p, seed

    @property
    def filters(self) -> bool:
        """Whether any element can ever be dropped."""
        smp = self.phi is not None and self.phi > 0
        rp = self.p is not None and self.p > 0
        if self.phi is not None and self.p is not None:
            return smp and rp          # dropped only when selected by both
        return smp or rp

    def select(self, key: Any, y: np.ndarray, t: int) -> np.ndarray | None:
        """Step 2 of the module docstring: what G-SMP and G-RP both select."""
        if not self.filters:
            return None
        smp = gsmp_selects(y, self.phi, self.d, t) if self.phi is not None else None
        rp = grp_selects(y.size, self.p, self.seed, t, key_of(key)) if self.p is not None else None
        return smp if rp is None else rp if smp is None else smp & rp

    @classmethod
    def from_spec(cls, name: str, args: list[str]) -> Compressor:
        if name == "threshold" and 1 <= len(args) <= 2:
            return threshold(*map(float, args))
        if name == "random" and 1 <= len(args) <= 2:
            return random(float(args[0]), *(int(a) for a in args[1:]))
        if name == "tdf" and 3 <= len(args) <= 4:
            wire = args[3] if len(args) == 4 else "fp16"
            return tdf(*map(float, args[:3]), wire=None if wire == "none" else wire)
        raise ValueError(f"use {cls.spec_form}")


@register
class ReducedPrecision(Compressor):
    """A 16-bit wire format alone (G-LNP), with error feedback of the rounding: nothing is
    dropped. ``wire``: a registered wire format (spec names ``fp16``, ``bf16``)."""

    spec_names = ("fp16", "bf16")
    spec_form = "fp16, bf16"

    def __init__(self, wire: str, path: str = "auto", record: bool = False):
        super().__init__(wire, check_wire(wire), path, record)

    @classmethod
    def from_spec(cls, name: str, args: list[str]) -> Compressor:
        if args:
            raise ValueError(f"{name} takes no arguments")
        return cls(name)


def fp16() -> ReducedPrecision:
    """float16 on the wire, float32 accumulation, error feedback of the rounding."""
    return ReducedPrecision("fp16")


def bf16() -> ReducedPrecision:
    """bfloat16 on the wire, float32 accumulation, error feedback of the rounding."""
    return ReducedPrecision("bf16")


def threshold(phi: float, d: float = 0.0) -> TDF:
    """G-SMP alone: drop |g_j| < φ/(1 + d·ln t); dropped values kept for the next call."""
    return TDF(f"threshold({phi:g},{d:g})", phi=float(phi), d=float(d))


def random(p: float, seed: int = 0) -> TDF:
    """G-RP alone: drop a random fraction ``p`` (same positions on every rank, see module)."""
    return TDF(f"random({p:g},{seed})", p=float(p), seed=int(seed))


def tdf(phi: float, d: float, p: float, wire: str | None = "fp16", seed: int = 0) -> TDF:
    """TDF's hybrid gradient filter: drop what G-SMP AND G-RP select, send the rest in ``wire``."""
    return TDF(f"tdf({phi:g},{d:g},{p:g},{wire})", phi=float(phi), d=float(d), p=float(p),
               seed=int(seed), wire=check_wire(wire))


__all__ = ["TDF", "ReducedPrecision", "bf16", "fp16", "grp_selects", "gsmp_selects",
           "gsmp_threshold", "key_of", "random", "tdf", "threshold"]
