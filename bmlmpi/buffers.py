"""Normalising mpi4py-style buffer specifications to flat numpy views.

Accepted forms, as mpi4py 4.1 accepts them: ``buf``, ``[buf, datatype]``, ``[buf, count,
datatype]``, ``[buf, (count, displ), datatype]``, ``[buf, count, displ, datatype]``, where
``buf`` is a numpy array, anything with the buffer protocol (``bytearray``, ``array.array``,
``memoryview``), a DLPack exporter on the CPU (the 1.0 protocol or the older one without
``max_version``), or an object with ``__array__``; ``buf`` may be ``None`` when the count is 0.
``datatype`` is an ``MPI.Datatype`` or a numpy type code. Arrays may be C- or Fortran-contiguous;
their elements are taken in memory order, as MPI takes them.

Device (GPU) arrays are recognised by :func:`is_device_array`, the one test shared with the
kernels (``__cuda_array_interface__`` or a CUDA DLPack device); they are staged before they
reach :func:`resolve`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import dlpack
from .kernels.gpu import is_device_array

__all__ = ["BufferSpecError", "Spec", "is_device_array", "refused_datatype", "resolve",
           "resolve_blocks"]


class BufferSpecError(ValueError):
    """A send or receive buffer bmlmpi cannot use."""


_LOGICAL = ("a logical type: MPI reduces it with logical operations (LAND, LOR), "
            "not SUM/PROD/MIN/MAX")
_CHARACTER = "a character type, not a number"
# Predefined MPI datatypes that mpi4py.util.dtlib maps to a numpy dtype but whose meaning in a
# reduction differs from that dtype's arithmetic: bmlmpi refuses them (docs/api.md, conformance).
_REFUSED_NAMES = {
    **dict.fromkeys(("BOOL", "C_BOOL", "CXX_BOOL", "F_BOOL", "LOGICAL", "LOGICAL1",
                     "LOGICAL2", "LOGICAL4", "LOGICAL8"), _LOGICAL),
    **dict.fromkeys(("CHAR", "CHARACTER", "WCHAR"), _CHARACTER),
    "PACKED": "packed bytes, not a number",
    # The MPI standard defines only BAND/BOR/BXOR on MPI_BYTE; MPICH refuses SUM/PROD/MIN/MAX
    # on it, Open MPI accepts them as an extension: refused, so that no result depends on it.
    "BYTE": "untyped bytes: MPI defines only the bitwise ops (BAND, BOR, BXOR) on MPI_BYTE; "
            "use MPI.UNSIGNED_CHAR or MPI.UINT8_T for numbers",
    # Fortran REAL*16 is IEEE quadruple precision to the MPI library, while numpy's float128
    # (which dtlib maps it to) is the C long double: on x86 an 80-bit extended format.
    "REAL16": "Fortran REAL*16 (IEEE quadruple precision in the MPI library) is not numpy's "
              "float128 (the C long double); use MPI.LONG_DOUBLE for numpy's long double",
    "COMPLEX32": "Fortran COMPLEX*32 (IEEE quadruple precision in the MPI library) is not "
                 "numpy's complex256 (the C long double); use MPI.C_LONG_DOUBLE_COMPLEX",
}
_REFUSED = [(getattr(MPI, name), why) for name, why in _REFUSED_NAMES.items()
            if getattr(MPI, name, MPI.DATATYPE_NULL) != MPI.DATATYPE_NULL]


def refused_datatype(datatype: MPI.Datatype) -> str | None:
    """Why bmlmpi refuses a predefined MPI datatype (``"MPI_NAME: reason"``), or None."""
    for handle, why in _REFUSED:
        if datatype == handle:
            return f"{datatype.Get_name() or 'this datatype'}: {why}"
    return None


class _Capsule:
    """Hands numpy a DLPack capsule already taken from its exporter."""

    def __init__(self, capsule: Any, device: tuple[int, int]):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _long_double_hint(obj: Any, message: str) -> str:
    dtype = getattr(obj, "dtype", None)
    named = "longdouble" in message or "long double" in message
    try:
        long = dtype is not None and np.dtype(dtype) in (np.longdouble, np.clongdouble)
    except TypeError:
        long = False
    if named or long:
        return ("; numpy's long double types (longdouble, clongdouble) cannot travel over "
                "numpy's own DLPack export (mpi4py fails on it too): pass the numpy array "
                "itself, or an exporter that writes long double tensors (bmlmpi reads them)")
    return ""


# -- DLPack tensors bmlmpi reads from the capsule itself ------------------------------------
# numpy's from_dlpack refuses float and complex tensors of sizeof(long double) bits; mpi4py
# maps them to MPI_LONG_DOUBLE / MPI_C_LONG_DOUBLE_COMPLEX. And numpy consumes an unversioned
# capsule and lets it go while the array lives, calling the tensor's deleter later: an
# exporter whose capsule owns the DLManagedTensor (mpi4py's own test exporter does this; the
# protocol before 1.0 leaves it open) has then freed it, and the deleter call crashes.
# mpi4py keeps the capsule alive while it uses the memory; bmlmpi does the same for every
# unversioned capsule and for long double tensors (:mod:`bmlmpi.dlpack`), and hands the rest
# to numpy.

# (code, bits, lanes): complex long double has 256 bits, more than DLPack's 8-bit field holds,
# so it travels as two lanes of long double (mpi4py reads it so: format "Zg").
_LONG_BITS = np.dtype(np.longdouble).itemsize * 8
_LONG_DOUBLE = {(dlpack.FLOAT, _LONG_BITS, 1): np.dtype(np.longdouble),
                (dlpack.FLOAT, _LONG_BITS, 2): np.dtype(np.clongdouble)}
# DLPack's type codes (kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool) as numpy kinds
_KINDS = {0: "i", 1: "u", dlpack.FLOAT: "f", 5: "c", 6: "b"}
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype, _capsule_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _tensor_dtype(code: int, bits: int, lanes: int, legacy: bool) -> np.dtype | None:
    """The numpy dtype bmlmpi reads a CPU tensor as itself: long double always, any plain
    numeric or bool type from an unversioned capsule; None where numpy imports it."""
    long_double = _LONG_DOUBLE.get((code, bits, lanes))
    if long_double is not None or not legacy:
        return long_double
    kind = _KINDS.get(code)
    if kind is None or lanes != 1 or bits % 8:
        return None
    try:
        return np.dtype("?" if kind == "b" and bits == 8 else f"{kind}{bits // 8}")
    except TypeError:
        return None


def _capsule_tensor(capsule: Any) -> np.ndarray | None:
    """The CPU tensor in an unused DLPack capsule as a numpy array, for the dtypes
    :func:`_tensor_dtype` names, else None. The capsule is not consumed: the array keeps it
    alive, and the capsule's own destructor releases the tensor when the array is gone."""
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = dlpack.DLManagedTensorVersioned.from_address(
            _capsule_pointer(capsule, b"dltensor_versioned"))
        read_only, legacy = bool(managed.flags & dlpack.READ_ONLY), False
    elif _capsule_valid(capsule, b"dltensor"):
        managed = dlpack.DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
        read_only, legacy = False, True  # a legacy capsule cannot say; mpi4py writes it
    else:
        return None
    tensor = managed.dl_tensor
    dtype = _tensor_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes, legacy)
    if dtype is None or tensor.device_type != 1:  # kDLCPU
        return None
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = (None if not tensor.strides else
               tuple(tensor.strides[i] * dtype.itemsize for i in range(tensor.ndim)))
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype)
    span = dtype.itemsize * (1 + sum((n - 1) * abs(st // dtype.itemsize)
                                     for n, st in zip(shape, strides, strict=True))
                             if strides else count)
    if strides and any(st < 0 for st in strides):
        return None  # numpy's own refusal (negative strides) names the problem
    memory = (ctypes.c_char * span).from_address((tensor.data or 0) + tensor.byte_offset)
    memory.owner = capsule
    arr = np.ndarray(shape, dtype, buffer=memory, strides=strides)
    arr.flags.writeable = not read_only
    return arr


def _writable_alias(arr: np.ndarray) -> np.ndarray:
    """A writable view of a contiguous array's memory that keeps ``arr`` (its owner) alive."""
    memory = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    memory.owner = arr  # the exporter's memory lives as long as the import does
    order = "C" if arr.flags.c_contiguous else "F"
    return np.ndarray(arr.shape, arr.dtype, buffer=memory, order=order)


def _from_dlpack(obj: Any, what: str) -> np.ndarray:
    """Import a CPU DLPack exporter as mpi4py 4.1 does: ask for a 1.0 (versioned) capsule and
    fall back to the older protocol when ``__dlpack__`` takes no ``max_version``.

    A versioned capsule says whether its memory is read-only. An older capsule cannot say, and
    numpy marks every such import read-only; mpi4py treats it as writable and so does bmlmpi
    (the exporter's memory is written in place, as mpi4py's Allreduce writes it).
    """
    try:
        device = tuple(obj.__dlpack_device__())
        try:
            capsule, legacy = obj.__dlpack__(max_version=(1, 0), copy=False), False
        except TypeError:
            capsule, legacy = obj.__dlpack__(), True
        own = _capsule_tensor(capsule) if device[0] == 1 else None
        if own is not None:
            return own
        arr = np.from_dlpack(_Capsule(capsule, device))
    except (TypeError, ValueError, RuntimeError, BufferError) as exc:
        raise BufferSpecError(f"{what}: {type(obj).__name__} could not be taken over DLPack: "
                              f"{exc}{_long_double_hint(obj, str(exc))}") from exc
    if legacy and not arr.flags.writeable:
        if not arr.size:
            return np.empty_like(arr)  # no memory to write: any writable empty array will do
        if arr.flags.c_contiguous or arr.flags.f_contiguous:
            arr = _writable_alias(arr)
    return arr


def _as_ndarray(obj: Any, what: str) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, what)
    if hasattr(obj, "__array__"):
        return np.asarray(obj)
    raise BufferSpecError(f"{what}: {type(obj).__name__} is not a buffer (need a numpy array, "
                       f"the buffer protocol, DLPack or __cuda_array_interface__)")


