"""The wire ops ``sum_fp16``/``sum_bf16`` (bmlmpi.kernels) that the compressed allreduce's 16-bit
path runs through the executor (MPI-free), and the tag blocks of compressed calls (a
compression channel on a duplicate of COMM_SELF).

Against an independent float64 reference: the kernel decodes to float32, adds every operand of
a call in float32 (dst first, then the sources in order) and rounds once to nearest even."""

import math
from fractions import Fraction

import numpy as np
import pytest
from mpi4py import MPI

from bmlmpi import kernels
from bmlmpi.compression import ReducedPrecision, engine, layer
from bmlmpi.compression.channel import TAG_CALLS, CompressionChannel
from bmlmpi.compression.wire import bound, decode, encode, scale, sum_op, unit
from bmlmpi.execute import TAG_STEPS, DeadlineExceeded, tag_upper_bound
from bmlmpi.kernels import dispatch, wire_formats

WIRES = ("fp16", "bf16")
BACKENDS = ("numpy", "numba")


@pytest.fixture(params=BACKENDS)
def backend(request):
    dispatch.set_kernel_mode(request.param)
    yield request.param
    dispatch.set_kernel_mode(None)


def ref_round(x: float, wire: str) -> float:
    """Round-to-nearest-even of a float64 (exact rational arithmetic) to the wire format,
    written independently of the codecs under test (normal range only)."""
    if x == 0 or not math.isfinite(x):
        return x
    bits = 11 if wire == "fp16" else 8
    e = math.frexp(x)[1] - bits            # ulp exponent: |x| in [2^(e+bits-1), 2^(e+bits))
    q = Fraction(x) / Fraction(2) ** e
    n = math.floor(q)
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    return float(n * Fraction(2) ** e)


def codes_of(values: np.ndarray, wire: str) -> np.ndarray:
    return encode(wire, values.astype(np.float32))


def random_wire_values(rng, n: int, wire: str) -> np.ndarray:
    """Wire-representable values of both signs over several binades (normal range)."""
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-8, 9, n)
    return decode(wire, codes_of(x, wire), np.float64)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("nsrc", [1, 2, 3])
def test_wire_op_is_float32_sum_rounded_once(backend, wire, nsrc):
    rng = np.random.default_rng(nsrc)
    n = 3001
    ops = [random_wire_values(rng, n, wire) for _ in range(nsrc + 1)]
    dst = codes_of(ops[0], wire)
    kernels.reduce_many_into(dst, [codes_of(o, wire) for o in ops[1:]], sum_op(wire))
    got = decode(wire, dst, np.float64)
    acc = ops[0].astype(np.float32)
    for o in ops[1:]:
        acc = (acc + o.astype(np.float32)).astype(np.float32)   # the float32 accumulation
    want = np.array([ref_round(float(a), wire) for a in acc])
    assert np.array_equal(got, want)
    if nsrc == 1:
        # two operands: the float32 sum rounded is the correctly rounded exact sum
        exact = np.array([ref_round(float(a) + float(b), wire) for a, b in zip(*ops, strict=False)])
        assert np.array_equal(got, exact)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("n", [5, 300_000])  # below and above the parallel/numba size rules
def test_executor_reductions_sum_wire_codes_as_the_dispatcher_does(backend, wire, n):
    """The executor's unchecked reductions (kernels.combine) give a wire op the wire sum, never
    an integer sum of the codes, whichever back end the size rules pick."""
    from bmlmpi.kernels import combine

    rng = np.random.default_rng(n)
    a, b = random_wire_values(rng, n, wire), random_wire_values(rng, n, wire)
    want = codes_of(a, wire)
    kernels.reduce_many_into(want, [codes_of(b, wire)], sum_op(wire))
    got = codes_of(a, wire)
    combine.reduce_trusted(got, [codes_of(b, wire)], sum_op(wire))
    assert np.array_equal(got, want)
    out = np.zeros(n, np.uint16)
    combine.combine_trusted(out, codes_of(a, wire), codes_of(b, wire), sum_op(wire))
    assert np.array_equal(out, want)


@pytest.mark.parametrize("wire,a,b,want", [
    ("fp16", 1.0, 2.0 ** -11, 1.0),                         # tie: stays on even 1.0
    ("fp16", 1.0 + 2.0 ** -10, 2.0 ** -11, 1.0 + 2.0 ** -9),  # tie: up to the even neighbour
    ("fp16", 1.0, 3 * 2.0 ** -12, 1.0 + 2.0 ** -10),         # above half: up
    ("bf16", 1.0, 2.0 ** -8, 1.0),
    ("bf16", 1.0 + 2.0 ** -7, 2.0 ** -8, 1.0 + 2.0 ** -6),
    ("bf16", -1.0, -(2.0 ** -8), -1.0),
])
def test_wire_op_rounds_ties_to_even(backend, wire, a, b, want):
    dst = codes_of(np.array([a]), wire)
    kernels.reduce_into(dst, codes_of(np.array([b]), wire), sum_op(wire))
    assert decode(wire, dst, np.float64)[0] == want


