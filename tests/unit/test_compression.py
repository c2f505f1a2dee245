"""bmlmpi.compression without MPI: codecs, scale, filters, top-k, error feedback, sparse merge,
P-SMP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bmlmpi.compression import TopK, bf16, filters, fp16, network_price, parse, tdf, threshold, topk
from bmlmpi.compression import random as grp
from bmlmpi.compression.channel import CompressionChannel
from bmlmpi.compression.layer import choose_sparse
from bmlmpi.compression.sharded import psmp_publishes, psmp_threshold
from bmlmpi.compression.sparse import concatenate, merge, pack, sparse_seconds, unpack
from bmlmpi.compression.wire import decode, encode, round_trip, scale


def test_fp16_codec_is_numpy_half():
    x = np.array([0.0, 1.0, -2.5, 65504.0, 1e-8, 3.14159], np.float32)
    assert np.array_equal(decode("fp16", encode("fp16", x), np.float32),
                          x.astype(np.float16).astype(np.float32))


def test_bf16_rounds_to_nearest_even():
    # 1 + 2^-8 lies halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1)
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -3.0, 0.0, np.inf], np.float32)
    y = round_trip("bf16", x)
    assert y.tolist() == [1.0, 1 + 2 ** -6, -3.0, 0.0, np.inf]
    assert np.isnan(round_trip("bf16", np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize("wire,bound", [("fp16", 2.0 ** 15), ("bf16", 2.0 ** 126)])
@pytest.mark.parametrize("size", [1, 3, 12])
@pytest.mark.parametrize("m", [1e-30, 1e-3, 1.0, 7e4, 1e30])
def test_scale_bounds_every_partial_sum(wire, bound, size, m):
    s = scale(wire, m, size)
    assert s == 2.0 ** round(math.log2(s))          # a power of two: exact
    assert size * m * s <= bound < 2 * size * m * s  # the largest such power
    # the worst partial sum, all ranks at the maximum, does not overflow in the wire format
    assert math.isfinite(float(round_trip(wire, np.array([size * m * s], np.float32))[0]))


def test_gsmp_and_grp_select_their_definitions():
    y = np.array([0.5, -0.05, 0.2, -0.3, 0.0])
    t = 4
    thr = 0.25 / (1 + 0.5 * math.log(t))
    assert filters.gsmp_threshold(0.25, 0.5, t) == thr
    assert filters.gsmp_selects(y, 0.25, 0.5, t).tolist() == (np.abs(y) < thr).tolist()
    a = filters.grp_selects(10000, 0.3, 7, 3, 11)
    assert np.array_equal(a, np.random.default_rng([7, 3, 11]).random(10000) < 0.3)
    assert 0.27 < a.mean() < 0.33
    assert not np.array_equal(a, filters.grp_selects(10000, 0.3, 7, 4, 11))  # new draw per t


@pytest.mark.parametrize("make", [lambda: threshold(0.3, 1.0), lambda: grp(0.6, 5),
                                  lambda: tdf(0.3, 1.0, 0.6, wire=None)])
def test_dropped_exactly_as_defined(make):
    c = make()
    rng = np.random.default_rng(0)
    dropped = 0
    for t in range(1, 5):
        x = rng.standard_normal(200).astype(np.float32)
        before = c.residuals.get("k")
        y = x + (before if before is not None else 0)
        step = c.begin("k", x)
        assert np.array_equal(step.y, y)
        smp = np.abs(y) < 0.3 / (1 + math.log(t)) if c.phi is not None else None
        rp = (np.random.default_rng([c.seed, t, filters.key_of("k")]).random(200) < c.p
              if c.p is not None else None)
        want = smp if rp is None else rp if smp is None else smp & rp
        assert np.array_equal(step.dropped, want)
        c.finish("k", step, float(np.abs(y).max()), 4)
        assert np.array_equal(step.sent[want], np.zeros(want.sum(), np.float32))
        assert np.array_equal(step.sent[~want], y[~want])
        assert np.array_equal(c.residuals["k"], np.where(want, y, 0))
        dropped += int(want.sum())
    assert (c.elements, c.dropped) == (800, dropped)


@pytest.mark.parametrize("spec", ["fp16", "bf16", "tdf:0.5:1:0.5", "tdf:0.5:1:0.5:bf16",
                                  "threshold:0.2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_error_feedback_input_is_sent_plus_kept(spec, dtype):
    c = parse(spec)
    rng = np.random.default_rng(1)
    for _ in range(6):
        # magnitudes over 20 decades: fp16 rounds, flushes tiny values to zero, would overflow
        x = (rng.standard_normal(500) * 10.0 ** rng.integers(-12, 8, 500)).astype(dtype)
        step = c.begin(("a",), x)
        c.finish(("a",), step, float(np.abs(step.y).max()), 5)
        y, sent, kept = (a.astype(np.float64) for a in (step.y, step.sent, c.residuals[("a",)]))
        assert np.array_equal(y, sent + kept)
        assert np.isfinite(sent).all()


def test_identity_and_filters_flags():
    assert threshold(0.0).identity and grp(0.0).identity and tdf(0, 0, 0, wire=None).identity
    assert tdf(1.0, 0, 0.0, wire=None).identity    # G-RP selects nothing: nothing dropped
    assert not tdf(1.0, 0, 0.5, wire=None).identity
    assert not parse("fp16").identity and parse("none") is None


def test_spec_can_pin_the_exchange():
    c = parse("tdf:0.1:0.5:0.99:none@sparse")
    assert (c.path, c.phi, c.p, c.wire) == ("sparse", 0.1, 0.99, None)
    assert parse("fp16@dense").path == "dense" and parse("threshold:1").path == "auto"


@pytest.mark.parametrize("bad", ["tdf:1", "fp32", "random:2", "threshold:-1", "tdf:1:1:0.5:int8",
                                 "none@sparse", "fp16@fast", "@sparse"])
def test_bad_specs_raise(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_regroup_keeps_each_arrays_residual():
    c = threshold(10.0)
    sizes = [2, 3, 4]
    for key in [(0,), (1, 2)]:
        n = sum(sizes[i] for i in key)
        c.finish(key, c.begin(key, np.arange(1, n + 1, dtype=np.float32) * (key[0] + 1)), 0, 2)
    c.regroup([(0,), (1, 2)], [(0, 1), (2,)], sizes)
    assert c.residuals[(0, 1)].tolist() == [1, 2, 2, 4, 6]
    assert c.residuals[(2,)].tolist() == [8, 0, 0, 0]   # 10, 12, 14 >= 10 were sent


def test_pack_merge_sums_in_order():
    a = (np.array([5, 1], np.int64), np.array([1.0, 2.0]))
    b = (np.array([1, 9], np.int64), np.array([10.0, 3.0]))
    i, v = unpack(pack(*a), np.dtype(np.float64))
    assert i.tolist() == [5, 1] and v.tolist() == [1.0, 2.0]
    idx, val = merge([a, b], np.dtype(np.float64))
    assert idx.tolist() == [1, 5, 9] and val.tolist() == [12.0, 1.0, 3.0]


def test_sparse_price_grows_with_density_and_fill_in():
    low = sparse_seconds(10, 10 ** 6, 4, [2, 2], 4, 1e-5, 1e-9)
    high = sparse_seconds(10 ** 5, 10 ** 6, 4, [2, 2], 4, 1e-5, 1e-9, merge_s=0.0)
    assert low < high
    assert high == pytest.approx(4e-5 + (1e5 + 2e5) * 8 * 1e-9)
    assert sparse_seconds(10 ** 5, 10 ** 6, 4, [2, 2], 4, 0, 0, merge_s=1.0) == 2e5 + 4e5
    assert sparse_seconds(7, 100, 4, None, 4, 1.0, 0.0, merge_s=0.0) == 6.0


def test_psmp_publishes_relative_changes():
    old = np.array([1.0, 1.0, 0.0, 0.0, -2.0])
    new = np.array([1.05, 1.2, 0.0, 0.1, -2.0])
    thr = psmp_threshold(0.1, 1.0, 3)
    assert thr == 0.1 / (1 + math.log(3))
    want = [abs(0.05) >= thr, True, False, True, False]
    assert psmp_publishes(new, old, 0.1, 1.0, 3).tolist() == want
    assert psmp_publishes(new, old, 0.0, 1.0, 3).all()


def test_concatenate_keeps_every_pair_unsummed_in_order():
    a = (np.array([3, 1], np.int32), np.array([10, 11], np.uint16))
    b = (np.array([1], np.int64), np.array([12], np.uint16))
    idx, val = concatenate([a, b], np.dtype(np.uint16))
    assert idx.dtype == np.int32 and idx.tolist() == [3, 1, 1]
    assert val.tolist() == [10, 11, 12]
    assert concatenate([], np.dtype(np.uint16))[1].dtype == np.uint16


class _Comm:
    """What network_price.known and choose_sparse read of a bmlmpi Communicator (2x2 BCube, bml)."""
    size, shape, level_comms, calibration = 4, (2, 2), [None, None], None
    comm, timeout = None, 10.0


def test_links_known_and_the_choice_they_drive(monkeypatch):
    monkeypatch.delenv("BMLMPI_CALIBRATE", raising=False)
    comm = CompressionChannel(_Comm())
    assert network_price.known(comm) is None                 # to be measured on the first call
    monkeypatch.setenv("BMLMPI_CALIBRATE", "0")
    assert network_price.known(comm) == (network_price.DEFAULT_ALPHA, network_price.DEFAULT_BETA)
    monkeypatch.delenv("BMLMPI_CALIBRATE")
    # the training job's gradients on the 100 Mbit/s testbed, 3 % kept (float64, no wire):
    # shared-memory defaults keep the dense path, the testbed's links choose sparse
    count, kept = 373_000, 11_190
    assert not choose_sparse(comm, "bml", kept, count, 8, 8, network_price.DEFAULT_ALPHA,
                             network_price.DEFAULT_BETA)
    assert choose_sparse(comm, "bml", kept, count, 8, 8, 2e-4, 8e-8)
    assert not choose_sparse(comm, "bml", count // 2, count, 8, 8, 2e-4, 8e-8)
    comm.links = (2e-4, 8e-8)
    assert network_price.known(comm) == (2e-4, 8e-8)
    assert choose_sparse(comm, "bml", kept, count, 8, 8)   # priced with the measured links


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_finish_on_the_kept_indices_codes_them_as_the_full_pass(wire):
    """The sparse exchange codes only the kept values: the same codes, sent and residual."""
    x = (np.sin(np.arange(3000) * 0.37) * 50).astype(np.float32)
    whole, part = tdf(20.0, 0.0, 1.0, wire), tdf(20.0, 0.0, 1.0, wire)
    a, b = whole.begin("k", x), part.begin("k", x)
    maxabs = whole.local_maxabs(a)
    whole.finish("k", a, maxabs, 4)
    nz = np.flatnonzero(~b.dropped)
    assert 0 < nz.size < x.size
    part.finish("k", b, maxabs, 4, kept_at=nz)
    assert np.array_equal(a.codes[nz], b.codes)
    assert np.array_equal(a.sent, b.sent)
    assert np.array_equal(whole.residuals["k"], part.residuals["k"])
    assert np.array_equal(b.y.astype(np.float64), b.sent.astype(np.float64) +
                          part.residuals["k"].astype(np.float64))


def test_topk_keeps_the_k_largest_and_keeps_the_rest():
    c = topk(3)
    x = np.array([0.5, -4.0, 1.0, 3.0, -0.25, 2.0, 0.0], np.float32)
    step = c.begin("k", x)
    assert step.dropped.tolist() == [True, False, True, False, True, False, True]
    c.finish("k", step, float(np.abs(x).max()), 4)
    assert step.sent.tolist() == [0, -4, 0, 3, 0, 2, 0]
    assert c.residuals["k"].tolist() == [0.5, 0, 1, 0, -0.25, 0, 0]
    assert (c.elements, c.dropped) == (7, 4)
    assert topk(ratio=0.3).kept_count(7) == 3 and topk(100).kept_count(7) == 7


@pytest.mark.parametrize("make", [lambda n: topk(n), lambda n: topk(10 * n),
                                  lambda n: topk(ratio=1.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_is_exact_where_k_is_n(make, dtype):
    n = 257
    c = make(n)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(dtype)
        step = c.begin("k", x)
        assert step.dropped is None
        c.finish("k", step, float(np.abs(x).max()), 4)
        assert np.array_equal(step.sent, x) and step.sent.dtype == dtype
        assert not c.residuals["k"].any()
    assert c.dropped == 0 and not c.identity    # still a compressed call (its own agreement)


def test_topk_error_feedback_carries_the_residual():
    """The same gradient every step, one element kept per step: only the residual lets the
    small components through (without it, element 0 would be sent every time and the others
    never), and what was sent plus what is kept is exactly every step's input."""
    g = np.array([4.0, 3.0, 2.0, 1.0], np.float32)
    c = topk(1)
    total = np.zeros(4)
    sent_at = set()
    steps = 12
    for _ in range(steps):
        step = c.begin("k", g)
        c.finish("k", step, float(np.abs(step.y).max()), 2)
        total += step.sent
        sent_at |= set(np.flatnonzero(step.sent).tolist())
    assert sent_at == {0, 1, 2, 3}
    assert np.array_equal(total + c.residuals["k"], steps * g.astype(np.float64))
    assert np.abs(c.residuals["k"]).max() < 4 * np.abs(g).sum()   # bounded, not growing