def _to_dtype(datatype: Any, what: str, reducing: bool = True) -> np.dtype:
    if isinstance(datatype, MPI.Datatype):
        if not datatype.is_predefined:
            # MPI moves only a derived type's typemap (holes keep their values, elements go in
            # typemap order); bmlmpi moves element and byte ranges of memory, so it would
            # write the holes: refused on every call instead of writing them
            raise BufferSpecError(
                f"{what}: {datatype.Get_name() or 'a derived MPI datatype'} is not a "
                f"predefined datatype; bmlmpi takes predefined datatypes only (a derived "
                f"one's holes would be overwritten): pass the elements as an array of a "
                f"predefined type, or call mpi4py's own collective")
        why = refused_datatype(datatype) if reducing else None
        if why is not None:
            raise BufferSpecError(f"{what}: bmlmpi does not reduce {why}")
        try:
            dtype = dtlib.to_numpy_dtype(datatype)
        except (ValueError, KeyError) as exc:
            raise BufferSpecError(f"{what}: MPI datatype {datatype.Get_name()} has no numpy "
                               f"equivalent") from exc
    else:
        try:
            dtype = np.dtype(datatype)
        except TypeError as exc:
            raise BufferSpecError(f"{what}: {datatype!r} is not a datatype") from exc
    if dtype.itemsize == 0:
        raise BufferSpecError(f"{what}: datatype {dtype} has no size")
    return dtype


