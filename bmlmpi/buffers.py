"""Normalising mpi4py-style buffer specifications to flat numpy views.

Accepted forms, as mpi4py accepts them: ``buf``, ``[buf, datatype]``, ``[buf, count,
datatype]``, ``[buf, (count, displ), datatype]``, where ``buf`` is a numpy array, anything with
the buffer protocol, or an object exposing ``__array__``/DLPack on the CPU (torch tensors), and
``datatype`` an ``MPI.Datatype`` or a numpy type code. Device (GPU) arrays are recognised
by ``__cuda_array_interface__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib


class BufferSpecError(ValueError):
    """A send or receive buffer bmlmpi cannot use."""


def is_device_array(obj: Any) -> bool:
    return hasattr(obj, "__cuda_array_interface__")


def _as_ndarray(obj: Any, what: str) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError):
            pass
    if hasattr(obj, "__array__"):
        return np.asarray(obj)
    raise BufferSpecError(f"{what}: {type(obj).__name__} is not a buffer (need a numpy array, "
                       f"the buffer protocol, DLPack or __cuda_array_interface__)")


def _to_dtype(datatype: Any) -> np.dtype:
    if isinstance(datatype, MPI.Datatype):
        try:
            return dtlib.to_numpy_dtype(datatype)
        except (ValueError, KeyError) as exc:
            raise BufferSpecError(f"MPI datatype {datatype.Get_name()} has no numpy "
                               f"equivalent") from exc
    return np.dtype(datatype)


@dataclass
class Spec:
    """A buffer spec resolved to the object that owns the memory and its flat view."""

    owner: Any
    flat: np.ndarray   # one-dimensional, contiguous, ``count`` elements
    count: int


def resolve(spec: Any, what: str) -> Spec:
    """Resolve a (host) buffer spec to a flat contiguous ndarray view.

    Non-contiguous arrays are refused with a clear error rather than silently copied, so a
    receive buffer is always written where the caller expects.
    """
    count = displ = None
    datatype = None
    buf = spec
    if isinstance(spec, (list, tuple)):
        if len(spec) == 2:
            buf, datatype = spec
        elif len(spec) == 3:
            buf, cnt, datatype = spec
            if isinstance(cnt, (list, tuple)):
                count, displ = cnt
            else:
                count = cnt
        else:
            raise BufferSpecError(f"{what}: a buffer spec is [buf, datatype] or "
                               f"[buf, count, datatype], got {len(spec)} items")
    arr = _as_ndarray(buf, what)
    if arr.size and not arr.flags.c_contiguous:
        raise BufferSpecError(f"{what}: array is not C-contiguous; pass np.ascontiguousarray(a) "
                           f"(a non-contiguous receive buffer cannot be filled in place)")
    flat = arr.reshape(-1)
    if datatype is not None:
        dtype = _to_dtype(datatype)
        if flat.dtype != dtype:
            nbytes = flat.nbytes
            if nbytes % dtype.itemsize:
                raise BufferSpecError(f"{what}: {nbytes} bytes is not a whole number of "
                                   f"{dtype} elements")
            flat = flat.view(np.uint8).view(dtype)
    start = int(displ or 0)
    n = flat.size - start if count is None else int(count)
    if n < 0 or start < 0 or start + n > flat.size:
        raise BufferSpecError(f"{what}: count {n} at displacement {start} exceeds the buffer's "
                           f"{flat.size} elements")
    return Spec(owner=buf, flat=flat[start:start + n], count=n)
