"""Reproducible sums end to end on one process (the collective's steps without MPI: MAX of
the block exponents, the words summed by integer addition, the special bytes OR-ed, one
decode): a test per special-value rule, the accuracy bound, the issue's vectors against
numpy's own sum, invariance under grouping, permutation, segmentation and extra +0
contributions, AVG, complex, and integer-valued data summed exactly."""

from __future__ import annotations

import importlib.util
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import reproducible_reference as ref

from bmlmpi import kernels
from bmlmpi.reproducible import format as rf

ROOT = Path(__file__).resolve().parents[2]
REAL = ("float16", "float32", "float64")


def summed(rows: np.ndarray, fmt: str | None = None, order=None, extra_zeros: int = 0,
           rng: np.random.Generator | None = None) -> np.ndarray:
    """The reproducible sum of ``rows`` (contributions), their words added in ``order`` (a
    permutation) and in a random tree of partial sums when ``rng`` is given."""
    rows = np.asarray(rows)
    if extra_zeros:
        rows = np.concatenate([rows, np.zeros((extra_zeros,) + rows.shape[1:], rows.dtype)])
    order = range(len(rows)) if order is None else order
    agreed = np.max([rf.block_exponents(rows[i], fmt=fmt) for i in order], axis=0)
    parts = [rf.encode(rows[i], agreed, fmt=fmt) for i in order]
    while len(parts) > 1:
        i = int(rng.integers(0, len(parts) - 1)) if rng is not None else 0
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    special = None
    if agreed[:, 1].any():
        special = np.bitwise_or.reduce([rf.specials(rows[i], agreed, fmt=fmt) for i in order])
    return rf.decode(parts[0], agreed, rows.dtype, special, fmt=fmt)


def col(*values, dtype="float32") -> np.ndarray:
    """One position's addends as contributions of one value each."""
    return np.array(values, dtype=dtype).reshape(-1, 1)


# -- the special-value rules (format.py's docstring) -----------------------------------------

@pytest.mark.parametrize("dtype", REAL)
def test_any_nan_gives_nan(dtype):
    assert np.isnan(summed(col(1.0, np.nan, 2.0, dtype=dtype))[0])
    assert np.isnan(summed(col(np.inf, np.nan, dtype=dtype))[0])
    assert np.isnan(summed(col(-0.0, -np.nan, dtype=dtype))[0])


@pytest.mark.parametrize("dtype", REAL)
def test_opposite_infinities_give_nan(dtype):
    assert np.isnan(summed(col(np.inf, 3.0, -np.inf, dtype=dtype))[0])


@pytest.mark.parametrize("dtype", REAL)
def test_one_infinity_wins_over_finite_values(dtype):
    big = np.finfo(dtype).max
    assert summed(col(np.inf, -big, -big, dtype=dtype))[0] == np.inf
    assert summed(col(-np.inf, big, 1.0, dtype=dtype))[0] == -np.inf


@pytest.mark.parametrize("dtype", REAL)
def test_a_finite_sum_beyond_the_largest_rounds_to_infinity(dtype):
    fi = np.finfo(dtype)
    big = fi.max
    half_ulp = np.ldexp(1.0, fi.maxexp - fi.nmant - 2)   # half an ulp of the largest value
    assert summed(col(big, big, dtype=dtype))[0] == np.inf
    assert summed(col(-big, -big, dtype=dtype))[0] == -np.inf
    # max + half an ulp is a tie between max (odd) and 2^emax (even): infinity
    assert summed(col(big, half_ulp, dtype=dtype))[0] == np.inf
    # just below the tie: max
    below = np.nextafter(np.array(half_ulp, dtype), np.array(0, dtype))
    assert summed(col(big, below, dtype=dtype))[0] == big
    # overflowing partial sums that come back: the exact sum, no infinity
    assert summed(col(big, big, -big, dtype=dtype))[0] == big


