"""The numpy back end: the reference every other back end is tested against.

It handles every dtype, shape, memory layout and overlap numpy does, so the dispatcher falls
back to it whenever a faster back end cannot take a call. Arguments arrive validated (same
shape and dtype, writable ``dst``, a known op; see :mod:`bmlmpi.kernels.dispatch`).

Semantics, which the other back ends reproduce bit for bit (complex PROD up to rounding: numpy
uses fused multiply-adds for it where the CPU has them):

- integers wrap on overflow (numpy's modular arithmetic);
- MIN and MAX propagate NaN: if either operand is NaN the result is NaN (``np.minimum``);
  between +0.0 and -0.0 either may be returned;
- the fused form folds the sources into ``dst`` left to right, rounding after every step as
  repeated pairwise calls do, except for float16, which accumulates in float32 across the
  sources and rounds to float16 once (pairwise float16 calls compute in float32 too, as numpy
  does, so a single source gives the same bits either way);
- the wire ops ``sum_<format>`` of the registered wire formats (:mod:`.wire_formats`:
  ``sum_fp16``, ``sum_bf16``) take uint16 arrays of 16-bit codes (IEEE half, bfloat16):
  every operand is decoded to float32 with the format's ``decode``, all of a call's operands
  are added in float32 (``dst`` first, then the sources in order) and the float32 sum is
  rounded once to 16 bits with its ``encode``, to nearest even; NaN stays NaN (bfloat16 sets
  the quiet bit), an infinite or out-of-range sum becomes infinity;
- ``scale_avg`` floor-divides integers (rounds toward minus infinity, like Python's ``//``)
  and divides floats by ``n`` converted to the element type (float32 for float16); complex
  values have their real and imaginary parts divided separately.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import wire_formats

NAME = "numpy"

_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def reduce_into(dst: np.ndarray, src: np.ndarray, op: str) -> None:
    _UFUNC[op](dst, src, out=dst)


def reduce_many_into(dst: np.ndarray, srcs: Sequence[np.ndarray], op: str) -> None:
    f = _UFUNC[op]
    if dst.dtype == np.float16 and len(srcs) > 1:
        acc = dst.astype(np.float32)
        for s in srcs:
            f(acc, s, out=acc)
        np.copyto(dst, acc, casting="same_kind")
        return
    for s in srcs:
        f(dst, s, out=dst)


def wire_reduce_many_into(dst: np.ndarray, srcs: Sequence[np.ndarray], op: str) -> None:
    fmt = wire_formats.for_op(op)
    with np.errstate(over="ignore", invalid="ignore"):   # inf and NaN are results here
        acc = fmt.decode(dst)
        for s in srcs:
            acc += fmt.decode(s)
        dst[...] = fmt.encode(acc).reshape(dst.shape)


def scale_avg(dst: np.ndarray, n: int) -> None:
    kind = dst.dtype.kind
    if kind == "i":
        np.floor_divide(dst, np.int64(n), out=dst, casting="unsafe")
    elif kind == "u":
        np.floor_divide(dst, np.uint64(n), out=dst, casting="unsafe")
    elif dst.dtype == np.float16:
        np.divide(dst, np.float32(n), out=dst, casting="unsafe")
    elif kind == "c":
        # Part by part: numpy's complex division by n + 0j turns an infinite part's 0 * inf
        # into NaN in the other part.
        r = dst.real.dtype.type(n)
        np.divide(dst.real, r, out=dst.real)
        np.divide(dst.imag, r, out=dst.imag)
    else:
        np.divide(dst, dst.dtype.type(n), out=dst)
