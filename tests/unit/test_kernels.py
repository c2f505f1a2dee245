"""Reduction kernels: every CPU back end against the numpy reference semantics, for every op
and dtype; the fused form; NaN/inf; errors; the dispatch rule; the GPU helpers' host side.

Back ends: ``numpy``; ``numba-1`` and ``numba-n``, numba forced at every size in its one-thread
and its parallel form; ``auto``, the default choice. The first run compiles the numba kernels
(seconds per dtype); later runs load them from numba's on-disk cache.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest

from bmlmpi import kernels

dispatch, gpu, numpy_backend = kernels.dispatch, kernels.gpu, kernels.numpy_backend

BACKENDS = ("numpy", "numba-1", "numba-n", "auto")
OPS = ("sum", "prod", "min", "max")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64", "longdouble")
COMPLEX_DTYPES = ("complex64", "complex128", "clongdouble")
DTYPES = INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES
NUMPY_ONLY = ("longdouble", "clongdouble")  # no numba kernel: every back end runs numpy
SIZES = (0, 1, 7, 1001, 1_000_003)
UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def ops_for(dtype: str) -> tuple[str, ...]:
    return ("sum", "prod") if np.dtype(dtype).kind == "c" else OPS


def sizes(dtype: str) -> tuple[int, ...]:
    # Extended precision is slow in numpy and takes the same path under every back end.
    return SIZES[:-1] + (100_003,) if dtype in NUMPY_ONLY else SIZES


# A dtype's cases one after another: they share their operands (:func:`operands`).
CASES = [(b, d, op) for d in DTYPES for b in BACKENDS for op in ops_for(d)
         if b == "auto" or d not in NUMPY_ONLY]


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    dispatch.set_kernel_mode(None)
    if dispatch.load_numba() is not None:
        dispatch.load_numba().force_form(None)


def use_backend(name: str) -> None:
    mode, _, form = name.partition("-")
    dispatch.set_kernel_mode(mode)
    if form:
        dispatch.load_numba().force_form(form == "n")


@pytest.fixture(params=BACKENDS)
def backend(request):
    use_backend(request.param)
    return request.param


def data(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Values over the dtype's range, with the special values placed where n allows."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        out = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
        out[: min(n, 3)] = [info.min, info.max, 0][: min(n, 3)]
        return out
    real = dt.type(0).real.dtype
    finfo = np.finfo(real)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, finfo.max, finfo.smallest_subnormal,
                         -finfo.max], dtype=real)

    def part() -> np.ndarray:
        x = (rng.standard_normal(n) * 100).astype(real)
        k = min(n, specials.size)
        # Shuffled so every special meets every other across the operands of a test.
        x[:k] = rng.permutation(specials)[:k]
        return x

    if dt.kind == "c":
        return (part() + 1j * part()).astype(dt)
    return part()


@functools.lru_cache(maxsize=4)
def operands(dtype: str, seed: int, per_size: int) -> tuple[tuple[np.ndarray, ...], ...]:
    """For each of :func:`sizes`, ``per_size`` arrays of :func:`data`, drawn in that order
    from one generator seeded with ``seed``: the same values for every back end and op, so
    drawn once (a dtype's cases run together: :data:`CASES`). The tests that take them write
    only into copies. (They stay writable: numba types a read-only array apart and would
    compile every kernel again for it.)"""
    rng = np.random.default_rng(seed)
    return tuple(tuple(data(dtype, n, rng) for _ in range(per_size)) for n in sizes(dtype))


def expected(dst: np.ndarray, srcs: list[np.ndarray], op: str) -> np.ndarray:
    """The documented semantics: left-to-right pairwise folds; float16 fused in float32."""
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


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    # The same bits are the same values (NaN where NaN), so they pass at a memory compare's
    # cost; anything else gets numpy's element-wise check (equal values, NaN at the same
    # places, signed zeros alike) and its report of where they differ.
    if got.tobytes() == want.tobytes():
        return
    np.testing.assert_array_equal(got, want, strict=True)


def assert_matches(got: np.ndarray, dst: np.ndarray, srcs: list[np.ndarray], op: str) -> None:
    """Bit-for-bit, except complex PROD: numpy's loops use fused multiply-adds where the CPU
    has them and numba does not, so those may differ by rounding. There the non-finite
    pattern must be the same and each finite result within 2 ulp per multiplication of
    the product of the magnitudes (a bound that holds through cancellation)."""
    want = expected(dst, srcs, op)
    if not (op == "prod" and dst.dtype.kind == "c"):
        assert_same(got, want)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    for part in ("real", "imag"):
        g, w = getattr(got, part), getattr(want, part)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))
    with np.errstate(all="ignore"):
        mag = np.abs(dst) * np.prod([np.abs(s) for s in srcs], axis=0)
        finite = np.isfinite(got) & np.isfinite(want)
        err = np.abs(got - want)
    eps = np.finfo(got.real.dtype).eps
    bound = 2 * len(srcs) * eps * mag
    ok = (err == 0) | (err <= bound)  # a 0 * inf magnitude gives a NaN bound: equal then
    assert np.all(ok[finite]), "complex PROD off by more than rounding"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend_name,dtype,op", CASES)
def test_pairwise_matches_reference(backend_name, dtype, op):
    use_backend(backend_name)
    for dst, src in operands(dtype, 1, 2):
        got = dst.copy()
        kernels.reduce_into(got, src, op)
        assert_matches(got, dst, [src], op)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend_name,dtype,op", CASES)
def test_fused_two_sources_matches_pairwise(backend_name, dtype, op):
    use_backend(backend_name)
    for dst, *srcs in operands(dtype, 2, 3):
        got = dst.copy()
        kernels.reduce_many_into(got, srcs, op)
        assert_matches(got, dst, srcs, op)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("nsrc", [1, 3, 5])
@pytest.mark.parametrize("dtype", ["int32", "float16", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_fused_many_sources_matches_repeated_pairwise_calls(backend, dtype, op, nsrc):
    rng = np.random.default_rng(3)
    dst = data(dtype, 4099, rng)
    srcs = [data(dtype, 4099, rng) for _ in range(nsrc)]
    fused = dst.copy()
    kernels.reduce_many_into(fused, srcs, op)
    if dtype == "float16" and nsrc > 1:
        want = expected(dst, srcs, op)  # accumulated in float32, rounded once
    else:
        want = dst.copy()
        for s in srcs:
            kernels.reduce_into(want, s, op)
    assert_same(fused, want)


def test_fused_with_no_sources_leaves_dst_alone(backend):
    dst = np.arange(5.0)
    kernels.reduce_many_into(dst, [], "sum")
    assert_same(dst, np.arange(5.0))


# -- combine_into: out = a op b in one pass (the executor's reduction of a range holding input) --

@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend_name,dtype,op", CASES)
def test_combine_matches_copy_then_reduce(backend_name, dtype, op):
    use_backend(backend_name)
    for a, b in operands(dtype, 11, 2):
        n = a.size
        out = np.full_like(a, 3)  # garbage the result must not depend on
        kernels.combine_into(out, a, b, op)
        assert_matches(out, a, [b], op)
        trusted = np.full_like(a, 5)
        kernels.combine.combine_trusted(trusted, a, b, op)
        assert_same(trusted, out)
        if n:
            folded = a.copy()
            kernels.combine.reduce_trusted(folded, [b], op)
            assert_matches(folded, a, [b], op)


def test_combine_takes_read_only_inputs_and_refuses_bad_arguments(backend):
    ro = _readonly(70_000)
    out = np.zeros(70_000)
    kernels.combine_into(out, ro, ro, "sum")
    assert_same(out, np.full(70_000, 2.0))
    kernels.combine_into(out, out, ro, "sum")  # out is a source exactly: fine element-wise
    assert_same(out, np.full(70_000, 3.0))
    x = np.arange(10.0)
    with pytest.raises(ValueError, match="overlap"):
        kernels.combine_into(x[1:], x[:-1], np.ones(9), "sum")
    with pytest.raises(ValueError, match="read-only"):
        kernels.combine_into(_readonly(4), np.ones(4), np.ones(4), "sum")
    with pytest.raises(ValueError, match="shape"):
        kernels.combine_into(np.ones(4), np.ones(5), np.ones(4), "sum")
    with pytest.raises(TypeError, match="complex"):
        kernels.combine_into(np.ones(4, complex), np.ones(4, complex), np.ones(4, complex),
                             "max")


def test_kernels_take_mpis_ops_and_name_theirs_for_other_objects():
    """``reduce_into(a, b, MPI.SUM)``, as a user of mpi4py writes it, reduces like "sum"; an op
    the kernels do not have (MPI.LAND, bmlmpi.AVG, a number) is a TypeError naming theirs."""
    from mpi4py import MPI

    import bmlmpi

    a, b = np.arange(6.0), np.arange(6.0)[::-1].copy()
    for mpi_op, name in ((MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"),
                         (MPI.MAX, "max")):
        got, want = a.copy(), a.copy()
        kernels.reduce_into(got, b, mpi_op)
        kernels.reduce_into(want, b, name)
        assert_same(got, want)
        out = np.empty_like(a)
        kernels.combine_into(out, a, b, mpi_op)
        assert_same(out, want)
        many = a.copy()
        kernels.reduce_many_into(many, [b, b], mpi_op)
        kernels.reduce_many_into(want, [b], name)
        assert_same(many, want)
    for bad in (MPI.LAND, bmlmpi.AVG, 3):
        with pytest.raises(TypeError, match=r"'sum', 'prod', 'min', 'max' or MPI.SUM"):
            kernels.reduce_into(a.copy(), b, bad)
        with pytest.raises(TypeError, match=r"MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX"):
            kernels.combine_into(np.empty_like(a), a, b, bad)
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        kernels.reduce_into(a.copy(), b, "mean")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "longdouble"])
def test_min_max_propagate_nan_and_order_infinities(backend, dtype):
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, inf, -inf, 1.0, -inf, 2.0], dtype)
    b = np.array([1.0, nan, nan, 1.0, 1.0, -inf, inf, -3.0], dtype)
    lo, hi = a.copy(), a.copy()
    kernels.reduce_into(lo, b, "min")
    kernels.reduce_into(hi, b, "max")
    assert_same(lo, np.array([nan, nan, nan, 1.0, -inf, -inf, -inf, -3.0], dtype))
    assert_same(hi, np.array([nan, nan, nan, inf, 1.0, 1.0, inf, 2.0], dtype))
    fused = a.copy()
    kernels.reduce_many_into(fused, [b, np.full(8, 0.5, dtype)], "min")
    assert_same(fused, np.array([nan, nan, nan, 0.5, -inf, -inf, -inf, -3.0], dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_infinities_in_sum_and_prod(backend, dtype):
    inf = np.inf
    a = np.array([inf, inf, -inf, inf, 0.0], dtype)
    b = np.array([1.0, -inf, -inf, 0.0, inf], dtype)
    s, p = a.copy(), a.copy()
    kernels.reduce_into(s, b, "sum")
    kernels.reduce_into(p, b, "prod")
    assert_same(s, np.array([inf, np.nan, -inf, inf, inf], dtype))
    assert_same(p, np.array([inf, -inf, inf, np.nan, np.nan], dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float16_sum_overflows_to_inf_and_fused_accumulates_in_float32(backend):
    big = np.array([60000.0, 1.0], np.float16)
    dst = big.copy()
    kernels.reduce_into(dst, big, "sum")
    assert_same(dst, np.array([np.inf, 2.0], np.float16))
    # 2048 + 1 + 1 rounds to 2048 twice pairwise in float16 but is 2050 in float32.
    dst = np.array([2048.0], np.float16)
    kernels.reduce_many_into(dst, [np.ones(1, np.float16)] * 2, "sum")
    assert_same(dst, np.array([2050.0], np.float16))


def _wrap(v: int, dtype: np.dtype) -> int:
    bits = 8 * dtype.itemsize
    v %= 1 << bits
    return v - (1 << bits) if dtype.kind == "i" and v >= 1 << (bits - 1) else v


def test_integer_overflow_wraps(backend):
    py = {"sum": lambda x, y: x + y, "prod": lambda x, y: x * y, "max": max, "min": min}
    cases = [
        ("int8", [127, -128, 5], [1, -1, 7], "sum", [-128, 127, 12]),
        ("uint8", [255, 0, 9], [1, 255, 9], "sum", [0, 255, 18]),
        ("int16", [300, -300, 3], [300, 300, -3], "prod", [24464, -24464, -9]),
        ("int64", [2**63 - 1, -(2**63), 0], [1, -1, 0], "sum", [-(2**63), 2**63 - 1, 0]),
        ("uint64", [2**64 - 1, 2**63, 3], [2, 2, 3], "prod", [2**64 - 2, 0, 9]),
        ("uint32", [2**32 - 1, 5, 0], [2**32 - 1, 3, 1], "max", [2**32 - 1, 5, 1]),
        ("int32", [-(2**31), 5, 0], [2**31 - 1, 3, -1], "min", [-(2**31), 3, -1]),
    ]
    for dtype, a, b, op, want in cases:
        dt = np.dtype(dtype)
        dst = np.array(a, dt)
        kernels.reduce_into(dst, np.array(b, dt), op)
        assert_same(dst, np.array(want, dt))
        # Fused a op b op b, modelled with Python integers wrapped after every step.
        dst = np.array(a, dt)
        kernels.reduce_many_into(dst, [np.array(b, dt)] * 2, op)
        model = [_wrap(py[op](_wrap(py[op](x, y), dt), y), dt) for x, y in zip(a, b, strict=True)]
        assert_same(dst, np.array(model, dt))


# -- scale_avg ---------------------------------------------------------------------------------

def test_scale_avg_floors_integers(backend):
    for dtype in ("int8", "int32", "int64"):
        dst = np.array([-3, 3, -4, 0, -1, 7], dtype)
        kernels.scale_avg(dst, 2)
        assert_same(dst, np.array([-2, 1, -2, 0, -1, 3], dtype))
    dst = np.array([2**64 - 1, 5], np.uint64)
    kernels.scale_avg(dst, 3)
    assert_same(dst, np.array([(2**64 - 1) // 3, 1], np.uint64))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend_name,dtype",
                         list(dict.fromkeys((b, d) for b, d, _ in CASES)))
def test_scale_avg_matches_reference(backend_name, dtype):
    use_backend(backend_name)
    for per_size in operands(dtype, 4, 3):
        for ranks, dst in zip((1, 3, 12), per_size, strict=True):
            dst = dst.copy()
            want = dst.copy()
            numpy_backend.scale_avg(want, ranks)
            kernels.scale_avg(dst, ranks)
            assert_same(dst, want)


def test_scale_avg_of_a_float_sum_is_the_mean(backend):
    rng = np.random.default_rng(5)
    parts = [rng.integers(-50, 50, 300).astype(np.float32) for _ in range(3)]
    dst = parts[0].copy()
    kernels.reduce_many_into(dst, parts[1:], "sum")
    kernels.scale_avg(dst, 3)
    np.testing.assert_allclose(dst, np.mean(parts, axis=0), rtol=1e-6)


def test_scale_avg_rejects_bad_counts():
    with pytest.raises(ValueError, match="at least 1"):
        kernels.scale_avg(np.ones(3), 0)
    with pytest.raises(TypeError, match="integer"):
        kernels.scale_avg(np.ones(3), 2.0)
    with pytest.raises(ValueError, match="read-only"):
        kernels.scale_avg(_readonly(3), 2)


def _readonly(n: int) -> np.ndarray:
    a = np.ones(n)
    a.setflags(write=False)
    return a


# -- layouts, overlap, shapes --------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sum", "max"])
def test_layouts(backend, op):
    rng = np.random.default_rng(6)
    base = rng.standard_normal((64, 48)).astype(np.float32)
    other = rng.standard_normal((64, 48)).astype(np.float32)
    cases = [
        (base.copy(), other.copy()),                         # C and C
        (np.asfortranarray(base), np.asfortranarray(other)),  # F and F
        (base.copy(), np.asfortranarray(other)),              # C and F: element order differs
        (base.copy()[::2, 1::3], other[1::2, ::3]),           # strided views
        (np.array(base[0, 0]), np.array(other[0, 0])),        # zero-dimensional
    ]
    for dst, src in cases:
        want = expected(dst, [src], op)
        kernels.reduce_into(dst, src, op)
        assert_same(dst, want)
        dst2 = dst.copy(order="K")
        want2 = expected(dst2, [src, src], op)
        kernels.reduce_many_into(dst2, [src, src], op)
        assert_same(dst2, want2)


def test_partial_overlap_behaves_like_a_copied_source(backend):
    x = np.arange(1.0, 200_001.0)
    want = x[1:] + x[:-1]
    kernels.reduce_into(x[1:], x[:-1], "sum")
    assert_same(x[1:], want)
    y = np.arange(10.0)
    kernels.reduce_into(y, y, "sum")  # the same memory exactly: fine element-wise
    assert_same(y, 2 * np.arange(10.0))


def test_read_only_sources_are_fine(backend):
    ro = _readonly(70_000)
    dst = np.zeros(70_000)
    kernels.reduce_into(dst, ro, "sum")
    kernels.reduce_many_into(dst, [ro, np.ones(70_000), ro], "sum")
    assert_same(dst, np.full(70_000, 4.0))


# -- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", COMPLEX_DTYPES)
@pytest.mark.parametrize("op", ["min", "max"])
def test_complex_min_max_raise_type_error(backend, dtype, op):
    a = np.ones(4, dtype)
    with pytest.raises(TypeError, match="complex"):
        kernels.reduce_into(a, a.copy(), op)
    with pytest.raises(TypeError, match="complex"):
        kernels.reduce_many_into(a, [a.copy(), a.copy()], op)


def test_read_only_dst_raises(backend):
    with pytest.raises(ValueError, match="read-only"):
        kernels.reduce_into(_readonly(4), np.ones(4), "sum")
    with pytest.raises(ValueError, match="read-only"):
        kernels.reduce_many_into(_readonly(4), [np.ones(4)] * 2, "sum")


def test_mismatched_shapes_raise(backend):
    with pytest.raises(ValueError, match="shape"):
        kernels.reduce_into(np.ones(4), np.ones(5), "sum")
    with pytest.raises(ValueError, match="shape"):
        kernels.reduce_into(np.ones((2, 3)), np.ones((3, 2)), "sum")
    with pytest.raises(ValueError, match="shape"):
        kernels.reduce_many_into(np.ones(4), [np.ones(4), np.ones(3)], "sum")


def test_bad_dtypes_and_ops_raise(backend):
    with pytest.raises(TypeError, match="dtype"):
        kernels.reduce_into(np.ones(4, np.float32), np.ones(4, np.float64), "sum")
    with pytest.raises(TypeError, match="dtype"):
        kernels.reduce_into(np.ones(4, bool), np.ones(4, bool), "sum")
    with pytest.raises(ValueError, match="unknown reduction op"):
        kernels.reduce_into(np.ones(4), np.ones(4), "avg")
    with pytest.raises(TypeError, match="numpy array or a device array"):
        kernels.reduce_into([1.0, 2.0], np.ones(2), "sum")
    with pytest.raises(TypeError, match="host"):
        kernels.reduce_into(np.ones(2), [1.0, 2.0], "sum")


def test_kernel_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("BMLMPI_KERNEL", "numba")
    dispatch.set_kernel_mode(None)
    assert dispatch.kernel_mode() == "numba"
    monkeypatch.setenv("BMLMPI_KERNEL", "fortran")
    dispatch.set_kernel_mode(None)
    with pytest.raises(ValueError, match="BMLMPI_KERNEL"):
        kernels.reduce_into(np.ones(4), np.ones(4), "sum")
    with pytest.raises(ValueError, match="BMLMPI_KERNEL"):
        kernels.set_kernel_mode("fortran")


# -- dispatch rule, threads, warmup, import ----------------------------------------------------

def test_dispatch_rule(monkeypatch):
    nb = dispatch.load_numba()
    dispatch.set_kernel_mode("auto")
    f32 = np.ones(dispatch.PARALLEL_MIN_BYTES // 4, np.float32)
    mid = np.ones(dispatch.NUMBA_FUSED_MIN_BYTES // 4, np.float32)
    small = np.ones(dispatch.NUMBA_FUSED_MIN_BYTES // 4 - 1, np.float32)
    half = np.ones(3, np.float16)
    assert kernels.cpu_backend(half, [half]) == "numba"          # float16: any size
    assert kernels.cpu_backend(mid, [mid, mid]) == "numba"       # fused, large enough
    assert kernels.cpu_backend(small, [small, small]) == "numpy"
    monkeypatch.setattr(nb, "_threads", 2)
    assert kernels.cpu_backend(small, [small]) == "numpy"        # pairwise, below 1 MiB
    assert kernels.cpu_backend(f32, [f32]) == "numba"            # pairwise, threads pay
    monkeypatch.setattr(nb, "_threads", 1)
    assert kernels.cpu_backend(f32, [f32]) == "numpy"            # one thread: numpy as fast
    ld = np.ones(1 << 18, np.longdouble)
    assert kernels.cpu_backend(ld, [ld, ld]) == "numpy"
    big = np.ones((512, 512))
    assert kernels.cpu_backend(big, [np.asfortranarray(big)] * 2) == "numpy"
    x = np.ones(1 << 18)
    assert kernels.cpu_backend(x[1:], [x[:-1], x[:-1]]) == "numpy"
    dispatch.set_kernel_mode("numba")
    assert kernels.cpu_backend(small, [small]) == "numba"
    dispatch.set_kernel_mode("numpy")
    assert kernels.cpu_backend(half, [half]) == "numpy"


def test_dispatch_calls_the_chosen_backend(monkeypatch):
    nb = dispatch.load_numba()
    seen = []
    monkeypatch.setattr(nb, "reduce_many_into", lambda d, s, op: seen.append("numba"))
    monkeypatch.setattr(numpy_backend, "reduce_many_into", lambda d, s, op: seen.append("numpy"))
    dispatch.set_kernel_mode("auto")
    kernels.reduce_into(np.ones(8), np.ones(8), "sum")
    kernels.reduce_many_into(np.ones(1 << 17), [np.ones(1 << 17)] * 2, "sum")
    assert seen == ["numpy", "numba"]


def test_thread_count_follows_ranks_per_node(monkeypatch):
    nb = dispatch.load_numba()
    monkeypatch.delenv("BMLMPI_KERNEL_THREADS", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64")
    assert nb._default_threads() == 1
    monkeypatch.setenv("BMLMPI_KERNEL_THREADS", "1")
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
    assert nb._default_threads() == 1
    monkeypatch.setenv("BMLMPI_KERNEL_THREADS", "many")
    with pytest.raises(ValueError, match="BMLMPI_KERNEL_THREADS"):
        nb._default_threads()
    with pytest.raises(ValueError, match="positive"):
        kernels.set_threads(0)
    before = nb.threads()
    try:
        kernels.set_threads(1)
        dst = np.zeros(1 << 17)
        kernels.reduce_into(dst, np.ones(1 << 17), "sum")
        assert_same(dst, np.ones(1 << 17))
    finally:
        nb.set_threads(before)


def test_warmup_checks_its_arguments_and_compiles():
    kernels.warmup(["float32", "complex64"], ["sum", "max"], sources=(1, 2))
    with pytest.raises(ValueError, match="unknown reduction op"):
        kernels.warmup(["float32"], ["mean"])
    with pytest.raises(ValueError, match="at least 1"):
        kernels.warmup(["float32"], sources=(0,))


def test_importing_bmlmpi_does_not_import_numba():
    code = ("import sys, bmlmpi, bmlmpi.kernels; "
            "sys.exit(1 if 'numba' in sys.modules or 'cupy' in sys.modules else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


# -- GPU helpers, host side (no GPU needed) ----------------------------------------------------

class FakeDeviceArray:
    """Has the attributes a CUDA array exposes, and nothing behind them."""

    def __init__(self, n: int = 4):
        self.shape, self.dtype = (n,), np.dtype(np.float32)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": "<f4",
                                         "data": (0, False), "version": 3}


class FakeDLPack:
    def __init__(self, device_type: int):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_device_array_detection():
    assert not gpu.is_device_array(np.ones(3))
    assert not gpu.is_device_array([1, 2])
    assert gpu.is_device_array(FakeDeviceArray())
    assert gpu.is_device_array(FakeDLPack(2))       # kDLCUDA
    assert gpu.is_device_array(FakeDLPack(13))      # kDLCUDAManaged
    assert not gpu.is_device_array(FakeDLPack(1))   # kDLCPU


def test_mixing_host_and_device_arrays_raises():
    with pytest.raises(TypeError, match="host"):
        kernels.reduce_into(np.ones(4, np.float32), FakeDeviceArray(), "sum")


def test_device_array_without_cupy_says_what_to_install():
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed")
    with pytest.raises(ImportError, match="cupy"):
        kernels.reduce_into(FakeDeviceArray(), FakeDeviceArray(), "sum")
    with pytest.raises(ImportError, match="cupy"):
        gpu.to_host_staging(FakeDeviceArray())


def test_cuda_aware_override(monkeypatch):
    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "1")
    assert gpu.cuda_aware_mpi() is True
    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "0")
    assert gpu.cuda_aware_mpi() is False
    monkeypatch.setenv("BMLMPI_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="BMLMPI_CUDA_AWARE"):
        gpu.cuda_aware_mpi()


def test_cuda_aware_detection_asks_the_loaded_mpi(monkeypatch):
    monkeypatch.delenv("BMLMPI_CUDA_AWARE", raising=False)
    from mpi4py import MPI

    lib = gpu._loaded_mpi_library()
    assert lib is not None, "mpi4py's MPI library was not found in the process"
    answer = gpu.cuda_aware_mpi()
    assert isinstance(answer, bool)
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None and MPI.Is_initialized():
        assert answer == bool(query())


def test_stage_passes_host_buffers_through():
    from mpi4py import MPI

    send, recv = np.ones(4), np.zeros(4)
    st = gpu.stage(send, recv)
    assert st.host_send is send and st.host_recv is recv and not st.on_device
    st.finish()
    st = gpu.stage(MPI.IN_PLACE, [recv, MPI.DOUBLE])
    assert st.host_send is MPI.IN_PLACE and st.host_recv[0] is recv


def test_non_native_byte_order_is_reduced_correctly(backend):
    a = np.arange(100_000, dtype=">f8")
    b = np.ones(100_000, dtype=">f8")
    kernels.reduce_many_into(a, [b, b], "sum")
    np.testing.assert_array_equal(a, np.arange(100_000.0) + 2)


def test_bench_writes_results_for_every_backend(tmp_path, capsys):
    from bmlmpi.kernels import bench

    assert bench.parse_sizes("4K:256M") == [4096 * 4**i for i in range(9)]
    assert bench.parse_sizes("4K,1M") == [4096, 1 << 20]
    out_json, out_md = tmp_path / "k.json", tmp_path / "k.md"
    rc = bench.main(["--sizes", "4K,16K", "--dtype", "float16,int32", "--op", "max",
                     "--sources", "2", "--repeat", "1", "--min-time", "0.001", "--no-gpu",
                     "--json", str(out_json), "--markdown", str(out_md)])
    assert rc == 0
    import json

    res = json.loads(out_json.read_text())
    assert res["machine"]["cpu_model"] and res["machine"]["numpy"] == np.__version__
    kernels_seen = {(r["kernel"], r["dtype"], r["bytes"]) for r in res["rows"]}
    for k in ("triad_numpy", "numpy", "numba-1", "numba-n", "auto"):
        for dt in ("float16", "int32"):
            assert (k, dt, 4096) in kernels_seen and (k, dt, 16384) in kernels_seen
    for r in res["rows"]:
        assert r["bytes_moved"] == (3 if r["kernel"].startswith("triad") else 4) * r["bytes"]
        assert r["gb_per_s"] > 0 and r["best_s"] <= r["median_s"]
    assert "| 16 KiB |" in out_md.read_text()
    with pytest.raises(SystemExit):
        bench.main(["--backends", "fortran"])


def test_sweep_device_option_without_a_gpu_says_so():
    if gpu.gpu_available():
        pytest.skip("a GPU is visible here")
    from bmlmpi.cli import bench

    to_device, to_host = bench.device_buffers("host")
    a = np.arange(3.0)
    assert to_device(a) is a and to_host(a) is a
    with pytest.raises(SystemExit, match="-d cuda needs cupy"):
        bench.device_buffers("cuda")