@pytest.mark.parametrize("dtype", REAL)
def test_minus_zero_only_when_every_addend_is_minus_zero(dtype):
    out = summed(col(-0.0, -0.0, -0.0, dtype=dtype))
    assert out[0] == 0 and np.signbit(out[0])
    for values in ((-0.0, 0.0), (0.0, -0.0, -0.0), (1.5, -1.5), (-1.5, 1.5, -0.0)):
        out = summed(col(*values, dtype=dtype))
        assert out[0] == 0 and not np.signbit(out[0]), values
    # a rank of zeros added to -0 contributions makes +0
    rows = np.full((3, 300), -0.0, dtype)
    assert np.signbit(summed(rows)).all()
    assert not np.signbit(summed(rows, extra_zeros=1)).any()


def test_blocks_without_specials_need_no_special_bytes():
    rows = np.ones((2, 600), np.float32)
    rows[0, 400] = np.nan                  # block 1 only
    agreed = np.max([rf.block_exponents(r) for r in rows], axis=0)
    assert agreed[:, 1].tolist() == [0, 1, 0]
    assert rf.flagged(agreed, 600, "float32").tolist() == list(range(256, 512))
    out = summed(rows)
    assert np.isnan(out[400]) and (np.delete(out, 400) == 2).all()


# -- accuracy ---------------------------------------------------------------------------------

def ulp(v: float, fmt: rf.Format) -> Fraction:
    if v == 0:
        return Fraction(2) ** fmt.quantum
    e = math.frexp(abs(v))[1] - 1
    return Fraction(2) ** max(e - fmt.mbits, fmt.quantum)


