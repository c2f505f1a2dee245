"""The DLPack 1.0 tensor header (``dlpack.h``) as ctypes structures.

numpy's ``from_dlpack`` refuses float and complex tensors of the C long double's width, which
mpi4py maps to ``MPI_LONG_DOUBLE`` / ``MPI_C_LONG_DOUBLE_COMPLEX``; :mod:`bmlmpi.buffers`
reads such a tensor from the capsule itself with these structures. The layouts are the
header's, field for field, for unversioned (``"dltensor"``) and versioned
(``"dltensor_versioned"``) capsules.
"""

from __future__ import annotations

import ctypes

#: ``kDLFloat``, the type code of float tensors (complex is ``kDLComplex``, but a complex long
#: double does not fit the 8-bit ``bits`` field, so exporters send it as two float lanes).
FLOAT = 2
#: ``DLPACK_FLAG_BITMASK_READ_ONLY`` of a versioned tensor's ``flags``.
READ_ONLY = 1


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
