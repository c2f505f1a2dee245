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

Cost: a few passes over the array per call (numpy); memory: one residual per registered array.
Source: "Timed Dataflow: Reducing Communication Overhead for Distributed Machine Learning"
(TDF, Sec. III-C); error feedback as in PyTorch's PowerSGD hook and GRACE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .wire import accumulation_dtype, check_wire, decode, encode, scale


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


@dataclass
class Step:
    """One call's outcome on one rank: y = sent + kept (float arrays of the accumulation dtype)."""

    t: int
    y: np.ndarray
    dropped: np.ndarray | None   # bool mask, None when nothing can be dropped
    scale: float = 1.0
    sent: np.ndarray | None = None
    codes: np.ndarray | None = None   # the scaled values as 16-bit wire codes (uint16)


@dataclass
class Compressor:
    """A compressor and its error-feedback memory (one residual per registered array key).

    ``phi``/``d``: G-SMP (off when ``phi`` is None); ``p``/``seed``: G-RP (off when ``p`` is
    None); ``wire``: "fp16", "bf16" or None (the array's dtype). ``record``: keep each call's
    y, sent and kept for tests (``history``).
    """

    name: str
    phi: float | None = None
    d: float = 0.0
    p: float | None = None
    seed: int = 0
    wire: str | None = None
    record: bool = False
    #: "auto" (sparse where the model prices it cheaper), "sparse" or "dense" (for measuring
    #: the crossover and for tests)
    path: str = "auto"
    residuals: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)
    iterations: dict[Any, int] = field(default_factory=dict, repr=False)
    history: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list,
                                                                          repr=False)
    #: bytes this rank sent and calls made, per path ("plain", "dense", "wire", "sparse")
    bytes_sent: dict[str, int] = field(default_factory=dict, repr=False)
    calls: dict[str, int] = field(default_factory=dict, repr=False)
    #: elements seen and dropped by the filters on this rank, over all calls
    elements: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        check_wire(self.wire)
        if self.path not in ("auto", "sparse", "dense"):
            raise ValueError(f"path must be 'auto', 'sparse' or 'dense', got {self.path!r}")
        if self.phi is not None and (not math.isfinite(self.phi) or self.phi < 0):
            raise ValueError(f"threshold phi must be a finite number >= 0, got {self.phi}")
        if not math.isfinite(self.d) or self.d < 0:
            raise ValueError(f"threshold decay d must be a finite number >= 0, got {self.d}")
        if self.p is not None and not 0.0 <= self.p <= 1.0:
            raise ValueError(f"random drop fraction p must be in [0, 1], got {self.p}")

    @property
    def filters(self) -> bool:
        """Whether any element can ever be dropped."""
        smp = self.phi is not None and self.phi > 0
        rp = self.p is not None and self.p > 0
        if self.phi is not None and self.p is not None:
            return smp and rp          # dropped only when selected by both
        return smp or rp

    @property
    def identity(self) -> bool:
        """Every filter off and the array's own dtype on the wire: the plain allreduce."""
        return not self.filters and self.wire is None

    def begin(self, key: Any, x: np.ndarray) -> Step:
        """Step 1-2 for this call on the array ``key``: y and the dropped mask."""
        acc = accumulation_dtype(x.dtype)
        t = self.iterations.get(key, 0) + 1
        self.iterations[key] = t
        y = np.array(x, dtype=acc, copy=True).reshape(-1)
        r = self.residuals.get(key)
        if r is not None:
            if r.shape != y.shape:
                raise ValueError(f"compressed array {key!r} changed size from {r.size} to "
                                 f"{y.size} elements")
            y += r
        dropped = None
        if self.filters:
            smp = (gsmp_selects(y, self.phi, self.d, t) if self.phi is not None else None)
            rp = (grp_selects(y.size, self.p, self.seed, t, key_of(key))
                  if self.p is not None else None)
            dropped = smp if rp is None else rp if smp is None else smp & rp
            self.dropped += int(dropped.sum())
        self.elements += y.size
        return Step(t, y, dropped)

    def local_maxabs(self, step: Step) -> float:
        """max |y_j| over the kept elements (what the wire scale is agreed from)."""
        kept = step.y if step.dropped is None else step.y[~step.dropped]
        return float(np.max(np.abs(kept))) if kept.size else 0.0

    def finish(self, key: Any, step: Step, maxabs: float, size: int,
               kept_at: np.ndarray | None = None) -> np.ndarray:
        """Steps 3-4 given the agreed max |y| over all ranks: the scaled values to send
        (``sent·s``, zeros where dropped; with a wire format also kept as 16-bit codes in
        ``step.codes``); the residual is updated. ``kept_at``: the kept indices, when only
        they travel (the sparse exchange): ``step.codes`` then holds their codes alone (the
        same codes, elementwise, without scaling and coding the dropped zeros)."""
        v = step.y.copy()
        if step.dropped is not None:
            v[step.dropped] = 0
        s = 1.0
        if self.wire is not None:
            s = scale(self.wire, maxabs, size)
            if kept_at is None:
                v *= v.dtype.type(s)
                step.codes = encode(self.wire, v)
                v = decode(self.wire, step.codes, v.dtype)
            else:
                step.codes = encode(self.wire, v[kept_at] * v.dtype.type(s))
                v[kept_at] = decode(self.wire, step.codes, v.dtype)
        sent = v / v.dtype.type(s) if s != 1.0 else v.copy()
        step.scale, step.sent = s, sent
        kept = step.y - sent
        self.residuals[key] = kept
        if self.record:
            self.history.append((key, step.y.copy(), sent.copy(), kept.copy()))
        return v

    def count(self, path: str, nbytes: int) -> None:
        self.bytes_sent[path] = self.bytes_sent.get(path, 0) + int(nbytes)
        self.calls[path] = self.calls.get(path, 0) + 1

    def regroup(self, old: list[tuple[int, ...]], new: list[tuple[int, ...]],
                sizes: list[int]) -> None:
        """Move residuals kept per group of registered arrays (keys: tuples of array indices)
        to a new grouping: a bucket plan that changed keeps every array's residual."""
        pieces: dict[int, np.ndarray] = {}
        ts: dict[int, int] = {}
        for key in old:
            r = self.residuals.pop(key, None)
            t = self.iterations.pop(key, 0)
            off = 0
            for i in key:
                if r is not None:
                    pieces[i] = r[off:off + sizes[i]]
                ts[i] = t
                off += sizes[i]
        for key in new:
            if all(i in pieces for i in key):
                self.residuals[key] = np.concatenate([pieces[i] for i in key])
            self.iterations[key] = max((ts.get(i, 0) for i in key), default=0)


