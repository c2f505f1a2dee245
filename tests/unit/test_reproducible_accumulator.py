"""The exact local accumulator: its export at any agreed cut equals encoding every addend at
that cut and summing (so contents split any way across accumulators and plain contributions
give the same words), its value is the reproducible sum of its addends, and its bins survive
exponent growth (dropping only what no cut can reach). One-thread and parallel kernel forms."""

from __future__ import annotations

import numpy as np
import pytest
import reproducible_reference as ref

from bmlmpi.reproducible import MAX_ADDS, Accumulator
from bmlmpi.reproducible import format as rf

FORMS = (False, True)
CASES = (("float16", np.float16, None), ("bfloat16", np.uint16, "bfloat16"),
         ("float32", np.float32, None), ("float64", np.float64, None),
         ("complex128", np.complex128, None))


def addends(dtype, fmt: str | None, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` arrays of ``n`` values whose magnitudes grow over the sequence (so blocks' exponents
    rise between additions and bins are dropped), with cancellation, zeros and subnormals."""
    scale = np.exp2(rng.integers(-30, 30, (k, 1)) + np.arange(k)[:, None] * 2)
    values = rng.standard_normal((k, n)) * scale
    values[:, ::7] = -values[::-1, ::7]           # cancellation across addends
    values[:, 3::11] = 0.0
    values[:, 5::13] *= 2.0 ** -140                # subnormal in float32, tiny in float64
    if fmt == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    if np.dtype(dtype).kind == "c":
        return (values + 1j * values[::-1]).astype(dtype)
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def summed_words(rows: np.ndarray, agreed: np.ndarray, fmt: str | None) -> list[int]:
    """Every addend encoded at the agreed cuts and summed, as Python integers."""
    total = None
    for row in rows:
        v = ref.value_of(rf.encode(row, agreed, fmt=fmt))
        total = v if total is None else [a + b for a, b in zip(total, v, strict=True)]
    return total


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name,dtype,fmt", CASES)
def test_export_equals_every_addend_encoded_at_the_final_cut(name, dtype, fmt, parallel):
    rng = np.random.default_rng(11)
    rows = addends(dtype, fmt, 12, 700, rng)
    for trial in range(3):
        # a random split of the addends: some into an accumulator, the rest as plain
        # contributions, whose exponents raise the agreed cut above the accumulator's own
        into = rng.random(len(rows)) < 0.6
        acc = Accumulator(rows.shape[1:], dtype, fmt=fmt)
        for row in rows[into][rng.permutation(int(into.sum()))]:
            acc.add(row, parallel=parallel)
        agreed = np.max([acc.block_exponents()] + [rf.block_exponents(r, fmt=fmt)
                                                   for r in rows], axis=0)
        if trial == 2:
            top = rf.format_for(dtype, fmt)
            agreed[:, 0] = np.where(agreed[:, 0] == rf.SENTINEL, rf.SENTINEL, np.minimum(
                agreed[:, 0] + 17, top.emask - top.bias))   # another rank's far larger values
        words = acc.export(agreed, parallel=parallel)
        assert ref.value_of(words) == summed_words(rows[into], agreed, fmt)
        # with the rest encoded and added as words: the same total as all addends encoded
        total = words.copy()
        for row in rows[~into]:
            total += rf.encode(row, agreed, fmt=fmt)
        assert ref.value_of(total) == summed_words(rows, agreed, fmt)


@pytest.mark.parametrize("name,dtype,fmt", CASES)
def test_the_total_does_not_depend_on_how_addends_were_split(name, dtype, fmt):
    """Micro-batches split differently across two 'ranks' and their accumulators give the
    same decoded bits."""
    rng = np.random.default_rng(12)
    rows = addends(dtype, fmt, 10, 513, rng)
    results = set()
    for _ in range(4):
        owner = rng.integers(0, 2, len(rows))
        accs = [Accumulator(rows.shape[1:], dtype, fmt=fmt) for _ in range(2)]
        for row, r in zip(rows, owner, strict=True):
            accs[r].add(row)
        agreed = np.maximum(accs[0].block_exponents(), accs[1].block_exponents())
        words = accs[0].export(agreed) + accs[1].export(agreed)
        special = accs[0].specials() | accs[1].specials()
        out = rf.decode(words, agreed, dtype, special, fmt=fmt)
        results.add(out.tobytes())
    one = Accumulator(rows.shape[1:], dtype, fmt=fmt)
    for row in rows:
        one.add(row)
    assert results == {one.value().tobytes()}


@pytest.mark.parametrize("name,dtype,fmt", CASES)
def test_value_is_the_reproducible_sum_of_the_addends(name, dtype, fmt):
    rng = np.random.default_rng(13)
    rows = addends(dtype, fmt, 6, 300, rng)
    acc = Accumulator(rows.shape[1:], dtype, fmt=fmt)
    for row in rows:
        acc.add(row)
    agreed = np.max([rf.block_exponents(r, fmt=fmt) for r in rows], axis=0)
    special = np.bitwise_or.reduce([rf.specials(r, agreed, fmt=fmt) for r in rows])
    total = sum(rf.encode(r, agreed, fmt=fmt) for r in rows)
    want = rf.decode(total, agreed, dtype, special if agreed[:, 1].any() else None, fmt=fmt)
    assert acc.value().tobytes() == want.tobytes()


def test_specials_and_zeros():
    acc = Accumulator((4,), np.float32)
    assert acc.value().tolist() == [0.0] * 4
    acc.add(np.array([-0.0, np.inf, np.nan, -np.inf], np.float32))
    acc.add(np.array([-0.0, 1.0, 1.0, -np.inf], np.float32))
    v = acc.value()
    assert v[0] == 0 and np.signbit(v[0]) == np.False_   # starts at +0, as a zeroed buffer
    assert v[1] == np.inf and np.isnan(v[2]) and v[3] == -np.inf
    acc.add(np.array([0.0, -np.inf, 0.0, 0.0], np.float32))
    assert np.isnan(acc.value()[1])


def test_errors():
    acc = Accumulator((3, 2), np.float64)
    with pytest.raises(ValueError, match="holds"):
        acc.add(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="holds"):
        acc.add(np.zeros((3, 2), np.float32))
    acc.add(np.full((3, 2), 1e10))
    low = acc.block_exponents()
    low[:, 0] -= 1
    with pytest.raises(ValueError, match="below this accumulator"):
        acc.export(low)
    with pytest.raises(TypeError, match="integer sums"):
        Accumulator(3, np.int64)
    acc.adds = MAX_ADDS
    with pytest.raises(OverflowError):
        acc.add(np.zeros((3, 2)))