@pytest.mark.parametrize("dtype", REAL)
def test_the_error_is_within_the_stated_bound(dtype):
    fmt = rf.get(dtype)
    rng = np.random.default_rng(21)
    n = 6
    lo = -6 if dtype == "float16" else -40
    hi = 4 if dtype == "float16" else 40
    rows = (rng.standard_normal((n, 1024)) * np.exp2(rng.integers(lo, hi, (n, 1024)))
            ).astype(dtype)
    out = summed(rows)
    agreed = np.max([rf.block_exponents(r) for r in rows], axis=0)
    trunc = rf.bound(n, agreed, dtype)
    for i in range(rows.shape[1]):
        exact = sum(Fraction(float(v)) for v in rows[:, i])
        err = abs(Fraction(float(out[i])) - exact)
        limit = ulp(float(out[i]), fmt) / 2 + Fraction(float(trunc[i // fmt.block]))
        assert err <= limit, (i, float(err), float(limit))
        # and the bound in the block's terms: n * 2^(E - P)
        e = int(agreed[i // fmt.block, 0])
        assert err <= ulp(float(out[i]), fmt) / 2 + n * Fraction(2) ** (e - fmt.P)


def test_integer_valued_data_is_summed_exactly():
    rng = np.random.default_rng(22)
    for dtype in REAL:
        rows = rng.integers(-1000, 1000, (9, 777)).astype(dtype)
        out = summed(rows)
        want = [math.fsum(float(v) for v in rows[:, i]) for i in range(777)]
        # the exact sums are integers of float64: one rounding to the dtype
        assert out.tobytes() == np.array(want).astype(dtype).tobytes()


def load_accuracy():
    spec = importlib.util.spec_from_file_location(
        "reproducible_accuracy", ROOT / "perf" / "reproducible" / "accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "float32", "float64"))
def test_the_issue_vectors_err_no_more_than_numpys_sum(dtype):
    """Largest and summed error over each vector (per element in perf/reproducible/README.md):
    at most numpy's; special elements by their rules."""
    acc = load_accuracy()
    for kind in acc.VECTORS:
        rows = acc.vector(kind, dtype, 8, 512)
        ours, plain = acc.errors(rows, dtype)
        assert not np.isinf(ours).any(), kind        # no special-value rule broken
        assert ours.max() <= plain.max(), kind
        assert ours.sum() <= plain.sum(), kind


# -- invariance -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,fmt", (("float16", None), ("uint16", "bfloat16"),
                                       ("float32", None), ("float64", None),
                                       ("complex64", None), ("complex128", None)))
def test_the_bits_do_not_depend_on_grouping_order_segments_or_zero_ranks(dtype, fmt):
    rng = np.random.default_rng(23)
    acc = load_accuracy()
    name = "bfloat16" if fmt else ("float32" if dtype == "complex64" else
                                  "float64" if dtype == "complex128" else dtype)
    rows = np.concatenate([acc.vector(k, name, 3, 1100, seed=5) for k in acc.VECTORS])
    if dtype.startswith("complex"):
        rows = np.ascontiguousarray(rows[:, :1100]).view(dtype)
    want = summed(rows, fmt).tobytes()
    for trial in range(6):
        order = rng.permutation(len(rows))
        got = summed(rows, fmt, order=order, extra_zeros=trial % 3, rng=rng)
        assert got.tobytes() == want, trial
    # segments encoded and decoded apart (as a pipelined or reduce-scatter schedule does)
    agreed = np.max([rf.block_exponents(r, fmt=fmt) for r in rows], axis=0)
    reals = rows.reshape(len(rows), -1).view(rf.format_for(rows.dtype, fmt).storage)
    cutpoints = sorted(set(rng.integers(0, reals.shape[1], 5).tolist()) | {0, reals.shape[1]})
    special = np.bitwise_or.reduce([rf.specials(r, agreed, fmt=fmt) for r in rows])
    pieces = []
    for lo, hi in zip(cutpoints, cutpoints[1:], strict=False):
        words = sum(rf.encode(r[lo:hi], agreed, fmt=fmt, start=lo) for r in reals)
        storage = rf.format_for(rows.dtype, fmt).storage
        pieces.append(rf.decode(words, agreed, storage, special[lo:hi], fmt=fmt, start=lo))
    assert np.concatenate(pieces).tobytes() == want


# -- AVG and complex --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", REAL)
def test_avg_is_the_decoded_sum_divided_once(dtype):
    rng = np.random.default_rng(24)
    rows = rng.standard_normal((5, 300)).astype(dtype)
    total = summed(rows)
    avg = rf.average(total.copy(), 5)
    want = total.copy()
    kernels.scale_avg(want, 5)
    assert avg.tobytes() == want.tobytes()
    assert summed(rows[::-1]).tobytes() == total.tobytes()
    with pytest.raises(ValueError, match="rank count"):
        rf.average(total, 0)


def test_avg_of_bfloat16_patterns_and_complex():
    bits = np.array([0x3F80, 0x4040, 0xC000], np.uint16)     # 1, 3, -2
    assert rf.average(bits.copy(), 2, fmt="bfloat16").tolist() == [0x3F00, 0x3FC0, 0xBF80]
    z = np.array([1 + 3j, -2 + 0.5j], np.complex128)
    assert rf.average(z.copy(), 2).tolist() == [0.5 + 1.5j, -1 + 0.25j]


def test_complex_sums_are_their_real_and_imaginary_parts_summed():
    rng = np.random.default_rng(25)
    rows = (rng.standard_normal((4, 300)) + 1j * rng.standard_normal((4, 300))) * 1e3
    out = summed(rows)
    # the real parts sit in blocks with the imaginary ones: same bits as a float64 vector of
    # the interleaved parts
    inter = np.ascontiguousarray(rows).view(np.float64)
    assert out.view(np.float64).tobytes() == summed(inter).tobytes()
    assert np.allclose(out, rows.sum(axis=0), rtol=1e-12)


def test_reference_rounding_agrees_with_ieee_where_ieee_rounds_once():
    # the test reference against numpy's own correctly rounded conversions (float64 -> 32)
    rng = np.random.default_rng(26)
    for v in rng.standard_normal(200) * np.exp2(rng.integers(-140, 120, 200)):
        assert float(np.float32(v)) == ref.rounded(Fraction(float(v)), rf.FLOAT32)
