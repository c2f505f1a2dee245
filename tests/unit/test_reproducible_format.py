"""The reproducible format's kernels against the reference in tests/reproducible_reference.py
(Python integers and Fractions), in the numba kernels' one-thread and parallel forms: block
exponents and flags, encode (one and two words), the special bytes, decode's rounding
(random integers and cuts; ties, subnormals, overflow), the errors."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import reproducible_reference as ref

from bmlmpi.kernels import wire_formats
from bmlmpi.reproducible import format as rf

FORMATS = ("float16", "bfloat16", "float32", "float64")
FORMS = (False, True)  # one-thread, parallel


def random_bits(fmt: rf.Format, n: int, rng: np.random.Generator, specials: bool = True
                ) -> np.ndarray:
    """Values of ``fmt`` (its storage dtype) with every kind of bit pattern: random patterns
    (normal, subnormal, zero, inf, NaN, both signs), and runs of values of nearby exponents."""
    raw = rng.integers(0, 1 << fmt.nbits, n, dtype=np.uint64).astype(fmt.bits)
    # half the values from a narrow exponent range, so that blocks hold many comparable ones
    e = rng.integers(fmt.bias - 3, fmt.bias + 3, n).astype(np.uint64)
    near = ((e << np.uint64(fmt.mbits)) | (raw.astype(np.uint64) & np.uint64(
        (1 << fmt.mbits) - 1)) | (raw.astype(np.uint64) & np.uint64(1 << (fmt.nbits - 1))))
    raw = np.where(rng.random(n) < 0.5, near.astype(fmt.bits), raw)
    small = rng.random(n) < 0.1   # subnormals and zeros
    raw[small] &= fmt.bits.type((1 << fmt.mbits) - 1 | (1 << (fmt.nbits - 1)))
    if not specials:
        exp = (raw.astype(np.uint64) >> np.uint64(fmt.mbits)) & np.uint64(fmt.emask)
        raw[exp == fmt.emask] = 0
    return raw.view(fmt.storage)


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_block_exponents_and_flags_match_the_reference(name, parallel):
    fmt = rf.get(name)
    rng = np.random.default_rng(1)
    for n in (1, 255, 256, 257, 1000):
        x = random_bits(fmt, n, rng)
        got = rf.block_exponents(x, fmt="bfloat16" if name == "bfloat16" else None,
                                 parallel=parallel)
        np.testing.assert_array_equal(got, ref.block_exponents(x, fmt))
    # a block of zeros only: the sentinel; a -0: flagged
    zeros = np.zeros(300, fmt.storage)
    assert rf.block_exponents(zeros, fmt=name).tolist() == [[rf.SENTINEL, 0]] * 2
    zeros.view(fmt.bits)[260] = 1 << (fmt.nbits - 1)   # -0
    assert rf.block_exponents(zeros, fmt=name)[1].tolist() == [rf.SENTINEL, 1]


def agreed_above(x: np.ndarray, fmt: rf.Format, rng: np.random.Generator) -> np.ndarray:
    """An agreed array as the MAX with other ranks' exponents: some blocks raised."""
    agreed = rf.block_exponents(x, fmt=fmt.name)
    raise_by = rng.integers(0, 30, agreed.shape[0]) * (rng.random(agreed.shape[0]) < 0.5)
    e = agreed[:, 0].astype(np.int64)
    e = np.where(e == rf.SENTINEL, np.where(raise_by > 0, 1 + raise_by, rf.SENTINEL),
                 e + raise_by)
    agreed[:, 0] = np.minimum(e, fmt.emask - fmt.bias)   # the largest exponent there is
    agreed[:, 1] |= (rng.random(agreed.shape[0]) < 0.2).astype(np.int16)
    return agreed


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_encode_truncates_at_the_agreed_cut_exactly(name, parallel):
    fmt = rf.get(name)
    rng = np.random.default_rng(2)
    for n in (1, 256, 700):
        x = random_bits(fmt, n, rng)
        agreed = agreed_above(x, fmt, rng)
        words = rf.encode(x, agreed, fmt=name, parallel=parallel)
        t = ref.encode(x, agreed, fmt)
        if fmt.words == 1:
            assert words.shape == (n,)
            assert [int(v) for v in words] == t
        else:
            assert words.shape == (n, 2)
            assert [tuple(int(v) for v in row) for row in words] == [ref.split(v) for v in t]
        assert all(abs(v) < 2 ** (fmt.P + fmt.W) for v in t)


