"""The cupy back end: element-wise CUDA kernels for device arrays.

One ``cupy.ElementwiseKernel`` per (op, number of sources, float16 or not), generated on first
use; cupy compiles it per dtype and caches the binary on disk (``~/.cupy/kernel_cache``). The
fused form reads every source once and writes ``dst`` once. float16 accumulates in float32
(across all sources of a fused call) and rounds once; every other dtype accumulates in its own
type, so results match :mod:`bmlmpi.kernels.numpy_backend`: integers wrap, MIN/MAX propagate
NaN from either operand (written out, because CUDA's ``fminf``/``fmaxf`` drop NaN).

Arrays from other libraries are synchronised on their declared stream when converted
(:func:`bmlmpi.kernels.gpu.as_cupy`); kernels run on cupy's current stream, and each call
synchronises that stream before returning, so the result is in device memory when MPI
(CUDA-aware or through staging) reads it. Importing this module imports cupy.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

from .gpu import as_cupy

NAME = "cupy"

# ``a`` is the accumulator, ``b`` the incoming value, both of the accumulation type.
_EXPR = {
    "sum": "a + b",
    "prod": "a * b",
    "min": "((a < b) || (a != a)) ? a : b",
    "max": "((b < a) || (a != a)) ? a : b",
}


@functools.cache
def _reduce_kernel(op: str, nsrc: int, half: bool) -> cupy.ElementwiseKernel:
    acc = "float" if half else "T"
    lines = [f"{acc} acc = ({acc})dst;"]
    for k in range(nsrc):
        lines.append(f"{{ {acc} a = acc; {acc} b = ({acc})s{k}; acc = {_EXPR[op]}; }}")
    lines.append("dst = (T)acc;")
    return cupy.ElementwiseKernel(
        ", ".join(f"T s{k}" for k in range(nsrc)), "T dst", "\n".join(lines),
        name=f"bmlmpi_{op}_{nsrc}{'_f16' if half else ''}", no_return=True)


@functools.cache
def _scale_kernel(kind: str) -> cupy.ElementwiseKernel:
    if kind == "i":
        # C division truncates toward zero; step down once for a negative inexact quotient.
        body = ("long long v = dst; long long q = v / n; "
                "if (v % n != 0 && v < 0) q -= 1; dst = (T)q;")
        return cupy.ElementwiseKernel("int64 n", "T dst", body, name="bmlmpi_floordiv",
                                      no_return=True)
    if kind == "u":
        return cupy.ElementwiseKernel("uint64 n", "T dst",
                                      "dst = (T)((unsigned long long)dst / n);",
                                      name="bmlmpi_udiv", no_return=True)
    if kind == "half":
        return cupy.ElementwiseKernel("float32 n", "float16 dst",
                                      "dst = (float16)((float)dst / n);",
                                      name="bmlmpi_div_f16", no_return=True)
    return cupy.ElementwiseKernel("R n", "T dst", "dst = dst / n;", name="bmlmpi_div",
                                  no_return=True)


def _disjoint(dst: cupy.ndarray, src: cupy.ndarray) -> cupy.ndarray:
    """``src``, or a copy of it if it partly overlaps ``dst`` (the kernel reads as it writes)."""
    if src.data.ptr == dst.data.ptr and src.strides == dst.strides:
        return src
    return src.copy() if cupy.may_share_memory(dst, src) else src


def reduce_many_into(dst: Any, srcs: Sequence[Any], op: str) -> None:
    d = as_cupy(dst)
    if not srcs or d.size == 0:
        return
    ss = [_disjoint(d, as_cupy(s)) for s in srcs]
    _reduce_kernel(op, len(ss), d.dtype == np.float16)(*ss, d)
    cupy.cuda.get_current_stream().synchronize()


def reduce_into(dst: Any, src: Any, op: str) -> None:
    reduce_many_into(dst, (src,), op)


def scale_avg(dst: Any, n: int) -> None:
    d = as_cupy(dst)
    if d.size == 0 or n == 1:
        return
    if d.dtype.kind == "i":
        _scale_kernel("i")(np.int64(n), d)
    elif d.dtype.kind == "u":
        _scale_kernel("u")(np.uint64(n), d)
    elif d.dtype == np.float16:
        _scale_kernel("half")(np.float32(n), d)
    elif d.dtype.kind == "c":
        _scale_kernel("f")(d.real.dtype.type(n), d)
    else:
        _scale_kernel("f")(d.dtype.type(n), d)
    cupy.cuda.get_current_stream().synchronize()


def warmup(dtypes: Sequence[np.dtype], ops: Sequence[str], sources: Sequence[int]) -> None:
    for dt in dtypes:
        dt = np.dtype(dt)
        for op in ops:
            if dt.kind == "c" and op in ("min", "max"):
                continue
            for k in sources:
                d = cupy.zeros(1, dt)
                reduce_many_into(d, [cupy.zeros(1, dt) for _ in range(k)], op)
