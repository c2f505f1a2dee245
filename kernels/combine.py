"""``out = a <op> b`` in one pass, and the executor's reductions without per-call checks.

:func:`combine_into` is the three-operand form of :func:`~bmlmpi.kernels.reduce_into`: it
reads ``a`` and ``b`` once and writes ``out`` once, where ``np.copyto(out, a)`` followed by
``reduce_into(out, b)`` reads ``a``, writes ``out``, then reads ``out`` and ``b`` and writes
``out`` again (for a 64 MiB allreduce at N = 2, 64 MiB of memory traffic per rank less). The
executor uses it where a reduction's range of the result still holds nothing but the input
(:mod:`bmlmpi.deferred`). Its bits are those of ``reduce_into`` on a copy of ``a``: the same
operand order (so MIN/MAX pick the same NaN and signed zero), float16 rounded from float32.

:func:`reduce_trusted` and :func:`combine_trusted` are what the dispatcher would run for host
arrays, without its checks (op, dtype, shapes, place, overlap): the executor calls them once
per reduction of every step on slices it cut itself (same dtype and length, one-dimensional,
contiguous, scratch never overlapping the result), which saves the dispatcher's microseconds
per call at small sizes. The back end is chosen by the dispatcher's rule (numba for float16,
for a fused call from ``NUMBA_FUSED_MIN_BYTES``, for the parallel form; numpy otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from . import dispatch, gpu, numpy_backend
from .limits import NUMBA_DTYPES, NUMBA_FUSED_MIN_BYTES, PARALLEL_MIN_BYTES

_HALF = np.dtype(np.float16)
_UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _numba_for(dtype: np.dtype, nbytes: int, nsrc: int) -> ModuleType | None:
    """The numba back end if the dispatcher's rule gives it this call, else None."""
    mode = dispatch.kernel_mode()
    if mode == "numpy" or dtype not in NUMBA_DTYPES:
        return None
    if mode == "auto" and dtype != _HALF and not (nsrc >= 2 and nbytes >= NUMBA_FUSED_MIN_BYTES):
        if nbytes < PARALLEL_MIN_BYTES:
            return None
        mod = dispatch.load_numba()
        if mod is None or not mod.uses_parallel(nbytes):
            return None
        return mod
    mod = dispatch.load_numba()
    if mod is None and mode == "numba":
        raise ImportError("BMLMPI_KERNEL=numba but numba cannot be imported")
    return mod


def reduce_trusted(dst: np.ndarray, srcs: Sequence[np.ndarray], op: str) -> None:
    """``dst = dst <op> srcs[0] <op> ...`` for the executor's own one-dimensional contiguous
    host slices of one dtype and length (unchecked; see the module docstring)."""
    if dispatch.is_wire_op(op):  # 16-bit codes in uint16 arrays: never an integer sum
        dispatch.reduce_many_into(dst, srcs, op)
        return
    mod = _numba_for(dst.dtype, dst.nbytes, len(srcs))
    if mod is not None:
        mod.reduce_many_into(dst, srcs, op)
    elif len(srcs) == 1 and op in _UFUNC:
        _UFUNC[op](dst, srcs[0], out=dst)
    else:
        numpy_backend.reduce_many_into(dst, srcs, op)


def combine_trusted(out: np.ndarray, a: np.ndarray, b: np.ndarray, op: str) -> None:
    """``out = a <op> b`` for the executor's own slices (unchecked; ``out`` overlaps neither)."""
    mod = None if dispatch.is_wire_op(op) else _numba_for(out.dtype, out.nbytes, 1)
    if mod is not None:
        mod.combine_into(out, a, b, op)
    elif op in _UFUNC:
        _UFUNC[op](a, b, out=out)
    else:  # an op this module does not know: the two-pass form, through the dispatcher
        np.copyto(out, a)
        dispatch.reduce_into(out, b, op)


def combine_into(out: Any, a: Any, b: Any, op: str) -> None:
    """``out = a <op> b`` element-wise in one pass; the same results as copying ``a`` into
    ``out`` and calling ``reduce_into(out, b, op)``, and the same checks and errors.

    ``out`` may be ``a`` or ``b`` itself; a partial overlap is refused (ValueError). Device
    arrays take the copy-and-reduce path of the cupy back end."""
    op = dispatch.kernel_op(op)
    host = isinstance(out, np.ndarray)
    if not host and not gpu.is_device_array(out):
        raise TypeError(f"out must be a numpy array or a device array, got {type(out).__name__}")
    if not host:
        gpu.as_cupy(out)[...] = gpu.as_cupy(a)
        dispatch.reduce_into(out, b, op)
        return
    if not out.flags.writeable:
        raise ValueError("out is read-only: the reduction writes its result into out")
    dispatch.check_op(op, out.dtype)
    a, b = dispatch.check_sources(out, (a, b), True)
    for s in (a, b):
        if s is not out and np.may_share_memory(out, s) and (
                out.__array_interface__["data"][0] != s.__array_interface__["data"][0]
                or out.strides != s.strides):
            raise ValueError("out partly overlaps a source; pass separate arrays")
    if out.size == 0:
        return
    views = dispatch.flat_views([out, a, b])
    mod = None if views is None else _numba_for(out.dtype, out.nbytes, 1)
    if mod is not None:
        mod.combine_into(views[0], views[1], views[2], op)
    else:
        _UFUNC[op](a, b, out=out)