@pytest.mark.parametrize("name", FORMATS)
def test_encode_and_decode_of_a_segment_use_its_global_blocks(name):
    fmt = rf.get(name)
    rng = np.random.default_rng(3)
    x = random_bits(fmt, 1000, rng, specials=False)
    agreed = agreed_above(x, fmt, rng)
    agreed[:, 1] = 0
    whole = rf.encode(x, agreed, fmt=name)
    for lo, hi in ((0, 1), (100, 300), (256, 512), (511, 1000), (999, 1000), (300, 300)):
        part = rf.encode(x[lo:hi], agreed, fmt=name, start=lo)
        np.testing.assert_array_equal(part, whole[lo:hi])
        back = rf.decode(part, agreed, fmt.storage, fmt=name, start=lo)
        np.testing.assert_array_equal(back.view(fmt.bits),
                                      rf.decode(whole, agreed, fmt.storage, fmt=name)
                                      [lo:hi].view(fmt.bits))


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_special_bytes_match_the_reference(name, parallel):
    fmt = rf.get(name)
    rng = np.random.default_rng(4)
    x = random_bits(fmt, 900, rng)
    agreed = agreed_above(x, fmt, rng)
    got = rf.specials(x, agreed, fmt=name, parallel=parallel)
    assert got.tolist() == ref.specials(x, agreed, fmt)
    pos = rf.flagged(agreed, 900, fmt)
    assert pos.tolist() == [i for i in range(900) if agreed[i // fmt.block, 1]]


def random_words(fmt: rf.Format, n: int, rng: np.random.Generator) -> np.ndarray:
    """Integer sums of every size a decode meets: up to 2^63 per word, with exact ties and
    values just beside them."""
    bits = rng.integers(0, 64 if fmt.words == 1 else 63, n)
    mag = (rng.integers(0, 1 << 62, n, dtype=np.int64) >> np.maximum(62 - bits, 0))
    tie_at = rng.integers(1, 40, n)
    ties = (rng.integers(0, 1 << 20, n, dtype=np.int64) << tie_at) | (np.int64(1) << (
        tie_at - 1))
    mag = np.where(rng.random(n) < 0.3, ties + rng.integers(-1, 2, n), mag)
    sign = np.where(rng.random(n) < 0.5, -1, 1)
    if fmt.words == 1:
        return (sign * mag).astype(np.int64)
    return np.stack([sign * (mag >> np.int64(rng.integers(0, 40))),
                     rng.integers(-(1 << 40), 1 << 40, n)], axis=1).astype(np.int64)


def cut_range(fmt: rf.Format) -> tuple[int, int]:
    """Exponents E from the smallest subnormal's to the largest value's (end excluded)."""
    return fmt.quantum + 1, fmt.emask - fmt.bias + 1


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_decode_rounds_as_fractions_do(name, parallel):
    fmt = rf.get(name)
    rng = np.random.default_rng(5)
    lo, hi = cut_range(fmt)
    for trial in range(4):
        n = 4 * fmt.block
        words = random_words(fmt, n, rng)
        agreed = np.zeros((4, 2), np.int16)
        # cuts across the range, and some placing the sums at the subnormals and at overflow
        agreed[:, 0] = rng.integers(lo, hi, 4)
        agreed[0, 0] = fmt.quantum + 1 + 5 * trial
        agreed[1, 0] = max(fmt.emask - fmt.bias - 20 * trial, fmt.quantum + 1)
        out = rf.decode(words, agreed, fmt.storage, fmt=name, parallel=parallel)
        values = ref.value_of(words)
        got = ref.reals(out, fmt)
        for i in range(n):
            c = ref.cut(int(agreed[i // fmt.block, 0]), fmt)
            want = ref.decode_one(values[i], c, 0, False, fmt)
            assert ref.same(got[i], want), (name, i, values[i], c, got[i], want)


def test_decode_ties_go_to_even_and_overflow_to_infinity():
    fmt = rf.FLOAT32
    agreed = np.array([[24 + 32, 0]], np.int16)   # E = 56: cut 24, so V * 2^24
    c = ref.cut(56, fmt)
    assert c == 24
    # float32 keeps 24 bits: V = 2^24 + 1 and 2^25 + 2 are ties (to the even neighbour), 2^25 + 6
    # a tie to the odd side's upper neighbour, 2^25 + 1 and 2^25 + 3 below and above half
    words = np.array([(1 << 24) + 1, (1 << 25) + 1, (1 << 25) + 3, (1 << 25) + 2, 0,
                      -((1 << 25) + 1), (1 << 25) + 6], np.int64)
    out = rf.decode(words, agreed, np.float32)
    scale = 2.0 ** c
    assert out.tolist() == [(1 << 24) * scale, (1 << 25) * scale, ((1 << 25) + 4) * scale,
                            (1 << 25) * scale, 0.0, -(1 << 25) * scale, ((1 << 25) + 8) * scale]
    assert math.copysign(1, out[4]) == 1
    # float32's largest value is (2^24 - 1) * 2^104; half an ulp above it rounds to inf
    big = np.array([[128, 0]], np.int16)
    cb = ref.cut(int(big[0, 0]), fmt)
    top = (2 ** 24 - 1) * 2 ** 104
    half = 2 ** 103
    words = np.array([top >> cb, (top + half) >> cb, (top + half - 2 ** cb) >> cb], np.int64)
    out = rf.decode(words, big, np.float32)
    assert out[0] == np.finfo(np.float32).max
    assert out[1] == np.inf
    assert out[2] == np.finfo(np.float32).max


def test_decode_reaches_the_subnormals_exactly():
    for fmt in (rf.FLOAT16, rf.FLOAT32, rf.FLOAT64):
        q = fmt.quantum
        # every multiple of the quantum below the normals decodes to itself
        e = q + fmt.mbits + 1          # |x| < 2^e covers the subnormals
        agreed = np.array([[e, 0]], np.int16)
        c = ref.cut(e, fmt)
        assert c < q
        k = np.arange(-(1 << fmt.mbits) + 1, 1 << fmt.mbits, max(1, (1 << fmt.mbits) // 100))
        v = [int(i) << (q - c) for i in k]
        words = np.array(v, np.int64) if fmt.words == 1 else np.array(
            [ref.split(t) for t in v], np.int64)
        out = rf.decode(words, agreed, fmt.storage)
        assert [Fraction(float(o)) for o in out] == [Fraction(int(i)) * Fraction(2) ** q
                                                     for i in k]


def test_errors_are_clear():
    x = np.ones(300, np.float32)
    agreed = rf.block_exponents(x)
    with pytest.raises(ValueError, match="agreed exponent"):
        low = agreed.copy()
        low[1, 0] -= 1
        rf.encode(x, low)
    with pytest.raises(ValueError, match="int16 of shape"):
        rf.encode(x, agreed.astype(np.int32))
    for e, flag in ((129, 0), (-149, 0), (rf.SENTINEL + 1, 0), (3, 2)):
        wrong = agreed.copy()
        wrong[0] = e, flag
        with pytest.raises(ValueError, match="no float32 array gives"):
            rf.decode(np.zeros(300, np.int64), wrong, np.float32)
    with pytest.raises(ValueError, match="blocks"):
        rf.encode(x, agreed[:1])
    with pytest.raises(TypeError, match="integer sums are reproducible"):
        rf.block_exponents(np.ones(3, np.int32))
    with pytest.raises(TypeError, match="bfloat16"):
        rf.block_exponents(np.ones(3, np.uint16))
    with pytest.raises(TypeError, match="takes uint16"):
        rf.block_exponents(x, fmt="bfloat16")
    with pytest.raises(ValueError, match="unknown reproducible format"):
        rf.get("float8")
    flagged = agreed.copy()
    flagged[0, 1] = 1
    with pytest.raises(ValueError, match="special bytes"):
        rf.decode(rf.encode(x, flagged), flagged, np.float32)
    with pytest.raises(ValueError, match="words must be int64"):
        rf.decode(np.zeros((300, 2), np.int64), agreed, np.float32)
    with pytest.raises(ValueError, match="already registered"):
        rf.register(rf.FLOAT32)
    with pytest.raises(ValueError, match="must fit its words"):
        rf.register(rf.Format("wide", np.dtype(np.float32), np.dtype(np.uint32), 24, 8, 127,
                              P=40, W=8, H=23, words=1))


def test_warmup_compiles_every_kernel_of_a_format():
    from bmlmpi.reproducible import warmup
    warmup(["float32", "bfloat16"])
    with pytest.raises(ValueError, match="unknown reproducible format"):
        warmup(["float8"])


def test_the_parameters_fit_their_words():
    for name in FORMATS:
        fmt = rf.get(name)
        if fmt.words == 1:
            assert fmt.P + fmt.W + fmt.H <= 63
        else:
            assert fmt.P + fmt.W <= 2 * rf.SPLIT and rf.SPLIT + fmt.H <= 63
        assert fmt.P >= fmt.precision + 8
    assert (rf.FLOAT32.bins, rf.FLOAT64.bins) == (5, 9)
    assert rf.FLOAT16.largest == 65504.0
    assert rf.FLOAT32.largest == float(np.finfo(np.float32).max)
    assert rf.FLOAT64.largest == float(np.finfo(np.float64).max)
    from bmlmpi.kernels import reproducible as rk
    assert (rk.SENTINEL, rk.SPLIT, rk.NAN, rk.POS_INF, rk.NEG_INF, rk.NOT_NEG_ZERO) == (
        rf.SENTINEL, rf.SPLIT, rf.NAN, rf.POS_INF, rf.NEG_INF, rf.NOT_NEG_ZERO)


def encoded_sum(rows: np.ndarray, agreed: np.ndarray, fmt: rf.Format, start: int = 0
                ) -> np.ndarray:
    """What the words' path gives for ``rows``: each row encoded, the words added, the special
    bytes ORed, one decode."""
    name = "bfloat16" if fmt.name == "bfloat16" else None
    words = sum(rf.encode(r, agreed, fmt=name, start=start) for r in rows)
    special = None
    if agreed[:, 1].any():
        special = np.bitwise_or.reduce([rf.specials(r, agreed, fmt=name, start=start)
                                        for r in rows])
    return rf.decode(words, agreed, rows.dtype, special, fmt=name, start=start)


def contributions(kind: str, fmt: rf.Format, addends: int, n: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``addends`` rows of ``n`` values of ``fmt`` (storage dtype): random bit patterns of
    every kind (specials included), mixed magnitudes, cancelling rows, subnormals only, or
    zeros of both signs with a few infinities and NaNs."""
    if kind == "random":
        return np.stack([random_bits(fmt, n, rng) for _ in range(addends)])
    top = fmt.emask - fmt.bias - 1   # exponents a value of the format can have
    if kind == "mixed":
        e = rng.integers(max(-top, fmt.quantum) // 2, top // 2, (addends, n))
        m = rng.integers(1 << (fmt.mbits - 1), 1 << fmt.mbits, (addends, n)) * np.where(
            rng.random((addends, n)) < 0.5, -1, 1)
        values = np.ldexp(m.astype(np.float64), e - fmt.mbits)
    elif kind == "cancelling":
        half = rng.standard_normal((addends // 2 + 1, n)) * 2.0 ** rng.integers(-6, 6, n)
        values = np.concatenate([half, -half])[:addends]
        values[0] += rng.standard_normal(n) * 2.0 ** -12
    elif kind == "subnormal":
        q = 2.0 ** fmt.quantum
        values = rng.integers(-(1 << fmt.mbits), 1 << fmt.mbits, (addends, n)) * q
    else:   # special
        values = np.where(rng.random((addends, n)) < 0.5, 0.0, -0.0)
        values[rng.random((addends, n)) < 0.01] = np.inf
        values[rng.random((addends, n)) < 0.01] = -np.inf
        values[rng.random((addends, n)) < 0.01] = np.nan
    if fmt.name == "bfloat16":
        return wire_formats.BF16.encode(values.astype(np.float32)).reshape(addends, n)
    return values.astype(fmt.storage)


KINDS = ("random", "mixed", "cancelling", "subnormal", "special")


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_the_fused_sum_gives_the_words_bits(name, parallel):
    """:func:`bmlmpi.reproducible.format.sum_contributions` (each addend encoded where the
    addends meet, summed and decoded in one pass, the special bytes from the addends) gives
    the bits of the words' path on every kind of data, rank count, segment and agreed array
    (raised blocks and flags as other ranks' values would make them)."""
    fmt = rf.get(name)
    rng = np.random.default_rng(11)
    wire = "bfloat16" if name == "bfloat16" else None
    for kind in KINDS:
        for addends, n in ((1, 300), (2, 1000), (3, 513), (5, 256), (8, 77)):
            rows = contributions(kind, fmt, addends, n, rng)
            agreed = np.max([rf.block_exponents(r, fmt=wire) for r in rows], axis=0)
            if kind == "random":
                agreed = np.maximum(agreed, agreed_above(rows[0], fmt, rng))
            want = encoded_sum(rows, agreed, fmt)
            got = rf.sum_contributions(rows, agreed, fmt=wire, parallel=parallel)
            assert got.view(fmt.bits).tolist() == want.view(fmt.bits).tolist(), (kind, n)
            for lo, hi in ((0, 1), (n // 3, n - n // 5), (n - 1, n), (n // 2, n // 2)):
                part = rf.sum_contributions(np.ascontiguousarray(rows[:, lo:hi]), agreed,
                                            fmt=wire, start=lo, parallel=parallel)
                assert part.view(fmt.bits).tolist() == want[lo:hi].view(fmt.bits).tolist(), (
                    kind, lo, hi)


@pytest.mark.parametrize("parallel", FORMS)
@pytest.mark.parametrize("name", FORMATS)
def test_the_fused_sum_of_addends_apart_gives_the_words_bits(name, parallel):
    """:func:`bmlmpi.reproducible.format.sum_addends` (this rank's addends, the others where
    a step's messages landed in one scratch array, the sum written in place over this
    rank's) gives the words' path's bits on every kind of data, special values included:
    their bytes are taken before the in-place decode overwrites this rank's addends."""
    fmt = rf.get(name)
    rng = np.random.default_rng(13)
    wire = "bfloat16" if name == "bfloat16" else None
    for kind in KINDS:
        for addends, n, start in ((2, 1000, 0), (3, 513, 256), (4, 77, 300)):
            rows = contributions(kind, fmt, addends, n, rng)
            padded = [np.concatenate([np.zeros(start, rows.dtype), r]) for r in rows]
            agreed = np.max([rf.block_exponents(p, fmt=wire) for p in padded], axis=0)
            want = encoded_sum(rows, agreed, fmt, start)
            gap = 5
            scratch = np.zeros((addends - 1) * (n + gap) + 3, rows.dtype)
            offsets = [3 + a * (n + gap) for a in range(addends - 1)]
            for o, r in zip(offsets, rows[1:], strict=True):
                scratch[o:o + n] = r
            got = rf.sum_addends(rows[0], scratch, offsets, agreed, fmt=wire, start=start,
                                 parallel=parallel)
            assert got.view(fmt.bits).tolist() == want.view(fmt.bits).tolist(), (kind, n)
            mine = rows[0].copy()
            rf.sum_addends(mine, scratch, offsets, agreed, fmt=wire, start=start, out=mine,
                           parallel=parallel)
            assert mine.view(fmt.bits).tolist() == want.view(fmt.bits).tolist(), (kind, n)


def test_the_fused_sum_of_addends_apart_refuses_what_it_cannot_sum():
    rows = np.random.default_rng(14).standard_normal((2, 300))
    agreed = np.max([rf.block_exponents(r) for r in rows], axis=0)
    with pytest.raises(ValueError, match="leaves others"):
        rf.sum_addends(rows[0], rows[1], [1], agreed)
    with pytest.raises(ValueError, match="partly overlaps first"):
        rf.sum_addends(rows[0], rows[1], [0], agreed, out=rows.reshape(-1)[1:301])
    with pytest.raises(ValueError, match="overlaps others"):
        rf.sum_addends(rows[0].copy(), rows[1], [0], agreed, out=rows[1])
    with pytest.raises(ValueError, match="contiguous one-dimensional float64"):
        rf.sum_addends(rows[0], rows[1].astype(np.float32), [0], agreed)
    with pytest.raises(ValueError, match="above their block's agreed exponent"):
        low = agreed.copy()
        low[0, 0] -= 1
        rf.sum_addends(rows[0], rows[1], [0], low)


def test_the_fused_sum_of_complex_rows_and_its_errors():
    rng = np.random.default_rng(12)
    rows = (rng.standard_normal((3, 400)) + 1j * rng.standard_normal((3, 400)) * 1e-9
            ).astype(np.complex128)
    agreed = np.max([rf.block_exponents(r) for r in rows], axis=0)
    want = encoded_sum(rows, agreed, rf.FLOAT64)
    assert rf.sum_contributions(rows, agreed).tobytes() == want.tobytes()
    part = rf.sum_contributions(np.ascontiguousarray(rows[:, 150:333]), agreed, start=300)
    assert part.tobytes() == want[150:333].tobytes()
    low = agreed.copy()
    low[0, 0] -= 1
    with pytest.raises(ValueError, match="above their block's agreed exponent"):
        rf.sum_contributions(rows, low)
    with pytest.raises(ValueError, match="shape"):
        rf.sum_contributions(rows[0], agreed)
    with pytest.raises(ValueError, match="contiguous"):
        rf.sum_contributions(rows, agreed, out=np.empty(400, np.complex64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("count, size", [(1000, 2), (700, 3), (5, 4), (0, 3), (513, 7)])
def test_an_allreduce_summed_where_its_addends_meet_gives_the_whole_decode_bits(dtype, count,
                                                                                size):
    """What a reproducible allreduce summed where its addends meet computes (:meth:`bmlmpi.
    calls.CollectiveCall.halves`: each rank's column of the all-to-all, summed at its first
    real position) is, put together, the whole sum's decode: the same bits on every block,
    with blocks of the format cut anywhere and ranks with no values."""
    from bmlmpi.calls import CollectiveCall, offsets
    rng = np.random.default_rng(count + size)
    real = np.dtype(dtype).kind == "c"
    parts = []
    for _ in range(size):
        x = rng.standard_normal(count) * 10.0 ** rng.integers(-8, 8, count)
        if real:
            x = x + 1j * rng.standard_normal(count)
        parts.append(x.astype(dtype))
    if count:
        parts[0][count // 2] = np.inf   # a flagged block
    agreed = np.max([rf.block_exponents(p) for p in parts], axis=0)
    whole = encoded_sum(np.stack(parts), agreed, rf.format_for(dtype))
    pieces = []
    for rank in range(size):
        out = np.empty(count, dtype)
        call = CollectiveCall("allreduce", "Allreduce", "ring", "ring", "sum", (count,), 0,
                              rank, size, parts[rank], out, None)
        exchange, column, first, gather = call.halves(rank, size)
        assert exchange.collective == "alltoall" and exchange.algorithm == "pairwise"
        pairs = np.array(exchange.counts).reshape(size, size)
        m = column.shape[1]
        assert column.shape == (size, m) and (pairs[:, rank] == m).all()
        assert gather.counts[rank] == m * out.itemsize
        assert exchange.src.base is parts[rank] or exchange.src is parts[rank]
        for j in range(size):   # what the all-to-all delivers: rank j's block of its input
            lo = offsets(tuple(pairs[j]))[rank]
            column[j] = parts[j][lo:lo + m]
        assert first == offsets(tuple(pairs[rank]))[rank]
        pieces.append(rf.sum_contributions(column, agreed, start=first * (2 if real else 1)))
    assert np.concatenate(pieces).tobytes() == whole.tobytes()


@pytest.mark.parametrize("algorithm, meets, pipelines, exchange",
                         [("ring", False, True, None), ("bml", False, True, None),
                          ("tree", False, True, None), ("multitree", False, True, None),
                          ("shm", True, False, "shm"), ("native", True, False, "native")])
def test_an_allreduce_meets_by_its_algorithm_or_by_the_pipelined_meet(algorithm, meets,
                                                                      pipelines, exchange):
    """Where a reproducible allreduce of the plain communicator sums its addends: an
    algorithm serving no all-to-all by the pipelined meet in any form
    (:meth:`bmlmpi.call_formats.ReproducibleCarrier.pipelines`); one serving the all-to-all
    and both halves by them, blocking only (:meth:`~bmlmpi.call_formats.
    ReproducibleCarrier.meets`); neither on a communicator that keeps its calls (fault
    tolerance), nor on one rank."""
    from types import SimpleNamespace

    from bmlmpi.call_formats import REPRODUCIBLE
    from bmlmpi.calls import CollectiveCall
    carrier = REPRODUCIBLE.carrier(np.dtype(np.float32), "sum")
    carrier.blocking = True
    out = np.empty(1000, np.float32)
    call = CollectiveCall("allreduce", "Allreduce", algorithm, algorithm, "sum", (1000,), 0, 0,
                          2, None, out, None)
    plain = SimpleNamespace(size=2, policy=SimpleNamespace(keeps_calls=False))
    kept = SimpleNamespace(size=2, policy=SimpleNamespace(keeps_calls=True))
    alone = SimpleNamespace(size=1, policy=plain.policy)
    assert carrier.meets(call, plain) is meets
    assert carrier.pipelines(call, plain) is pipelines
    if meets:
        assert call.halves(0, 2)[0].algorithm == exchange
    for other in (kept, alone):
        assert carrier.meets(call, other) is False
        assert carrier.pipelines(call, other) is False
    carrier.blocking = False   # an I... or persistent call: the pipelined meet still
    assert carrier.meets(call, plain) is False
    assert carrier.pipelines(call, plain) is pipelines


@pytest.mark.parametrize("form_blocking", (True, False))
def test_a_reduce_scatter_meets_in_any_form_on_the_plain_communicator(form_blocking):
    """:meth:`bmlmpi.call_formats.ReproducibleCarrier.scatters`: a reduce-scatter sums where
    its addends meet (one all-to-all, in any form) on a plain communicator of more than one
    rank, into a contiguous result; not on one that keeps its calls, nor on one rank; its
    all-to-all gives each rank its block of every input (uneven counts, a rank of none)."""
    from types import SimpleNamespace

    from bmlmpi.call_formats import REPRODUCIBLE
    from bmlmpi.calls import CollectiveCall
    carrier = REPRODUCIBLE.carrier(np.dtype(np.float64), "sum")
    carrier.blocking = form_blocking
    counts = (3, 0, 5)
    inputs = [np.arange(8, dtype=np.float64) + 10 * r for r in range(3)]
    plain = SimpleNamespace(size=3, policy=SimpleNamespace(keeps_calls=False))
    for rank in range(3):
        result = np.empty(counts[rank])
        call = CollectiveCall("reduce_scatter", "Reduce_scatter", "ring", "ring", "sum",
                              counts, 0, rank, 3, inputs[rank], np.empty(0), result)
        assert carrier.scatters(call, plain) and not carrier.meets(call, plain)
        assert not carrier.scatters(call, SimpleNamespace(size=3, policy=SimpleNamespace(
            keeps_calls=True)))
        assert not carrier.scatters(call, SimpleNamespace(size=1, policy=plain.policy))
        exchange, column = call.meeting(counts, rank, 3)
        assert exchange.collective == "alltoall" and exchange.algorithm == "pairwise"
        assert column.shape == (3, counts[rank]) and np.shares_memory(exchange.src, inputs[rank])
        sends = exchange.counts[rank * 3:(rank + 1) * 3]
        assert sends == counts and not exchange.native_block
    allreduce = CollectiveCall("allreduce", "Allreduce", "ring", "ring", "sum", (8,), 0, 0, 3,
                               None, np.empty(8), None)
    assert not carrier.scatters(allreduce, plain)

