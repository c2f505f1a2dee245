"""Argument checks and the choice of back end for every kernel call.

Where a call goes:

- device arrays (``__cuda_array_interface__``, or DLPack on a CUDA device) go to the cupy back
  end; a mix of host and device arrays is refused;
- numpy arrays go to numba or numpy. ``BMLMPI_KERNEL=numpy`` or ``numba`` forces one (numba
  still hands numpy the calls it cannot take, below); the default, ``auto``, uses numba where
  it was measured faster, for one of three reasons (``python -m bmlmpi.kernels.bench``,
  results and the measurements behind this rule in ``perf/kernels/``):

  * float16, at any size: numpy's float16 loops convert element by element (about 1 GB/s);
    numba converts with vector instructions, 25-200 times faster;
  * a fused call (two or more sources) on at least :data:`NUMBA_FUSED_MIN_BYTES` (1 MiB):
    numba reads ``dst`` and writes it once, numpy once per source, which saves memory
    traffic once the arrays leave the core's caches (in cache the two are even);
  * at least :data:`PARALLEL_MIN_BYTES` (1 MiB) when numba runs several threads here: about
    twice numpy's single thread while the data is in cache, equal at DRAM speed.

  Otherwise numpy: a single-threaded pairwise call is as fast in numpy (its SIMD loops match
  numba's, and its fixed cost is lower), and below 1 MiB a second thread does not pay.
- numba cannot take longdouble, clongdouble, a non-native byte order, arrays that are not all
  contiguous in the same order, or a source that partly overlaps ``dst``: those go to numpy.
- ``scale_avg``: numba for float16, and for float32/64 under the thread rule; numpy otherwise
  (its integer floor division by a scalar is already fast).

- the wire ops ``sum_<format>`` of the registered wire formats (:func:`wire_ops`,
  :mod:`.wire_formats`: sums of 16-bit codes held in uint16 arrays, float32 accumulation, one
  rounding per call; semantics in :mod:`.numpy_backend`) run on host arrays only, in numba
  under ``auto`` at any size where the format names numba kernels (numpy needs a pass per
  conversion, like its float16 loops), in numpy under ``numpy``, for a partly overlapping
  source, or for a format without numba kernels.

If numba cannot be imported, ``auto`` quietly uses numpy; ``BMLMPI_KERNEL=numba`` raises.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from .. import config
from . import gpu, numpy_backend, wire_formats
from .limits import NUMBA_DTYPES, NUMBA_FUSED_MIN_BYTES, PARALLEL_MIN_BYTES

OPS = ("sum", "prod", "min", "max")
_CODES = wire_formats.CODES

MODES = config.KERNEL_MODES
_HALF = np.dtype(np.float16)
_KINDS = "iufc"
_mode: str | None = None
_numba: ModuleType | None = None
_numba_error: BaseException | None = None


def load_numba() -> ModuleType | None:
    """The numba back end module, imported on first use; None if numba is unavailable."""
    global _numba, _numba_error
    if _numba is None and _numba_error is None:
        try:
            from . import numba_backend as mod
        except ImportError as exc:
            _numba_error = exc
        else:
            _numba = mod
    return _numba


def _parse_mode(text: str) -> str:
    mode = text.strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"BMLMPI_KERNEL must be auto, numpy or numba, got {text!r}")
    return mode


def kernel_mode() -> str:
    """The CPU back end choice: ``BMLMPI_KERNEL`` read on first use, or :func:`set_kernel_mode`."""
    global _mode
    if _mode is None:
        _mode = config.get("BMLMPI_KERNEL")
    return _mode


def set_kernel_mode(mode: str | None) -> None:
    """Force ``"auto"``, ``"numpy"`` or ``"numba"``; None reads ``BMLMPI_KERNEL`` again."""
    global _mode
    _mode = None if mode is None else _parse_mode(mode)


# -- checks ------------------------------------------------------------------------------------

def wire_ops() -> tuple[str, ...]:
    """The ops that sum 16-bit wire codes (uint16 arrays), one per registered wire format:
    the compressed allreduce's reductions."""
    return wire_formats.ops()


def is_wire_op(op: str) -> bool:
    return wire_formats.for_op(op) is not None


