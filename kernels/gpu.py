"""GPU buffers for the allreduce: recognising device arrays, asking whether MPI can take them,
and staging them through pinned host memory when it cannot.

Device arrays are objects with ``__cuda_array_interface__`` (cupy, numba.cuda, torch CUDA
tensors) or with a DLPack device of type CUDA or CUDA-managed. Importing this module imports
neither cupy nor mpi4py; both are imported on first use.

Two ways through MPI:

- **CUDA-aware MPI**: device pointers go to MPI directly. :func:`cuda_aware_mpi` asks the MPI
  library (``MPIX_Query_cuda_support``, which Open MPI and MPICH export; for Open MPI without
  it, ``ompi_info``); ``BMLMPI_CUDA_AWARE=0|1`` overrides the answer.
- **Staging**: :func:`to_host_staging` copies a device array into a pinned host array and
  returns it with a ``finish`` callable that copies the result back. :func:`stage` does this for
  an allreduce's send and receive buffers at once.

In both cases the stream that produced the data is synchronised before MPI (or the host copy)
reads it: the stream named in ``__cuda_array_interface__`` if any, and cupy's current stream.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config

# DLPack device types that are CUDA device memory (kDLCUDA, kDLCUDAManaged).
_DLPACK_CUDA_DEVICES = (2, 13)


def is_device_array(obj: Any) -> bool:
    """True for a CUDA device array (``__cuda_array_interface__`` or a CUDA DLPack device)."""
    if isinstance(obj, np.ndarray):
        return False
    # hasattr, not a class check: torch CPU tensors raise AttributeError from the property.
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    device = getattr(obj, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        kind, _ = device()
    except Exception:  # a producer that cannot say is not one we can use
        return False
    return int(kind) in _DLPACK_CUDA_DEVICES


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise ImportError("a GPU array was given but cupy is not installed: "
                          "pip install '.[gpu]' in bmlmpi's checkout (cupy-cuda12x)") from exc
    return cupy


def gpu_available() -> bool:
    """True if cupy imports and sees at least one CUDA device."""
    try:
        cupy = _cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def as_cupy(obj: Any):
    """A cupy view (no copy) of a device array, safe to use on cupy's current stream.

    A foreign array whose ``__cuda_array_interface__`` names a stream is synchronised on it
    first; DLPack producers order their stream against ours as the protocol requires.
    """
    cupy = _cupy()
    if isinstance(obj, cupy.ndarray):
        return obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        stream = cai.get("stream") if isinstance(cai, dict) else None
        if stream:
            cupy.cuda.ExternalStream(int(stream)).synchronize()
        return cupy.asarray(obj)
    if is_device_array(obj):
        return cupy.from_dlpack(obj)
    raise TypeError(f"{type(obj).__name__} is not a device array")


def synchronize(obj: Any = None) -> None:
    """Wait until the work producing ``obj`` (its declared stream, if foreign) and all work
    queued on cupy's current stream are done, so that MPI or the host may read it."""
    cupy = _cupy()
    if obj is not None and not isinstance(obj, cupy.ndarray):
        as_cupy(obj)
    cupy.cuda.get_current_stream().synchronize()


def empty_like(array: Any):
    """A new, uninitialised cupy array with the shape and dtype of device array ``array``."""
    return _cupy().empty_like(as_cupy(array))


# -- CUDA-aware MPI ----------------------------------------------------------------------------

def cuda_aware_mpi() -> bool:
    """Whether MPI accepts device pointers; ``BMLMPI_CUDA_AWARE=0|1`` overrides detection."""
    forced = config.get("BMLMPI_CUDA_AWARE")
    return _detect_cuda_aware() if forced is None else forced


@functools.cache
def _detect_cuda_aware() -> bool:
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return False
    lib = _loaded_mpi_library()
    if lib is not None:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            query.argtypes = []
            return bool(query())
        gpu_query = getattr(lib, "MPIX_GPU_query_support", None)  # MPICH >= 4
        if gpu_query is not None:
            supported = ctypes.c_int(0)
            gpu_query.restype = ctypes.c_int
            gpu_query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            if gpu_query(0, ctypes.byref(supported)) == 0:  # 0: MPIX_GPU_SUPPORT_CUDA
                return bool(supported.value)
    if "Open MPI" in MPI.Get_library_version():
        return _ompi_info_cuda()
    return False


_LIBMPI = re.compile(r"/libmpi(_\w+)?\.so[.\d]*$")


def _loaded_mpi_library() -> ctypes.CDLL | None:
    """The MPI library mpi4py loaded (found in this process's memory map), or None."""
    path = None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and _LIBMPI.search(fields[-1]):
                    path = fields[-1]
                    break
    except OSError:
        from ctypes.util import find_library

        path = find_library("mpi")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def _ompi_info_cuda() -> bool:
    import shutil
    import subprocess

    exe = shutil.which("ompi_info")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "--parsable", "--all"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"built_with_cuda_support:value:true", out) is not None


# -- staging -----------------------------------------------------------------------------------

# Pinned host blocks kept for reuse, by size in bytes: allocating page-locked memory on every
# call cost 15-25 % of a device-array allreduce from 32 KiB up (measured on an H100, 4 ranks:
# native at 1 MiB 759 -> 586 us; perf/README.md). A block is taken for one staging and given
# back by its ``finish``, so calls in flight at the same time never share one.
_PINNED_KEEP = 8
_pinned_free: dict[int, list[np.ndarray]] = {}


