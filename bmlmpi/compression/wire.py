"""Reduced-precision wire formats (G-LNP): float16 and bfloat16 codecs, and the scale that keeps
a reduction over them from overflowing. MPI-free.

Algorithm. A value travels as 16 bits: IEEE half (``fp16``: 5 exponent bits, 10 mantissa
bits, largest finite 65504) or bfloat16 (``bf16``: float32's 8 exponent bits, 7 mantissa bits;
the top half of a float32, rounded to nearest even). The compressed allreduce
(:mod:`.layer`) encodes each rank's scaled, already wire-rounded values once into uint16
codes and runs the algorithm's schedule on the codes through bmlmpi's executor
(:class:`bmlmpi.execute.Run`, transfers as MPI.BYTE) with the kernel op ``sum_fp16`` or
``sum_bf16`` (:mod:`bmlmpi.kernels`). What is accumulated where:

* a reduction step decodes its operands (the partial sum this rank holds and every partial
  sum received in that step) to float32, adds them **in float32**, and rounds the float32
  sum **once** to 16 bits (nearest even), which it stores in place of its partial sum;
* so every partial sum a schedule stores or sends is a 16-bit value, rounded once per
  reduction step it went through; a copy step (allgather) moves codes unchanged, so every
  rank ends with the same codes, and the result is those codes decoded and divided by the
  scale, the same bits on every rank.
For two operands the float32 sum rounded to 16 bits is the correctly rounded 16-bit sum
(24 ≥ 2·11 + 2 significand bits: the double rounding is innocuous); a step adding three or
more operands rounds their float32 sum once.

Overflow. Before encoding, every rank multiplies by the same power of two s = 2^e, the largest
with N·M·s ≤ B (B = 2^15 for fp16, 2^126 for bf16), where M is the maximum |y| over all ranks'
kept values (agreed by one small allreduce). Every stored partial sum covers a set S of at
most N ranks' inputs, each at most M·s in magnitude; it went through at most |S| ≤ N
roundings (the input's encoding and one per reduction step, each step adding at least one new
input), each of which grows a magnitude by at most a factor (1 + u)(1 + 2^-24) (u = 2^-11
fp16, 2^-8 bf16; 2^-24 for the float32 sum). So every stored value is at most
N·M·s·g^N ≤ B·g^N with g = (1 + u)(1 + 2^-24): below the largest finite value (65504,
about 2^128) for N ≤ 1418 (fp16) and N ≤ 354 (bf16); for larger N, :func:`scale` lowers B
by powers of two until B·g^N is below it (refused past about 22,000 ranks, where B < 1).
So the 16-bit reduction overflows only where the float32 one does (never, for finite
input). Why not Horovod's plain prescale by 1/N: it bounds the partial sums by M but leaves M
itself unbounded (an fp16 value above 65504 overflows before any sum). A power of two is exact
in binary floating point, so scaling adds no rounding of its own; the cost is one
latency-bound allreduce of one float per call. Values far below M·s lose precision (or
underflow to zero) in fp16: the input's rounded-away part is what error feedback keeps (the
roundings of partial sums inside the reduction are not fed back: they belong to no rank).

Cost: one pass over the data per encode/decode (numpy); half the bytes of float32 on the wire.
Source: Timed Dataflow (TDF's G-LNP: gradients pushed as Float16); Horovod ``Compression.fp16`` and
PyTorch DDP's fp16/bf16 compress hooks (prescaling against overflow).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import wire_formats


def check_wire(wire: str | None) -> str | None:
    """``wire`` when it names a registered wire format (or is None); ValueError otherwise."""
    if wire is not None:
        wire_formats.get(wire)
    return wire


def sum_op(wire: str) -> str:
    """The kernel op that sums ``wire``'s codes."""
    return wire_formats.get(wire).op


def unit(wire: str) -> float:
    """``wire``'s unit roundoff."""
    return wire_formats.get(wire).unit


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float32 accumulation for float32 and narrower input; float64 stays float64."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def bound(wire: str, size: int) -> float:
    """B for ``size`` ranks: the power of two that N·M·s stays below (module docstring): 2^15
    (fp16) or 2^126 (bf16), halved while B·g^N exceeds the format's largest finite value.
    Below B = 1 (past about 22,000 ranks) the proof gives nothing useful: ValueError."""
    fmt = wire_formats.get(wire)
    growth = size * (math.log1p(fmt.unit) + math.log1p(2.0 ** -24)) / math.log(2)
    e = int(math.log2(fmt.bound))
    while e + growth > math.log2(fmt.largest):
        e -= 1
    if e < 0:
        raise ValueError(f"the {wire} wire's overflow bound does not cover {size} ranks")
    return 2.0 ** e


def scale(wire: str, maxabs: float, size: int) -> float:
    """The power of two s with size·maxabs·s ≤ :func:`bound` (1.0 for 0 or non-finite)."""
    if not math.isfinite(maxabs) or maxabs <= 0.0:
        return 1.0
    b = bound(wire, size)
    e = math.floor(math.log2(b / (size * maxabs)))
    # log2 may round up by one near a power of two: step down until the bound holds
    while size * maxabs * 2.0 ** e > b:
        e -= 1
    return 2.0 ** max(min(e, 1000), -1000)


def encode(wire: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float32/float64) as 16-bit codes (uint16), rounded to nearest even (bf16: from
    float64 through float32); NaN stays NaN."""
    return wire_formats.get(wire).encode(x)


def decode(wire: str, codes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """16-bit codes back to ``dtype`` (exact: every 16-bit value is a float32)."""
    return wire_formats.get(wire).decode(codes).astype(dtype, copy=False)


def round_trip(wire: str, x: np.ndarray) -> np.ndarray:
    """What a receiver decodes of ``x``: ``x`` rounded to the wire format, in ``x``'s dtype."""
    return decode(wire, encode(wire, x), x.dtype)


__all__ = ["accumulation_dtype", "bound", "check_wire", "decode", "encode", "round_trip",
           "scale", "sum_op", "unit"]
