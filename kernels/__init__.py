"""Reduction kernels, shipped as ``bmlmpi.kernels``.

``reduce_into(dst, src, op)`` folds ``src`` into ``dst`` in place; ``reduce_many_into(dst,
srcs, op)`` folds several sources in one pass over ``dst`` (a BML step or a tree node with two
children); ``scale_avg(dst, n)`` turns a sum of ``n`` contributions into their average;
``combine_into(out, a, b, op)`` writes ``a <op> b`` into ``out`` in one pass (:mod:`.combine`,
also the executor's unchecked per-step calls). ``op`` is one of ``"sum", "prod", "min",
"max"`` (an average is a sum followed by ``scale_avg``), or a wire op,
``"sum_<format>"`` of a registered wire format (:mod:`.wire_formats`; ``"sum_fp16"``,
``"sum_bf16"``): the sum of 16-bit codes held in uint16 arrays, added in float32 and rounded
once to 16 bits (the compressed allreduce's reduction, host arrays only). MPI's ops
``MPI.SUM``, ``MPI.PROD``, ``MPI.MIN``, ``MPI.MAX`` are taken for the four names; any other op
object raises TypeError.

Back ends, chosen per call by :mod:`.dispatch` (its docstring gives the rule): numpy, the
reference (:mod:`.numpy_backend`, which also states the exact semantics: wrapping integers,
NaN-propagating MIN/MAX, float16 accumulated in float32, floor division for integer
averages); numba on CPU (:mod:`.numba_backend`); cupy for device arrays (:mod:`.cupy_backend`).
Every back end gives the same bits as the reference, except complex PROD, which may differ by
rounding where a compiler fuses multiply-adds (numpy's own SIMD loops do, numba's do not, nvcc
does).

Importing this package is cheap: numba and cupy are imported, and kernels compiled, on first
use. :func:`warmup` compiles ahead of time, e.g. before a training loop's first step.
:mod:`.gpu` helps the executor move device buffers through MPI. :mod:`.reproducible` holds
the reproducible format's kernels (block exponents, encode, decode, the exact accumulator),
called by :mod:`bmlmpi.reproducible`, which states the method.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from . import wire_formats
from .combine import combine_into
from .dispatch import (
    NUMBA_FUSED_MIN_BYTES,
    OPS,
    PARALLEL_MIN_BYTES,
    check_op,
    cpu_backend,
    kernel_mode,
    load_numba,
    reduce_into,
    reduce_many_into,
    scale_avg,
    set_kernel_mode,
    wire_ops,
)

__all__ = ["DTYPES", "NUMBA_FUSED_MIN_BYTES", "OPS", "PARALLEL_MIN_BYTES", "combine_into",
           "cpu_backend", "reduce_into", "reduce_many_into", "scale_avg", "set_kernel_mode",
           "set_threads", "warmup", "wire_ops"]

#: Every dtype the kernels take (longdouble and clongdouble through numpy only).
DTYPES = tuple(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble,
    np.complex64, np.complex128, np.clongdouble))


def set_threads(n: int | None) -> None:
    """Threads per numba kernel call (``None``: the default, see :mod:`.numba_backend`).

    An executor running several ranks per node can pass ``cores // ranks_per_node``.
    """
    mod = load_numba()
    if mod is None:
        raise ImportError("numba is not available")
    mod.set_threads(n)


def warmup(dtypes: Iterable[Any] | None = None, ops: Iterable[str] | None = None, *,
           sources: Iterable[int] = (1, 2), gpu: bool = False) -> None:
    """Compile, or load from the disk cache, the kernels a job will use.

    ``dtypes`` defaults to every dtype with a numba kernel, ``ops`` to all four (a wire op
    listed here compiles its uint16 kernels, whatever ``dtypes``); ``sources``
    lists the source counts of fused calls (1 is the pairwise form). With ``gpu=True`` the
    cupy kernels are compiled too (needs cupy and a device). numba compiles once per dtype and
    source count whatever the op; the ops are checked against the dtypes all the same.
    """
    dts = [np.dtype(d) for d in (dtypes if dtypes is not None else DTYPES)]
    op_list = list(ops if ops is not None else OPS)
    wire = [wire_formats.for_op(op) for op in op_list]
    families = sorted({f.numba for f in wire if f is not None and f.numba is not None})
    op_list = [op for op, f in zip(op_list, wire, strict=True) if f is None]
    counts = sorted(set(int(k) for k in sources))
    if any(k < 1 for k in counts):
        raise ValueError(f"source counts must be at least 1, got {counts}")
    for dt in dts:
        for op in op_list:
            if not (dt.kind == "c" and op in ("min", "max")):
                check_op(op, dt)
    mod = load_numba()
    if mod is not None:
        mod.warmup(dts, counts)
        if families and kernel_mode() != "numpy":
            mod.warmup_wire(families, counts)
    if gpu:
        from . import cupy_backend
        cupy_backend.warmup(dts, op_list, counts)
