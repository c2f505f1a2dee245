"""Reduced-precision wire formats (G-LNP): float16 and bfloat16 codecs, and the scale that keeps
a reduction over them from overflowing. MPI-free.

Algorithm. A value travels as 16 bits: IEEE half (``fp16``: 5 exponent bits, 10 mantissa
bits, largest finite 65504) or bfloat16 (``bf16``: float32's 8 exponent bits, 7 mantissa bits;
the top half of a float32, rounded to nearest even). Receivers decode to the accumulation
dtype (float32, or float64 for float64 input) and add there, so a reduction step never sums in
16 bits; a partial sum is rounded to 16 bits only when it is sent on.

Overflow. A float32 sum of N values each at most M in magnitude stays below N·M; every partial
sum of a schedule is a sum of at most N inputs. Before encoding, every rank multiplies by the
same power of two s = 2^e, the largest with N·M·s ≤ B (B = 2^15 for fp16, 2^126 for bf16), where
M is the maximum |x| over all ranks (agreed by one small allreduce). Then no partial sum, and
no encoded value, can exceed B < the format's largest finite value: the 16-bit reduction
overflows only where the float32 one does (never, for finite input). Why not Horovod's plain
prescale by 1/N: it bounds the partial sums by M but leaves M itself unbounded (an fp16 value
above 65504 overflows before any sum). A power of two is exact in binary floating point, so
scaling adds no rounding of its own; the cost is one latency-bound allreduce of one float per
call. Values far below M·s lose precision (or underflow to zero) in fp16 — the rounded-away part
is what error feedback keeps.

Cost: one pass over the data per encode/decode (numpy); half the bytes of float32 on the wire.
Source: seed 004 (TDF's G-LNP: gradients pushed as Float16); Horovod ``Compression.fp16`` and
PyTorch DDP's fp16/bf16 compress hooks (prescaling against overflow).
"""

from __future__ import annotations

import math

import numpy as np

WIRES = ("fp16", "bf16")
#: bound on every encoded value and partial sum (a power of two below the format's maximum)
_BOUND = {"fp16": 2.0 ** 15, "bf16": 2.0 ** 126}


def check_wire(wire: str | None) -> str | None:
    if wire is not None and wire not in WIRES:
        raise ValueError(f"unknown wire format {wire!r}; wire formats: {', '.join(WIRES)} "
                         f"or None (the array's own dtype)")
    return wire


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float32 accumulation for float32 and narrower input; float64 stays float64."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def scale(wire: str, maxabs: float, size: int) -> float:
    """The power of two s with size·maxabs·s ≤ the wire's bound (1.0 for 0 or non-finite)."""
    if not math.isfinite(maxabs) or maxabs <= 0.0:
        return 1.0
    e = math.floor(math.log2(_BOUND[wire] / (size * maxabs)))
    # log2 may round up by one near a power of two: step down until the bound holds
    while size * maxabs * 2.0 ** e > _BOUND[wire]:
        e -= 1
    return 2.0 ** max(min(e, 1000), -1000)


def encode(wire: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float32/float64) as 16-bit codes (uint16), rounded to nearest even."""
    if wire == "fp16":
        return x.astype(np.float16).view(np.uint16)
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # round to nearest even on the 16 bits dropped; NaN stays NaN (quiet bit kept)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def decode(wire: str, codes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """16-bit codes back to ``dtype`` (exact: every 16-bit value is a float32)."""
    if wire == "fp16":
        return codes.view(np.float16).astype(dtype)
    return (codes.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(dtype)


def round_trip(wire: str, x: np.ndarray) -> np.ndarray:
    """What a receiver decodes of ``x``: ``x`` rounded to the wire format, in ``x``'s dtype."""
    return decode(wire, encode(wire, x), x.dtype)


__all__ = ["WIRES", "accumulation_dtype", "check_wire", "decode", "encode", "round_trip", "scale"]