def fp16() -> Compressor:
    """float16 on the wire, float32 accumulation, error feedback of the rounding."""
    return Compressor("fp16", wire="fp16")


def bf16() -> Compressor:
    """bfloat16 on the wire, float32 accumulation, error feedback of the rounding."""
    return Compressor("bf16", wire="bf16")


def threshold(phi: float, d: float = 0.0) -> Compressor:
    """G-SMP alone: drop |g_j| < φ/(1 + d·ln t); dropped values kept for the next call."""
    return Compressor(f"threshold({phi:g},{d:g})", phi=float(phi), d=float(d))


def random(p: float, seed: int = 0) -> Compressor:
    """G-RP alone: drop a random fraction ``p`` (same positions on every rank, see module)."""
    return Compressor(f"random({p:g},{seed})", p=float(p), seed=int(seed))


def tdf(phi: float, d: float, p: float, wire: str | None = "fp16", seed: int = 0) -> Compressor:
    """TDF's hybrid gradient filter: drop what G-SMP AND G-RP select, send the rest in ``wire``."""
    return Compressor(f"tdf({phi:g},{d:g},{p:g},{wire})", phi=float(phi), d=float(d),
                      p=float(p), seed=int(seed), wire=check_wire(wire))


def parse(spec: str | Compressor | None) -> Compressor | None:
    """A compressor from a spec string: ``none``, ``fp16``, ``bf16``, ``threshold:PHI[:D]``,
    ``random:P[:SEED]``, ``tdf:PHI:D:P[:WIRE]`` (WIRE ``fp16``, ``bf16`` or ``none``); any of
    them followed by ``@sparse``, ``@dense`` or ``@auto`` pins the exchange (the default,
    ``auto``, asks the cost model)."""
    if spec is None or isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"compression must be a string or a bmlmpi.compression.Compressor, got "
                        f"{type(spec).__name__}")
    if "@" in spec:
        # the exchange pinned: the cost model's choice overruled (a measurement, or its
        # α-β model, may misjudge a machine)
        base, path = spec.rsplit("@", 1)
        c = parse(base)
        if c is None or path not in ("auto", "sparse", "dense"):
            raise ValueError(f"bad compression spec {spec!r}: SPEC@PATH takes a compressor "
                             f"and a path auto, sparse or dense")
        c.path = path
        c.name = f"{c.name}@{path}"
        return c
    name, *args = spec.strip().split(":")
    try:
        if name == "none" and not args:
            return None
        if name in ("fp16", "bf16") and not args:
            return fp16() if name == "fp16" else bf16()
        if name == "threshold" and 1 <= len(args) <= 2:
            return threshold(*map(float, args))
        if name == "random" and 1 <= len(args) <= 2:
            return random(float(args[0]), *(int(a) for a in args[1:]))
        if name == "tdf" and 3 <= len(args) <= 4:
            wire = args[3] if len(args) == 4 else "fp16"
            return tdf(*map(float, args[:3]), wire=None if wire == "none" else wire)
    except ValueError as exc:
        raise ValueError(f"bad compression spec {spec!r}: {exc}") from None
    raise ValueError(f"bad compression spec {spec!r}; use none, fp16, bf16, threshold:PHI[:D], "
                     f"random:P[:SEED] or tdf:PHI:D:P[:WIRE], optionally followed by "
                     f"@sparse, @dense or @auto")


__all__ = ["Compressor", "Step", "bf16", "fp16", "grp_selects", "gsmp_selects",
           "gsmp_threshold", "parse", "random", "tdf", "threshold"]
