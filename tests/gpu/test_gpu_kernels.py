"""GPU kernels and staging (cupy back end, ``bmlmpi.kernels.gpu``).

Skipped, as a whole module, where cupy is not installed or no CUDA device is visible.
Results are compared with the numpy reference computed on host copies of the same data.
"""

from __future__ import annotations

import numpy as np
import pytest

from bmlmpi import kernels

cupy = pytest.importorskip("cupy")
gpu, numpy_backend = kernels.gpu, kernels.numpy_backend

if not gpu.gpu_available():
    pytest.skip("no CUDA device visible to cupy", allow_module_level=True)

OPS = ("sum", "prod", "min", "max")
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
CASES = [(d, op) for d in DTYPES for op in OPS
         if not (np.dtype(d).kind == "c" and op in ("min", "max"))]
SIZES = (0, 1, 7, 1001, 1_000_003)
UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def data(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
    real = dt.type(0).real.dtype
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], real)

    def part() -> np.ndarray:
        x = (rng.standard_normal(n) * 100).astype(real)
        k = min(n, specials.size)
        x[:k] = rng.permutation(specials)[:k]
        return x

    return (part() + 1j * part()).astype(dt) if dt.kind == "c" else part()


def expected(dst: np.ndarray, srcs: list[np.ndarray], op: str) -> np.ndarray:
    f = UFUNC[op]
    if dst.dtype == np.float16 and len(srcs) > 1:
        acc = dst.astype(np.float32)
        for s in srcs:
            acc = f(acc, s.astype(np.float32))
        return acc.astype(np.float16)
    acc = dst.copy()
    for s in srcs:
        f(acc, s, out=acc)
    return acc


def check(got_dev, want: np.ndarray, op: str) -> None:
    got = cupy.asnumpy(got_dev)
    assert got.dtype == want.dtype and got.shape == want.shape
    if op == "prod" and want.dtype.kind == "c":
        # nvcc contracts complex multiplication into fused multiply-adds.
        fin = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), fin)
        rtol = 1e-5 if want.dtype == np.complex64 else 1e-12
        np.testing.assert_allclose(got[fin], want[fin], rtol=rtol, atol=0)
    else:
        np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("nsrc", [1, 2, 3])
def test_cupy_matches_reference(dtype, op, nsrc):
    rng = np.random.default_rng(10 + nsrc)
    for n in SIZES:
        dst = data(dtype, n, rng)
        srcs = [data(dtype, n, rng) for _ in range(nsrc)]
        d = cupy.asarray(dst)
        ds = [cupy.asarray(s) for s in srcs]
        if nsrc == 1:
            kernels.reduce_into(d, ds[0], op)
        else:
            kernels.reduce_many_into(d, ds, op)
        check(d, expected(dst, srcs, op), op)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cupy_min_max_propagate_nan(dtype):
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, inf, -inf, 1.0], dtype)
    b = np.array([1.0, nan, nan, 1.0, 1.0, -inf], dtype)
    lo, hi = cupy.asarray(a), cupy.asarray(a)
    kernels.reduce_into(lo, cupy.asarray(b), "min")
    kernels.reduce_into(hi, cupy.asarray(b), "max")
    np.testing.assert_array_equal(cupy.asnumpy(lo), np.array([nan, nan, nan, 1, -inf, -inf], dtype))
    np.testing.assert_array_equal(cupy.asnumpy(hi), np.array([nan, nan, nan, inf, 1, 1], dtype))