def kernel_op(op: Any) -> str:
    """``op`` as the kernels name it: a name passes through (:func:`check_op` checks it);
    ``MPI.SUM``, ``MPI.PROD``, ``MPI.MIN``, ``MPI.MAX`` become ``"sum"`` ... ``"max"``;
    anything else raises TypeError naming what the kernels take."""
    if isinstance(op, str):
        return op
    # An MPI.Op can only exist once mpi4py.MPI is loaded; importing it here would initialise
    # MPI for every kernel user, so it is looked up, never imported.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(op, mpi.Op):
        for name in OPS:
            if op == getattr(mpi, name.upper()):
                return name
    raise TypeError(f"the kernels reduce with one of {', '.join(map(repr, OPS))} or MPI.SUM, "
                    f"MPI.PROD, MPI.MIN, MPI.MAX (an average: 'sum', then scale_avg), or a "
                    f"wire op ({', '.join(wire_ops())}); got {op!r}")


def check_op(op: str, dtype: np.dtype) -> None:
    if is_wire_op(op):
        if dtype != _CODES:
            raise TypeError(f"{op} reduces 16-bit codes held in uint16 arrays, not {dtype}")
        return
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; expected one of "
                         f"{', '.join(OPS + wire_ops())}")
    if dtype.kind not in _KINDS:
        raise TypeError(f"cannot reduce dtype {dtype}: kernels take integer, floating and "
                        f"complex dtypes")
    if dtype.kind == "c" and op in ("min", "max"):
        raise TypeError(f"{op.upper()} is not defined for complex dtype {dtype} (MPI defines "
                        f"MIN/MAX only for integer and real floating types)")


def check_sources(dst: Any, srcs: Sequence[Any], host: bool) -> tuple[Any, ...]:
    """The sources, as cupy views when ``dst`` is on the device, after shape/dtype checks."""
    out = []
    for s in srcs:
        if host and not isinstance(s, np.ndarray) or not host and not gpu.is_device_array(s):
            where = "host" if host else "device"
            raise TypeError(f"dst is a {where} array but a source is {type(s).__name__}: "
                            f"all arrays of one call must be on the {where}")
        if not host:
            s = gpu.as_cupy(s)
        if tuple(s.shape) != tuple(dst.shape):
            raise ValueError(f"source shape {tuple(s.shape)} differs from dst shape "
                             f"{tuple(dst.shape)}")
        if s.dtype != dst.dtype:
            raise TypeError(f"source dtype {s.dtype} differs from dst dtype {dst.dtype}")
        out.append(s)
    return tuple(out)


def _place(dst: Any) -> bool:
    """True for a host (numpy) array, False for a device array; TypeError otherwise."""
    if isinstance(dst, np.ndarray):
        if not dst.flags.writeable:
            raise ValueError("dst is read-only: the reduction writes its result into dst")
        return True
    if gpu.is_device_array(dst):
        return False
    raise TypeError(f"dst must be a numpy array or a device array, got {type(dst).__name__}")


# -- choice ------------------------------------------------------------------------------------