@pytest.mark.parametrize("wire", WIRES)
def test_wire_op_keeps_nan_and_infinity(backend, wire):
    nan, inf = float("nan"), float("inf")
    a = codes_of(np.array([nan, 1.0, inf, inf, -inf, 2.0]), wire)
    b = codes_of(np.array([1.0, nan, 1.0, -inf, -1.0, nan]), wire)
    kernels.reduce_into(a, b, sum_op(wire))
    got = decode(wire, a, np.float64)
    assert np.isnan(got[[0, 1, 3, 5]]).all()
    assert got[2] == inf and got[4] == -inf
    # a NaN whose payload lies only in the low float32 bits stays NaN in bfloat16
    if wire == "bf16":
        low = np.array([0x7F800001], np.uint32).view(np.float32)
        assert np.isnan(decode(wire, encode(wire, low), np.float32)).all()


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("size", [2, 3, 5, 64, 1000, 5000])
def test_no_overflow_at_the_bound(backend, wire, size):
    """N inputs each at the agreed M·s, summed as a ring does (one rounding per step, each
    step adding one input): every stored partial sum stays finite, also past the N where
    the bound must shrink."""
    for m in (1.0, 3.0, 7e4, 1e30 if wire == "bf16" else 6e4):
        s = scale(wire, m, size)
        v = codes_of(np.array([m * s, -m * s]), wire)   # rounded: may lie above M·s
        acc = v.copy()
        for _ in range(size - 1):
            kernels.reduce_into(acc, v, sum_op(wire))
            assert np.isfinite(decode(wire, acc, np.float64)).all()
        total = decode(wire, acc, np.float64)
        assert abs(total[0] - size * m * s) <= size * size * unit(wire) * m * s


@pytest.mark.parametrize("wire", WIRES)
def test_without_the_prescale_the_16_bit_sum_overflows(backend, wire):
    """The check above can fail: the same ring sum of unscaled values overflows."""
    m = 4e4 if wire == "fp16" else 2.0 ** 127
    v = codes_of(np.array([m]), wire)
    acc = v.copy()
    for _ in range(3):
        kernels.reduce_into(acc, v, sum_op(wire))
    assert np.isinf(decode(wire, acc, np.float64)).all()


@pytest.mark.parametrize("wire", WIRES)
def test_bound_shrinks_only_where_the_growth_needs_it(wire):
    g = (1 + unit(wire)) * (1 + 2.0 ** -24)
    default = 2.0 ** 15 if wire == "fp16" else 2.0 ** 126
    for size in (1, 2, 100, 354, 355, 1418, 1419, 10 ** 4):
        b = bound(wire, size)
        assert b * g ** size <= wire_formats.get(wire).largest
        assert b == default or 2 * b * g ** size > wire_formats.get(wire).largest
    assert bound(wire, 354 if wire == "bf16" else 1418) == default
    assert bound(wire, 355 if wire == "bf16" else 1419) < default
    with pytest.raises(ValueError, match="does not cover"):
        bound(wire, 10 ** 6)


def test_wire_ops_refuse_other_dtypes_and_device_only():
    with pytest.raises(TypeError, match="uint16"):
        kernels.reduce_into(np.zeros(3, np.float32), np.zeros(3, np.float32), "sum_bf16")
    with pytest.raises(ValueError, match="sum_fp16"):
        kernels.reduce_into(np.zeros(3), np.zeros(3), "sum_fp8")


def test_numba_and_numpy_give_the_same_bits():
    rng = np.random.default_rng(7)
    for wire in WIRES:
        for nsrc in (1, 2, 4):
            srcs = [rng.integers(0, 2 ** 16, 4099).astype(np.uint16) for _ in range(nsrc)]
            dst = rng.integers(0, 2 ** 16, 4099).astype(np.uint16)
            out = {}
            for mode in BACKENDS:
                d = dst.copy()
                dispatch.set_kernel_mode(mode)
                try:
                    kernels.reduce_many_into(d, srcs, sum_op(wire))
                finally:
                    dispatch.set_kernel_mode(None)
                out[mode] = d
            # NaN codes may differ in payload between back ends only if both are NaN
            a, b = (decode(wire, out[m], np.float64) for m in BACKENDS)
            same = (out["numpy"] == out["numba"]) | (np.isnan(a) & np.isnan(b))
            assert same.all()


class _Owner:
    """What a compression channel asks of its communicator for its duplicate."""

    timeout = 10.0

    def __init__(self):
        self.comm = MPI.COMM_SELF.Dup()