def test_cupy_float16_fused_accumulates_in_float32():
    d = cupy.asarray(np.array([2048.0], np.float16))
    one = cupy.ones(1, np.float16)
    kernels.reduce_many_into(d, [one, one], "sum")
    assert float(d[0]) == 2050.0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_scale_avg_matches_reference(dtype):
    rng = np.random.default_rng(20)
    for n in SIZES:
        for ranks in (1, 3, 12):
            host = data(dtype, n, rng)
            d = cupy.asarray(host)
            kernels.scale_avg(d, ranks)
            numpy_backend.scale_avg(host, ranks)
            got = cupy.asnumpy(d)
            if host.dtype.kind == "c":
                np.testing.assert_allclose(got, host, rtol=1e-6, equal_nan=True)
            else:
                np.testing.assert_array_equal(got, host, strict=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_vector_and_element_paths_agree(dtype):
    """Views starting off a 16-byte boundary take the one-element-per-thread kernel, aligned
    ones the 16-byte vector kernel with its tail; both must give the reference bit for bit."""
    rng = np.random.default_rng(30)
    op = "sum" if np.dtype(dtype).kind == "c" else "max"
    n = 4099
    for offset in range(4):
        for nsrc in (1, 3):
            dst = data(dtype, n + offset, rng)
            srcs = [data(dtype, n + offset, rng) for _ in range(nsrc)]
            d = cupy.asarray(dst)
            ds = [cupy.asarray(x)[offset:] for x in srcs]
            kernels.reduce_many_into(d[offset:], ds, op)
            want = dst.copy()
            want[offset:] = expected(dst[offset:], [x[offset:] for x in srcs], op)
            check(d, want, op)


def test_cupy_partial_overlap_and_layouts():
    x = cupy.arange(1.0, 10_001.0)
    want = cupy.asnumpy(x[1:] + x[:-1])
    kernels.reduce_into(x[1:], x[:-1], "sum")
    np.testing.assert_array_equal(cupy.asnumpy(x[1:]), want)
    a = cupy.arange(60.0).reshape(6, 10)
    b = cupy.asfortranarray(cupy.ones((6, 10)))
    kernels.reduce_into(a[:, ::2], b[:, 1::2], "max")
    assert cupy.asnumpy(a)[0, 0] == 1.0 and cupy.asnumpy(a)[5, 8] == 58.0


def test_cupy_errors():
    a = cupy.ones(4, cupy.complex64)
    with pytest.raises(TypeError, match="complex"):
        kernels.reduce_into(a, a.copy(), "min")
    with pytest.raises(ValueError, match="shape"):
        kernels.reduce_into(cupy.ones(4), cupy.ones(5), "sum")
    with pytest.raises(TypeError, match="dtype"):
        kernels.reduce_into(cupy.ones(4, cupy.float32), cupy.ones(4), "sum")
    with pytest.raises(TypeError, match="device"):
        kernels.reduce_into(cupy.ones(4), np.ones(4), "sum")


def test_device_detection_and_views():
    a = cupy.arange(8, dtype=cupy.float32)
    assert gpu.is_device_array(a)
    assert gpu.as_cupy(a) is a
    dev_type, _ = a.__dlpack_device__()
    assert dev_type == 2
    e = gpu.empty_like(a)
    assert isinstance(e, cupy.ndarray) and e.shape == a.shape and e.dtype == a.dtype


def test_to_host_staging_round_trip():
    d = cupy.arange(1000, dtype=cupy.float64)
    host, finish = gpu.to_host_staging(d)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.arange(1000.0))
    host *= 2
    finish()
    np.testing.assert_array_equal(cupy.asnumpy(d), 2 * np.arange(1000.0))
    # A strided device view comes back into the right elements only.
    base = cupy.zeros(20)
    view = base[::2]
    host, finish = gpu.to_host_staging(view, copy_in=False)
    host[...] = 7
    finish()
    got = cupy.asnumpy(base)
    assert np.all(got[::2] == 7) and np.all(got[1::2] == 0)


def test_stage_send_and_recv(monkeypatch):
    from mpi4py import MPI

    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "0")
    send = cupy.arange(10, dtype=cupy.int32)
    recv = cupy.full(10, -1, cupy.int32)
    st = gpu.stage(send, recv)
    assert not st.on_device
    np.testing.assert_array_equal(st.host_send, np.arange(10))
    st.host_recv[...] = 5
    st.finish()
    np.testing.assert_array_equal(cupy.asnumpy(recv), np.full(10, 5))
    # In place: the receive buffer is the input, so it is copied in.
    st = gpu.stage(MPI.IN_PLACE, [recv, MPI.INT])
    assert st.host_send is MPI.IN_PLACE
    np.testing.assert_array_equal(st.host_recv[0], np.full(10, 5))
    # A larger receive buffer keeps its tail: MPI writes only the first elements.
    big = cupy.full(16, 9, cupy.int32)
    st = gpu.stage(send, big)
    st.host_recv[:10] = 1
    st.finish()
    np.testing.assert_array_equal(cupy.asnumpy(big), [1] * 10 + [9] * 6)


def test_staging_reuses_pinned_memory_but_never_shares_it(monkeypatch):
    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "0")
    a, b = cupy.arange(100, dtype=cupy.float32), cupy.zeros(100, cupy.float32)
    first, second = gpu.stage(a, b), gpu.stage(a, b)  # two calls in flight at once
    ptrs = {x.ctypes.data for st in (first, second) for x in (st.host_send, st.host_recv)}
    assert len(ptrs) == 4
    second.host_recv[...] = 3
    first.host_recv[...] = 2
    first.finish()
    second.finish()
    np.testing.assert_array_equal(cupy.asnumpy(b), np.full(100, 3))
    again = gpu.stage(a, b)
    assert {again.host_send.ctypes.data, again.host_recv.ctypes.data} <= ptrs
    np.testing.assert_array_equal(again.host_send, np.arange(100))
    again.finish()


def test_stage_keeps_device_buffers_with_cuda_aware_mpi(monkeypatch):
    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "1")
    send, recv = cupy.ones(4), cupy.zeros(4)
    st = gpu.stage(send, recv, allow_device=True)
    assert st.on_device
    assert isinstance(st.host_send, cupy.ndarray) and isinstance(st.host_recv, cupy.ndarray)
    st = gpu.stage(send, recv)  # the executor has not opted in: staged through the host
    assert not st.on_device and isinstance(st.host_recv, np.ndarray)


def test_warmup_compiles_gpu_kernels():
    kernels.warmup(["float32", "float16"], ["sum", "max"], sources=(1, 2), gpu=True)
