"""The cupy back end: element-wise CUDA kernels for device arrays.

One ``cupy.ElementwiseKernel`` per (op, number of sources, float16 or not), generated on first
use; cupy compiles it per dtype and caches the binary on disk (``~/.cupy/kernel_cache``). The
fused form reads every source once and writes ``dst`` once. Contiguous arrays that start on a
16-byte boundary (every fresh cupy allocation) go through the vector form: each thread moves 16
bytes of every array per load (8 float16, 4 float32, ...), the rest through the element form.
Measured on an H100 (``perf/kernels/README.md``), one element per thread kept too few bytes in
flight: float16 SUM reached 42 % of the device's copy bandwidth, float32 77-83 %.

float16 accumulates in float32 (across all sources of a fused call) and rounds once; every
other dtype accumulates in its own type, so results match :mod:`bmlmpi.kernels.numpy_backend`:
integers wrap, MIN/MAX propagate NaN from either operand (written out, because CUDA's
``fminf``/``fmaxf`` drop NaN).

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
    lines = [f"{acc} acc = ({acc})dst;", *_accumulate(acc, nsrc, op, lambda k: f"s{k}"),
             "dst = (T)acc;"]
    return cupy.ElementwiseKernel(
        ", ".join(f"T s{k}" for k in range(nsrc)), "T dst", "\n".join(lines),
        name=f"bmlmpi_{op}_{nsrc}{'_f16' if half else ''}", no_return=True)


_VEC_BYTES = 16
_VEC_PREAMBLE = "struct __align__(16) bmlmpi_vec16 { unsigned int w[4]; };"


def _accumulate(acc: str, nsrc: int, op: str, element) -> list[str]:
    """Lines folding source ``k``'s value ``element(k)`` into ``acc`` (declared by the caller)."""
    return [f"{{ {acc} a = acc; {acc} b = ({acc}){element(k)}; acc = {_EXPR[op]}; }}"
            for k in range(nsrc)]


@functools.cache
def _vector_kernel(op: str, nsrc: int, half: bool) -> cupy.ElementwiseKernel:
    """Thread ``i`` reduces the ``i``-th 16-byte vector of every array, and, when ``i <
    tail``, element ``nvec * NV + i`` of the tail that does not fill a vector."""
    acc = "float" if half else "T"
    lines = [f"const int NV = {_VEC_BYTES} / sizeof(T);",
             "if (i < nvec) {",
             "  bmlmpi_vec16* dp = reinterpret_cast<bmlmpi_vec16*>(&dst[0]) + i;",
             "  T d[NV]; bmlmpi_vec16 v = *dp; memcpy(d, &v, sizeof v);"]
    for k in range(nsrc):
        lines.append(f"  T x{k}[NV]; v = reinterpret_cast<const bmlmpi_vec16*>(&s{k}[0])[i]; "
                     f"memcpy(x{k}, &v, sizeof v);")
    lines += ["  for (int j = 0; j < NV; ++j) {",
              f"    {acc} acc = ({acc})d[j];",
              *("    " + ln for ln in _accumulate(acc, nsrc, op, lambda k: f"x{k}[j]")),
              "    d[j] = (T)acc;",
              "  }",
              "  memcpy(&v, d, sizeof v); *dp = v;",
              "}",
              "if (i < tail) {",
              "  ptrdiff_t e = nvec * NV + i;",
              f"  {acc} acc = ({acc})dst[e];",
              *("  " + ln for ln in _accumulate(acc, nsrc, op, lambda k: f"s{k}[e]")),
              "  dst[e] = (T)acc;",
              "}"]
    params = ", ".join(f"raw T s{k}" for k in range(nsrc)) + ", int64 nvec, int64 tail"
    return cupy.ElementwiseKernel(
        params, "raw T dst", "\n".join(lines), preamble=_VEC_PREAMBLE,
        name=f"bmlmpi_vec_{op}_{nsrc}{'_f16' if half else ''}", no_return=True)


def _vectorisable(arrays: Sequence[cupy.ndarray]) -> bool:
    return all(a.flags.c_contiguous and a.data.ptr % _VEC_BYTES == 0 for a in arrays)


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
    # Floating and complex dtypes, by name: cupy infers no type placeholder from a scalar
    # alone, so each dtype has its own signature. The divisor has the real type; thrust's
    # complex / real divides each component, as the numpy reference does.
    real = {"complex64": "float32", "complex128": "float64"}.get(kind, kind)
    return cupy.ElementwiseKernel(f"{real} n", f"{kind} dst", "dst = dst / n;",
                                  name=f"bmlmpi_div_{kind}", no_return=True)


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
    half = d.dtype == np.float16
    if d.itemsize <= _VEC_BYTES and _vectorisable([d, *ss]):
        nvec, tail = divmod(d.size, _VEC_BYTES // d.itemsize)
        _vector_kernel(op, len(ss), half)(*(s.ravel() for s in ss), np.int64(nvec),
                                          np.int64(tail), d.ravel(), size=max(nvec, tail))
    else:
        _reduce_kernel(op, len(ss), half)(*ss, d)
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
    else:
        _scale_kernel(d.dtype.name)(d.real.dtype.type(n), d)
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