def test_tag_blocks_do_not_overlap_a_run():
    """A Run uses tags base + [0, TAG_STEPS): consecutive compressed calls' blocks are
    disjoint, and the blocks fit below the MPI tag bound used."""
    assert engine.TAG_SPAN >= TAG_STEPS
    owner = _Owner()
    channel = CompressionChannel(owner)
    try:
        dup = channel.comm
        tag_ub = tag_upper_bound(dup)   # as the channel reads it
        blocks = channel.blocks
        assert blocks == max(1, min(TAG_CALLS, (tag_ub + 1) // engine.TAG_SPAN))
        bases = [channel.next_tag_base() for _ in range(blocks + 2)]
        assert bases[:blocks] == [i * engine.TAG_SPAN for i in range(blocks)]
        assert bases[blocks] == 0
        assert max(bases) + engine.TAG_SPAN - 1 <= tag_ub
        assert channel.comm is dup           # made once
        channel.drop()
        assert channel.comm is not dup       # remade after a drop
    finally:
        channel.drop()
        owner.comm.Free()


def _stuck_stages(recv: MPI.Request):
    yield [recv]


def _failing_stages():
    yield []
    raise ValueError("a stage's own error")


def test_the_channel_frees_its_duplicate_only_when_nothing_is_pending():
    owner = _Owner()
    recv = MPI.COMM_SELF.Irecv(np.empty(1), source=0, tag=77)   # completes in the end only
    try:
        channel = CompressionChannel(owner)
        assert channel.free()                        # none made: nothing to free
        dup = channel.comm
        assert channel.free() and dup == MPI.COMM_NULL   # freed, and made again on use
        dup = channel.comm
        stuck = engine.StagedRequest(_stuck_stages(recv), 0.05, "stuck", queue=channel.queue)
        with pytest.raises(DeadlineExceeded):
            stuck.wait()
        assert not channel.free() and dup != MPI.COMM_NULL   # a call given up stays queued
        channel.queue.clear()
        channel.queue.unsettled = False
        assert channel.free() and dup == MPI.COMM_NULL
        dup = channel.comm
        failed = engine.StagedRequest(_failing_stages(), 1.0, "failing", queue=channel.queue)
        with pytest.raises(ValueError, match="own error"):
            failed.wait()
        assert not channel.queue and channel.queue.unsettled
        assert not channel.free() and dup != MPI.COMM_NULL   # its requests may be posted
        channel.queue.unsettled = False
        assert channel.free() and dup == MPI.COMM_NULL
    finally:
        MPI.COMM_SELF.Send(np.zeros(1), dest=0, tag=77)
        recv.Wait()
        owner.comm.Free()


def test_no_second_executor_in_the_layer():
    assert not hasattr(layer, "_schedule_stages")
    assert layer.start_allreduce is __import__(
        "bmlmpi.executors", fromlist=["start_allreduce"]).start_allreduce


def _q8_encode(x: np.ndarray) -> np.ndarray:
    """Signed 8.8 fixed point: x·256 rounded to nearest even, clipped, as int16 bits."""
    v = np.clip(np.rint(np.asarray(x, np.float64) * 256), -32768, 32767)
    return v.astype(np.int16).view(np.uint16)


def _q8_decode(codes: np.ndarray) -> np.ndarray:
    return codes.view(np.int16).astype(np.float32) / np.float32(256)


@pytest.fixture
def q8():
    fmt = wire_formats.register(wire_formats.WireFormat(
        "q8", _q8_encode, _q8_decode, unit=2.0 ** -9, largest=127.99609375, bound=64.0))
    yield fmt
    wire_formats.unregister("q8")


def test_a_wire_format_registered_once_feeds_the_kernels_and_the_compressors(q8, backend):
    """A format registered in a test alone: its wire op runs in the kernels (numpy: it names
    no numba kernels, whatever the back end asked), and a compressor sends in it."""
    assert q8.op == "sum_q8" and "sum_q8" in kernels.wire_ops()
    a = q8.encode(np.array([1.5, -2.25, 0.00390625, 100.0]))
    srcs = [q8.encode(np.array([0.5, 1.0, 0.00390625, 20.0])),
            q8.encode(np.array([0.25, 0.5, 0.0, 3.0]))]
    kernels.reduce_many_into(a, srcs, "sum_q8")
    assert q8.decode(a).tolist() == [2.25, -0.75, 0.0078125, 123.0]
    with pytest.raises(ValueError, match="already registered"):
        wire_formats.register(q8)
    c = ReducedPrecision("q8")
    x = np.array([1.0, -0.5, 0.3, 0.001], np.float32)
    step = c.begin("k", x)
    v = c.finish("k", step, float(np.abs(x).max()), 2)
    s = step.scale
    assert s == 32.0                       # 2·1.0·s ≤ bound 64
    assert np.array_equal(step.codes, q8.encode(x * np.float32(s)))
    assert np.array_equal(v, q8.decode(step.codes))
    assert np.array_equal(step.y.astype(np.float64),
                          step.sent.astype(np.float64) + c.residuals["k"].astype(np.float64))
    assert sum_op("q8") == "sum_q8"


def test_unknown_wire_formats_are_refused():
    with pytest.raises(ValueError, match="unknown wire format 'fp8'"):
        ReducedPrecision("fp8")
    with pytest.raises(ValueError, match="unknown reduction op"):
        kernels.reduce_into(np.zeros(2, np.uint16), np.zeros(2, np.uint16), "sum_fp8")