@pytest.mark.parametrize("spec,k,ratio,wire", [("topk:10", 10, None, None),
                                               ("topk:0.01", None, 0.01, None),
                                               ("topk:5:bf16", 5, None, "bf16"),
                                               ("topk:2.5e-3:fp16", None, 2.5e-3, "fp16")])
def test_topk_specs(spec, k, ratio, wire):
    c = parse(spec)
    assert isinstance(c, TopK) and (c.k, c.ratio, c.wire) == (k, ratio, wire)
    assert parse(spec + "@sparse").path == "sparse"


@pytest.mark.parametrize("bad", ["topk", "topk:0", "topk:-3", "topk:1.5", "topk:0.0",
                                 "topk:3:int8", "topk:1:2:3"])
def test_bad_topk_specs_raise(bad):
    with pytest.raises(ValueError):
        parse(bad)
    with pytest.raises(ValueError):
        topk(3, ratio=0.5)


def test_what_ranks_agree_on_is_declared_by_each_compressor():
    assert topk(3).agreement() == ("TopK", None, "auto", True, 3, None)
    assert topk(3).agreement_code() == topk(3).agreement_code()
    codes = {c.agreement_code() for c in (topk(3), topk(4), topk(ratio=0.5), topk(3, wire="fp16"),
                                          threshold(1.0), threshold(0.0), fp16(), bf16())}
    assert len(codes) == 8 and all(0 <= code < 2 ** 52 for code in codes)
    # a rank's own threshold (or seed) is its own: only whether it can drop is agreed
    assert threshold(1.0).agreement_code() == threshold(2.0, 0.5).agreement_code()
    pinned = topk(3)
    pinned.path = "sparse"
    assert pinned.agreement_code() != topk(3).agreement_code()