def _split_spec(spec: Any, what: str) -> tuple[Any, Any, Any, Any]:
    """(buf, count, displ, datatype) of any spec form; None where the form leaves it out."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    if len(spec) == 2:
        buf, datatype = spec
        return buf, None, None, datatype
    if len(spec) == 3:
        buf, cnt, datatype = spec
        if isinstance(cnt, (list, tuple)):
            count, displ = cnt
            return buf, count, displ, datatype
        return buf, cnt, None, datatype
    if len(spec) == 4:
        return spec[0], spec[1], spec[2], spec[3]
    raise BufferSpecError(f"{what}: a buffer spec is [buf, datatype], [buf, count, datatype], "
                          f"[buf, (count, displ), datatype] or [buf, count, displ, datatype], "
                          f"got {len(spec)} items")


@dataclass
class Spec:
    """A buffer spec resolved to the object that owns the memory and its flat view."""

    owner: Any
    flat: np.ndarray   # one-dimensional, contiguous, ``count`` elements
    count: int


def resolve(spec: Any, what: str, reducing: bool = True) -> Spec:
    """Resolve a (host) buffer spec to a flat contiguous ndarray view in memory order.
    ``reducing`` False (a collective that only moves data: allgather, broadcast) accepts the
    datatypes a reduction refuses (:func:`refused_datatype`).

    Arrays neither C- nor Fortran-contiguous are refused with a clear error rather than
    silently copied, so a receive buffer is always written where the caller expects.
    """
    buf, count, displ, datatype = _split_spec(spec, what)
    if buf is None:
        # mpi4py's zero-count spec: no memory, only a datatype
        if count not in (None, 0):
            raise BufferSpecError(f"{what}: buffer is None but count is {count}")
        dtype = np.dtype(np.uint8) if datatype is None else _to_dtype(datatype, what,
                                                                      reducing)
        return Spec(owner=None, flat=np.empty(0, dtype), count=0)
    arr = _as_ndarray(buf, what)
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
    elif arr.flags.f_contiguous:
        flat = arr.reshape(-1, order="F")  # a view: Fortran order is this array's memory order
    else:
        raise BufferSpecError(f"{what}: array is not contiguous; pass np.ascontiguousarray(a) "
                           f"(a non-contiguous receive buffer cannot be filled in place)")
    if datatype is not None:
        dtype = _to_dtype(datatype, what, reducing)
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


def resolve_blocks(spec: Any, what: str, blocks: int, reducing: bool = True) -> Spec:
    """:func:`resolve` for a buffer that holds one block per rank, as mpi4py reads it
    (``Reduce_scatter_block``'s send buffer, and its receive buffer in place; ``Allgather``'s
    receive buffer): an explicit count in the spec is the count of *one* block, so the
    buffer spans ``count × blocks`` elements from the displacement."""
    buf, count, displ, datatype = _split_spec(spec, what)
    if count is None:
        return resolve(spec, what, reducing)
    return resolve([buf, int(count) * blocks, int(displ or 0), datatype], what, reducing)
