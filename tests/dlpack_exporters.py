"""Hand-written DLPack exporters for the buffer tests (unit and MPI): numpy arrays seen only
through the protocol, as other libraries export them."""

import ctypes

import numpy as np

from bmlmpi.dlpack import DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLTensor


class LegacyDLPack:
    """Exports memory over the DLPack protocol before 1.0: ``__dlpack__`` has no max_version."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class DLPack1:
    """Exports memory over DLPack 1.0 (versioned capsules, read-only flag)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._a.__dlpack__(stream=stream, max_version=max_version,
                                  dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class CtypesDLPack:
    """Exports any numpy array, long double included, over DLPack with capsules built by
    ctypes, as mpi4py's own test suite builds them (numpy's exporter refuses long double).
    ``legacy``: the protocol before 1.0. The exporter owns the tensor's header and keeps the
    array alive; its capsules have no destructor."""

    CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}

    def __init__(self, a: np.ndarray, *, legacy: bool = False):
        self._a = a
        self._legacy = legacy
        self._keep: list = []

    def _tensor(self) -> DLTensor:
        a = self._a
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        strides = (ctypes.c_int64 * max(a.ndim, 1))(*(s // a.itemsize for s in a.strides))
        self._keep += [shape, strides]
        if a.dtype == np.clongdouble:  # 256 bits: two lanes of long double, as mpi4py reads it
            dtype = DLDataType(self.CODES["f"], a.itemsize * 4, 2)
        else:
            dtype = DLDataType(self.CODES[a.dtype.kind], a.itemsize * 8, 1)
        return DLTensor(a.ctypes.data, 1, 0, a.ndim, dtype, shape, strides, 0)

    def __dlpack__(self, *args, **kwargs):
        if self._legacy:
            if kwargs.get("max_version") is not None:
                raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
            managed = DLManagedTensor(self._tensor(), None, None)
            name = b"dltensor"
        else:
            read_only = 0 if self._a.flags.writeable else 1
            managed = DLManagedTensorVersioned(1, 0, None, None, read_only, self._tensor())
            name = b"dltensor_versioned"
        self._keep.append(managed)
        return _capsule_new(ctypes.addressof(managed), name, None)

    def __dlpack_device__(self):
        return (1, 0)


_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CapsuleOwnedDLPack:
    """The protocol before 1.0 with capsules that own their tensor's header, as mpi4py's own
    test exporter makes them: a capsule released unconsumed calls the tensor's deleter, and
    a released capsule takes its header with it (here: zeroes it, so a consumer that calls
    the deleter later through that header finds none). ``deleted`` counts deleter calls:
    exactly one per export when the consumer keeps the capsule while it uses the memory."""

    def __init__(self, a: np.ndarray):
        self._a = a
        self.deleted = 0
        self._headers: dict[int, DLManagedTensor] = {}
        self._deleter = _DELETER(self._delete)
        self._destructor = _DESTRUCTOR(self._release)

    def _delete(self, _managed: int) -> None:
        self.deleted += 1

    def _release(self, capsule: int) -> None:
        name = _capsule_name(capsule)
        header = _capsule_pointer(capsule, name)
        if name == b"dltensor":  # never consumed: the capsule releases the tensor
            self._delete(header)
        # consumed or not, the header goes with the capsule (kept as zeros, not freed, so
        # that a consumer reading it later finds no deleter instead of crashing)
        managed = self._headers[header]
        ctypes.memset(ctypes.addressof(managed), 0, ctypes.sizeof(managed))

    def __dlpack__(self, stream=None):
        a = self._a
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        dtype = DLDataType(CtypesDLPack.CODES[a.dtype.kind], a.itemsize * 8, 1)
        managed = DLManagedTensor(DLTensor(a.ctypes.data, 1, 0, a.ndim, dtype, shape, None, 0),
                                  None, ctypes.cast(self._deleter, ctypes.c_void_p))
        managed._shape = shape
        self._headers[ctypes.addressof(managed)] = managed
        return _capsule_new(ctypes.addressof(managed), b"dltensor",
                            ctypes.cast(self._destructor, ctypes.c_void_p))

    def __dlpack_device__(self):
        return (1, 0)