def _take_pinned(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(block, view): a pinned uint8 block of the array's size and the array viewing it."""
    import cupyx

    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    free = _pinned_free.get(nbytes)
    block = free.pop() if free else cupyx.empty_pinned(max(nbytes, 1), dtype=np.uint8)
    return block, block[:nbytes].view(dtype).reshape(shape)


def _give_pinned(block: np.ndarray) -> None:
    kept = sum(len(v) for v in _pinned_free.values())
    if kept >= _PINNED_KEEP:
        # drop the blocks of some other size first, so the sizes in use now stay cached
        for size in list(_pinned_free):
            if size != block.nbytes and _pinned_free[size]:
                _pinned_free[size].pop()
                if not _pinned_free[size]:
                    del _pinned_free[size]
                break
        else:
            return
    _pinned_free.setdefault(block.nbytes, []).append(block)


def to_host_staging(devarray: Any, *, copy_in: bool = True,
                    copy_out: bool = True) -> tuple[np.ndarray, Callable[[], None]]:
    """Copy ``devarray`` into pinned host memory; return the host array and ``finish``.

    ``copy_in=False`` skips the device-to-host copy (a receive buffer about to be overwritten).
    ``finish()`` copies the host array back into ``devarray`` (unless ``copy_out=False``),
    waits for the copy, so the device holds the result when it returns, and gives the pinned
    memory back for reuse: the host array must not be used after ``finish()``.
    """
    cupy = _cupy()

    dev = as_cupy(devarray)
    synchronize(dev)
    block, host = _take_pinned(dev.shape, dev.dtype)
    stream = cupy.cuda.get_current_stream()
    if copy_in and dev.size:
        with stream:
            src = dev if dev.flags.c_contiguous else cupy.ascontiguousarray(dev)
        src.get(stream=stream, out=host)
        stream.synchronize()

    done = False

    def finish() -> None:
        nonlocal done
        if done:
            return
        done = True
        if copy_out and dev.size:
            if dev.flags.c_contiguous:
                dev.set(host, stream=stream)
            else:
                with stream:
                    dev[...] = cupy.asarray(host)
            stream.synchronize()
        _give_pinned(block)

    return host, finish


@dataclass
class Staging:
    """Host (or, with CUDA-aware MPI, device) stand-ins for an allreduce's buffers.

    ``host_send`` and ``host_recv`` have the form the caller gave (an array, ``[buf, type]``
    or ``[buf, count, type]``; ``MPI.IN_PLACE`` or None passes through). Call :meth:`finish`
    after the allreduce to put the result in the caller's receive buffer.
    """

    host_send: Any
    host_recv: Any
    on_device: bool = False
    _finish: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def finish(self) -> None:
        for f in self._finish:
            f()
        self._finish.clear()


def _spec_buffer(spec: Any) -> tuple[Any, Callable[[Any], Any]]:
    """Split an mpi4py buffer spec into its buffer and a function rebuilding it around another."""
    if isinstance(spec, (list, tuple)) and spec:
        return spec[0], lambda b: [b, *spec[1:]]
    return spec, lambda b: b


def stage(sendbuf: Any, recvbuf: Any, *, allow_device: bool = False) -> Staging:
    """Prepare an allreduce's buffers for MPI.

    Device buffers are copied to pinned host memory, except when ``allow_device`` is true and
    MPI is CUDA-aware: then they are passed through as cupy views (after synchronising), and
    the caller must reduce them with the cupy kernels. Host buffers pass through unchanged.
    """
    send_buf, rebuild_send = _spec_buffer(sendbuf)
    recv_buf, rebuild_recv = _spec_buffer(recvbuf)
    in_place = sendbuf is None or _is_in_place(sendbuf)
    device = (allow_device and cuda_aware_mpi()
              and is_device_array(recv_buf) and (in_place or is_device_array(send_buf)))
    if device:
        for b in (send_buf, recv_buf):
            if b is not None and not _is_in_place(b):
                synchronize(b)
        send = sendbuf if in_place else rebuild_send(as_cupy(send_buf))
        return Staging(send, rebuild_recv(as_cupy(recv_buf)), on_device=True,
                       _finish=[synchronize])

    finishers: list[Callable[[], None]] = []
    send = sendbuf
    if not in_place and is_device_array(send_buf):
        host_send, release = to_host_staging(send_buf, copy_in=True, copy_out=False)
        send = rebuild_send(host_send)
        finishers.append(release)
    recv = recvbuf
    if is_device_array(recv_buf):
        # The receive buffer's old contents matter when it is the input (in place) or when
        # the allreduce writes only part of it (an explicit count, or a smaller send buffer):
        # copying it in keeps the part MPI leaves alone intact after the copy back.
        whole = (not in_place and send_buf is sendbuf and recv_buf is recvbuf
                 and is_device_array(send_buf)
                 and as_cupy(send_buf).nbytes == as_cupy(recv_buf).nbytes)
        host_recv, finish = to_host_staging(recv_buf, copy_in=not whole, copy_out=True)
        recv = rebuild_recv(host_recv)
        finishers.append(finish)
    return Staging(send, recv, on_device=False, _finish=finishers)


def _is_in_place(obj: Any) -> bool:
    try:
        from mpi4py import MPI
    except ImportError:
        return False
    return obj is MPI.IN_PLACE