def flat_views(arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """One-dimensional views in a common element order, or None if there is none."""
    if all(a.flags.c_contiguous for a in arrays):
        return [a if a.ndim == 1 else a.reshape(-1) for a in arrays]
    if all(a.flags.f_contiguous for a in arrays):
        return [a.reshape(-1, order="F") for a in arrays]
    return None


def _partial_overlap(dst: np.ndarray, src: np.ndarray) -> bool:
    # Reading and writing the same element is fine for an element-wise loop; a shifted
    # overlap is not (numpy buffers it, the numba loop would read values it already wrote).
    if src is dst or not np.may_share_memory(dst, src):
        return False
    return (dst.__array_interface__["data"][0] != src.__array_interface__["data"][0]
            or dst.strides != src.strides)


def _numba_pays(dst: np.ndarray, nsrc: int) -> bool:
    """The ``auto`` rule (module docstring); may import numba, to learn its thread count."""
    if dst.dtype == _HALF:
        return True
    if nsrc >= 2 and dst.nbytes >= NUMBA_FUSED_MIN_BYTES:
        return True
    if dst.nbytes < PARALLEL_MIN_BYTES:
        return False
    mod = load_numba()
    return mod is not None and mod.uses_parallel(dst.nbytes)


def _numba_views(dst: np.ndarray, srcs: Sequence[np.ndarray],
                 nsrc: int | None = None) -> list[np.ndarray] | None:
    """Flat views for the numba back end if it should take this call, else None."""
    mode = kernel_mode()
    if mode == "numpy" or dst.dtype not in NUMBA_DTYPES:  # also refuses non-native order
        return None
    if mode == "auto" and not _numba_pays(dst, len(srcs) if nsrc is None else nsrc):
        return None
    if load_numba() is None:
        if mode == "numba":
            raise ImportError("BMLMPI_KERNEL=numba but numba cannot be imported") \
                from _numba_error
        return None
    if any(_partial_overlap(dst, s) for s in srcs):
        return None
    return flat_views([dst, *srcs])


def cpu_backend(dst: np.ndarray, srcs: Sequence[np.ndarray]) -> str:
    """The name of the back end :func:`reduce_many_into` would use for these host arrays."""
    return "numba" if _numba_views(dst, srcs) is not None else "numpy"


# -- entry points ------------------------------------------------------------------------------

def reduce_many_into(dst: Any, srcs: Sequence[Any], op: str) -> None:
    """``dst = dst <op> srcs[0] <op> srcs[1] ...`` element-wise, in one pass over ``dst``.

    Every source must have the shape and dtype of ``dst`` and live in the same place (all
    numpy, or all device arrays); ``op`` is a name or one of MPI's four ops
    (:func:`kernel_op`). Raises ValueError for an unknown op, a read-only ``dst`` or
    a shape that differs, TypeError for a dtype that differs, a non-numeric dtype, MIN/MAX on
    a complex dtype, or host and device arrays mixed.
    """
    op = kernel_op(op)
    host = _place(dst)
    if not host:
        dst = gpu.as_cupy(dst)
    check_op(op, dst.dtype)
    srcs = check_sources(dst, srcs, host)
    if is_wire_op(op):
        _wire_reduce(dst, srcs, op, host)
        return
    if not host:
        from . import cupy_backend
        cupy_backend.reduce_many_into(dst, srcs, op)
        return
    if not srcs or dst.size == 0:
        return
    views = _numba_views(dst, srcs)
    if views is None:
        numpy_backend.reduce_many_into(dst, srcs, op)
    else:
        load_numba().reduce_many_into(views[0], views[1:], op)


def _wire_reduce(dst: Any, srcs: Sequence[Any], op: str, host: bool) -> None:
    if not host:
        raise TypeError(f"{op} reduces host (numpy) arrays only")
    if not srcs or dst.size == 0:
        return
    mode = kernel_mode()
    family = wire_formats.for_op(op).numba
    views = None
    if family is not None and mode != "numpy" and load_numba() is not None:
        if not any(_partial_overlap(dst, s) for s in srcs):
            views = flat_views([dst, *srcs])
    elif family is not None and mode == "numba":
        raise ImportError("BMLMPI_KERNEL=numba but numba cannot be imported") from _numba_error
    if views is None:
        numpy_backend.wire_reduce_many_into(dst, srcs, op)
    else:
        load_numba().wire_reduce_many_into(views[0], views[1:], family)


def reduce_into(dst: Any, src: Any, op: str) -> None:
    """``dst = dst <op> src`` element-wise, in place; the checks of :func:`reduce_many_into`."""
    reduce_many_into(dst, (src,), op)


def scale_avg(dst: Any, n: int) -> None:
    """Turn a sum of ``n`` contributions into their average, in place.

    Integers use floor division (rounding toward minus infinity, like Python's ``//``: the
    average of -3 and 0 is -2); floats divide by ``n``.
    """
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be an integer count of contributions, got {n!r}") from None
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    host = _place(dst)
    if not host:
        dst = gpu.as_cupy(dst)
    dtype = dst.dtype
    if dtype.kind not in _KINDS:
        raise TypeError(f"cannot average dtype {dtype}")
    if not host:
        from . import cupy_backend
        cupy_backend.scale_avg(dst, n)
        return
    if dst.size == 0 or n == 1:
        return
    views = _numba_views(dst, (), nsrc=1) if dtype.kind == "f" else None
    if views is None:
        numpy_backend.scale_avg(dst, n)
    else:
        load_numba().scale_avg(views[0], n)
