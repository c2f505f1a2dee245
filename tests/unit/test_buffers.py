"""Buffer specs resolved without communication: the forms mpi4py 4.1 accepts, DLPack exporters
(legacy and 1.0), zero-count specs, refused datatypes, and the one device-array test."""

import array

import numpy as np
import pytest
from dlpack_exporters import CapsuleOwnedDLPack, CtypesDLPack, DLPack1, LegacyDLPack
from mpi4py import MPI

from bmlmpi import buffers
from bmlmpi.buffers import BufferSpecError, resolve
from bmlmpi.kernels import dispatch, gpu


class CudaDLPackOnly:
    """A device array known only by its DLPack device (kDLCUDA), no CUDA array interface."""

    def __dlpack__(self, **_):
        raise AssertionError("a device array must not be imported as host memory")

    def __dlpack_device__(self):
        return (2, 0)


def test_one_device_array_test_for_the_api_and_the_kernels():
    assert buffers.is_device_array is gpu.is_device_array
    assert dispatch.gpu.is_device_array is gpu.is_device_array
    assert buffers.is_device_array(CudaDLPackOnly())
    assert not buffers.is_device_array(LegacyDLPack(np.zeros(2)))
    assert not buffers.is_device_array(np.zeros(2))


@pytest.mark.parametrize("exporter", [LegacyDLPack, DLPack1], ids=["legacy", "dlpack-1.0"])
def test_dlpack_receive_buffer_is_written_in_the_exporters_memory(exporter):
    memory = np.zeros(5, np.float32)
    spec = resolve(exporter(memory), "recvbuf")
    assert spec.flat.flags.writeable and spec.count == 5
    spec.flat[:] = np.arange(5)
    assert np.array_equal(memory, np.arange(5))
    # a typed spec over an exporter reinterprets its bytes, as mpi4py does
    typed = resolve([exporter(memory), 2, 1, MPI.FLOAT], "recvbuf")
    typed.flat[:] = -1
    assert np.array_equal(memory, [0, -1, -1, 3, 4])


def test_legacy_capsule_that_owns_its_tensor_is_kept_while_the_memory_is_used():
    """mpi4py's test exporter: a capsule released after numpy consumed it takes the tensor's
    header along, and numpy's later deleter call crashed. bmlmpi keeps the capsule with the
    array instead (as mpi4py keeps it): the deleter runs once, when the array is gone."""
    import gc
    a = np.arange(6, dtype=np.int32)
    exporter = CapsuleOwnedDLPack(a)
    spec = resolve(exporter, "recvbuf")
    spec.flat[:] = np.arange(6) * 3 + 1
    assert exporter.deleted == 0
    del spec
    gc.collect()
    assert exporter.deleted == 1
    assert a.tolist() == [1, 4, 7, 10, 13, 16]


def test_read_only_dlpack_1_0_export_stays_read_only():
    memory = np.zeros(3)
    memory.flags.writeable = False
    assert not resolve(DLPack1(memory), "recvbuf").flat.flags.writeable


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
@pytest.mark.parametrize("exporter", [LegacyDLPack, DLPack1], ids=["legacy", "dlpack-1.0"])
def test_long_double_over_dlpack_is_named(dtype, exporter):
    """numpy's own exporter refuses long double (these exporters wrap it)."""
    with pytest.raises(BufferSpecError,
                       match="long double types .* cannot travel over numpy's own DLPack"):
        resolve(exporter(np.zeros(3, dtype)), "sendbuf")
    # the numpy array itself carries them
    assert resolve(np.zeros(3, dtype), "sendbuf").flat.dtype == dtype


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "dlpack-1.0"])
def test_long_double_from_an_exporter_that_writes_it(dtype, legacy):
    """A DLPack tensor of C long double (complex: two lanes), as mpi4py reads it: the same
    memory, its shape, writable unless a 1.0 capsule says read-only."""
    memory = np.arange(12, dtype=dtype).reshape(3, 4)
    spec = resolve(CtypesDLPack(memory, legacy=legacy), "recvbuf")
    assert spec.flat.dtype == dtype and spec.count == 12
    assert spec.flat.ctypes.data == memory.ctypes.data and spec.flat.flags.writeable
    spec.flat[5] = 99
    assert memory.flat[5] == 99
    fortran = np.asfortranarray(memory)
    assert resolve(CtypesDLPack(fortran, legacy=legacy), "sendbuf").flat.ctypes.data == \
        fortran.ctypes.data
    if not legacy:
        memory.flags.writeable = False
        assert not resolve(CtypesDLPack(memory), "recvbuf").flat.flags.writeable


@pytest.mark.parametrize("spec", [[None, MPI.INT], [None, 0, MPI.INT], [None, (0, 0), MPI.INT],
                                  [None, "i"], [None, 0, 0, MPI.INT]])
def test_zero_count_specs_without_a_buffer(spec):
    got = resolve(spec, "recvbuf")
    assert got.count == 0 and got.flat.dtype == np.int32 and got.flat.size == 0


def test_none_buffer_with_a_count_is_refused():
    with pytest.raises(BufferSpecError, match="buffer is None but count is 3"):
        resolve([None, 3, MPI.INT], "sendbuf")


def test_every_spec_form_views_the_callers_memory():
    a = np.arange(10, dtype=np.int32)
    assert resolve([a, 4, 3, MPI.INT], "b").flat.tolist() == [3, 4, 5, 6]
    assert resolve([a, (4, 3), MPI.INT], "b").flat.tolist() == [3, 4, 5, 6]
    assert resolve([a, 4, MPI.INT], "b").flat.tolist() == [0, 1, 2, 3]
    assert resolve([a, "i"], "b").count == 10
    arr = array.array("d", [1.0, 2.0])
    resolve(arr, "b").flat[:] = 7
    assert arr.tolist() == [7.0, 7.0]
    with pytest.raises(BufferSpecError, match="got 5 items"):
        resolve([a, 1, 2, 3, MPI.INT], "b")


def test_fortran_ordered_arrays_are_taken_in_memory_order():
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    spec = resolve(f, "recvbuf")
    assert np.shares_memory(spec.flat, f)
    assert spec.flat.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    with pytest.raises(BufferSpecError, match="not contiguous"):
        resolve(np.arange(6.0)[::2], "recvbuf")


@pytest.mark.parametrize("name", ["LOGICAL", "C_BOOL", "CHAR", "WCHAR", "PACKED", "REAL16"])
def test_datatypes_whose_mpi_meaning_is_not_numpys_are_refused(name):
    datatype = getattr(MPI, name)
    with pytest.raises(BufferSpecError, match=datatype.Get_name()):
        resolve([np.zeros(32, np.uint8), datatype], "sendbuf")
    assert buffers.refused_datatype(MPI.INT) is None
