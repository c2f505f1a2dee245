"""bmlmpi.compression on real ranks: identity is the plain allreduce bit for bit, error feedback
holds exactly on every rank, the exchanges sum what the filters kept, the sparse and dense paths
agree, the sharded step equals allreduce + update, bad input raises everywhere; top-k is exact
where k = n, sums what every rank kept, refuses different k on every rank, runs in buckets."""

import math

import numpy as np
import pytest
from mpi4py import MPI

import bmlmpi
from bmlmpi import config
from bmlmpi.compression import Compressor, ShardedStep, bf16, fp16, tdf, threshold, topk
from bmlmpi.compression import random as grp

ALGS = ["bml", "ring"]


def data(n: int, rank: int, it: int, dtype=np.float32, ints: bool = True) -> np.ndarray:
    """Rank-, position- and iteration-dependent values (small integers: exact sums)."""
    i = np.arange(n)
    v = ((i * 7 + rank * 3 + it * 5) % 13 - 6).astype(dtype)
    if not ints:
        v = v * dtype(0.37) + dtype(1e-3) * np.sin(i + rank).astype(dtype)
    return v


@pytest.fixture(scope="module", params=ALGS)
def comm(request):
    c = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=request.param)
    yield c
    c.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("make", [lambda: threshold(0.0), lambda: grp(0.0),
                                  lambda: tdf(0.0, 0.0, 0.0, wire=None),
                                  lambda: tdf(5.0, 1.0, 0.0, wire=None)])
def test_filters_off_is_plain_bit_for_bit(comm, make):
    x = data(1001, comm.rank, 0, ints=False)
    want, got = np.empty_like(x), np.empty_like(x)
    comm.Allreduce(x, want, MPI.SUM)
    c = make()
    for _ in range(2):
        comm.Allreduce(x, got, MPI.SUM, compression=c)
        assert got.tobytes() == want.tobytes()
    assert not c.residuals


def _everyone_sent(comm, history):
    return np.sum(comm.comm.allgather(history[-1][2].astype(np.float64)), axis=0)


@pytest.mark.mpi
@pytest.mark.parametrize("make", [lambda: threshold(2.5, 0.5), lambda: grp(0.5, 3),
                                  lambda: tdf(2.5, 0.5, 0.5, wire=None)])
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_filtered_result_is_sum_of_sent_and_feedback_exact(comm, make, path):
    c = make()
    c.record, c.path = True, path
    buf = np.empty(777, np.float32)
    for it in range(3):
        x = data(777, comm.rank, it)
        comm.Allreduce(x, buf, MPI.SUM, compression=c)
        key, y, sent, kept = c.history[-1]
        assert np.array_equal(y.astype(np.float64), sent.astype(np.float64) + kept)
        assert np.array_equal(buf.astype(np.float64), _everyone_sent(comm, c.history))
    assert sum(c.calls.values()) == 3


@pytest.mark.mpi
@pytest.mark.parametrize("mk", [fp16, bf16, lambda: tdf(2.5, 1.0, 0.5, "fp16")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wire_formats(comm, mk, dtype):
    c: Compressor = mk()
    c.record, c.path = True, "dense"
    n = 3000
    out = np.empty(n, dtype)
    for it in range(2):
        # huge values: an fp16 reduction without the agreed scale would overflow
        x = data(n, comm.rank, it, dtype, ints=False) * dtype(1e6)
        comm.Allreduce(x, out, bmlmpi.AVG, compression=c)
        _, y, sent, kept = c.history[-1]
        assert np.array_equal(y.astype(np.float64), sent.astype(np.float64) +
                              kept.astype(np.float64))
        assert np.isfinite(out).all()
        want = _everyone_sent(comm, c.history) / comm.size
        bits = 11 if c.wire == "fp16" else 8
        tol = 4 * comm.size * 2.0 ** -bits * np.abs(want).max()
        assert np.abs(out - want).max() <= tol
        everyone = comm.comm.allgather(out.tobytes())
        assert all(e == everyone[0] for e in everyone)   # identical on every rank
    assert set(c.calls) == {"wire"}


@pytest.mark.mpi
def test_sparse_equals_dense_on_kept(comm):
    outs = {}
    for path in ("sparse", "dense"):
        c = threshold(4.5)
        c.path = path
        out = np.empty(500, np.float64)
        for it in range(3):
            comm.Allreduce(data(500, comm.rank, it, np.float64), out, MPI.SUM, compression=c)
        outs[path] = out.copy()
        assert set(c.calls) == {path}
    assert np.array_equal(outs["sparse"], outs["dense"])


@pytest.mark.mpi
@pytest.mark.parametrize("wire", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_equals_dense_on_kept_with_a_wire_format(comm, wire, dtype):
    """The sparse pairs carry 16-bit codes: small-integer sums are exact in 16 bits, so the
    sparse result equals the dense wire path's bit for bit; every result is the exact sum of
    what the ranks sent, and error feedback stays exact."""
    outs, nbytes = {}, {}
    for path in ("sparse", "dense"):
        c = tdf(4.5, 0.0, 1.0, wire=wire)
        c.path, c.record = path, True
        out = np.empty(500, dtype)
        for it in range(3):
            comm.Allreduce(data(500, comm.rank, it, dtype), out, MPI.SUM, compression=c)
            _, y, sent, kept = c.history[-1]
            assert np.array_equal(y.astype(np.float64), sent.astype(np.float64) +
                                  kept.astype(np.float64))
            assert np.array_equal(out, _everyone_sent(comm, c.history).astype(dtype))
        outs[path] = out.copy()
        nbytes[path] = c.bytes_sent.get(path, 0)
        assert set(c.calls) == {"sparse" if path == "sparse" else "wire"}
    assert np.array_equal(outs["sparse"], outs["dense"])
    if comm.size > 1:
        # the same kept pairs without the wire format: values in the input dtype
        plain = tdf(4.5, 0.0, 1.0, wire=None)
        plain.path = "sparse"
        out = np.empty(500, dtype)
        for it in range(3):
            comm.Allreduce(data(500, comm.rank, it, dtype), out, MPI.SUM, compression=plain)
        assert nbytes["sparse"] < plain.bytes_sent["sparse"]
        if comm.algorithm == "ring":
            # the ring forwards every rank's set unsummed either way: 6 bytes a pair, not
            # 4 + itemsize (plus an 8-byte count per message)
            per_pair = 4 + np.dtype(dtype).itemsize
            messages = 3 * (comm.size - 1) * 8
            assert ((nbytes["sparse"] - messages) * per_pair ==
                    (plain.bytes_sent["sparse"] - messages) * 6)


@pytest.mark.mpi
def test_sparse_wire_sum_is_exact_on_rounded_values(comm):
    """Non-integer values: the sparse wire result is the float64 sum of every rank's sent
    (wire-rounded) values, with no rounding to 16 bits on the way."""
    c = tdf(0.5, 0.0, 0.5, wire="fp16")
    c.path, c.record = "sparse", True
    out = np.empty(2000, np.float64)
    for it in range(2):
        x = data(2000, comm.rank, it, np.float64, ints=False) * 1e3
        comm.Allreduce(x, out, MPI.SUM, compression=c)
        _, y, sent, kept = c.history[-1]
        assert np.array_equal(y, sent + kept)
        assert np.array_equal(out, _everyone_sent(comm, c.history))
        everyone = comm.comm.allgather(out.tobytes())
        assert all(e == everyone[0] for e in everyone)


@pytest.mark.mpi
def test_auto_prices_the_links_measured_once_per_communicator(comm):
    """A fixed algorithm has no calibration: the first auto call with filters measures α and
    β (the same values on every rank), later calls reuse them."""
    c2 = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=comm.algorithm)
    try:
        assert c2.calibration is None
        out = np.empty(1000, np.float32)
        c2.Allreduce(data(1000, c2.rank, 0), out, MPI.SUM, compression=fp16())
        assert c2.compression.links is None   # no filters: no choice
        comp = threshold(4.5)
        c2.Allreduce(data(1000, c2.rank, 0), out, MPI.SUM, compression=comp)
        links = c2.compression.links
        if c2.size == 1 or not config.get("BMLMPI_CALIBRATE"):   # nothing to measure
            assert links is None
            return
        alpha, beta = links
        assert alpha > 0 and beta > 0
        assert all(v == links for v in c2.comm.allgather(links))
        c2.Allreduce(data(1000, c2.rank, 1), out, MPI.SUM, compression=comp)
        assert c2.compression.links is links
    finally:
        c2.Free()


@pytest.mark.mpi
def test_free_frees_the_compression_duplicate_unless_a_call_is_unfinished(comm):
    c2 = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=comm.algorithm)
    out = np.empty(100, np.float32)
    c2.Allreduce(data(100, c2.rank, 0), out, MPI.SUM, compression=fp16())
    dup = c2.compression.comm
    c2.Free()
    assert dup == MPI.COMM_NULL
    c3 = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=comm.algorithm)
    req = c3.Iallreduce(data(100, c3.rank, 1), out, MPI.SUM, compression=fp16())
    assert type(req) is bmlmpi.Request   # every non-blocking call's one request type
    dup = c3.compression.comm
    try:
        c3.Free()    # the compressed call is not waited on: its duplicate is left to MPI
        # (one rank's call completes as it starts: nothing is unfinished, the duplicate goes)
        assert (dup != MPI.COMM_NULL) == (comm.size > 1)
    finally:
        req.Wait()   # it still completes on its own duplicate
    assert np.array_equal(out, np.sum(c3_inputs(comm.size, 100, 1), axis=0))  # small ints: exact
    assert c3.compression.free() and dup == MPI.COMM_NULL


def c3_inputs(size: int, n: int, it: int) -> list[np.ndarray]:
    return [data(n, r, it) for r in range(size)]


@pytest.mark.mpi
def test_different_compressor_paths_raise_on_every_rank(comm):
    if comm.size == 1:
        return
    c = threshold(1.0)
    c.path = "sparse" if comm.rank == 0 else "dense"
    x = data(50, comm.rank, 0)
    # the first-call agreement sees the compressors' settings (an ArgumentMismatch, a
    # ValueError, naming each rank's)
    with pytest.raises(ValueError, match="arguments differ across ranks.*path sparse"):
        comm.Allreduce(x, np.empty_like(x), MPI.SUM, compression=c)
    out = np.empty_like(x)
    comm.Allreduce(x, out, MPI.SUM, compression=threshold(1.0))   # still usable


@pytest.mark.mpi
def test_auto_goes_sparse_when_almost_everything_is_dropped(comm):
    c = threshold(1e9)            # G-SMP drops everything but the huge entries
    x = np.zeros(100000, np.float32)
    x[comm.rank * 10] = 1e10
    out = np.empty_like(x)
    comm.Allreduce(x, out, MPI.SUM, compression=c)
    want = np.zeros_like(x)
    want[np.arange(comm.size) * 10] = 1e10
    assert np.array_equal(out, want)
    assert set(c.calls) == ({"sparse"} if comm.size > 1 else {"dense"})


@pytest.mark.mpi
def test_in_place_and_iallreduce(comm):
    c = tdf(2.5, 0.0, 0.5, wire=None)
    c.record = True
    buf = data(300, comm.rank, 1)
    req = comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM, compression=c)
    req.Wait()
    assert np.array_equal(buf.astype(np.float64), _everyone_sent(comm, c.history))


@pytest.mark.mpi
def test_bad_input_raises_on_every_rank(comm):
    x = data(10, comm.rank, 0)
    with pytest.raises(ValueError):
        comm.Allreduce(x, np.empty_like(x), MPI.MAX, compression=threshold(1.0))
    bad = x.astype(np.int32) if comm.rank == comm.size - 1 else x
    with pytest.raises(ValueError):
        comm.Allreduce(bad, np.empty_like(bad), MPI.SUM, compression=threshold(1.0))
    if comm.size > 1:
        n = 10 + (comm.rank == 0)
        with pytest.raises(ValueError, match="arguments differ across ranks.*count=11"):
            comm.Allreduce(data(n, comm.rank, 0), np.empty(n, np.float32), MPI.SUM,
                           compression=threshold(1.0))
    # still usable afterwards
    out = np.empty_like(x)
    comm.Allreduce(x, out, MPI.SUM, compression=threshold(1.0))


def _sgd(g, p):
    p -= 0.5 * g


@pytest.mark.mpi
@pytest.mark.parametrize("psmp", [None, (0.0, 1.0)])
def test_sharded_step_equals_allreduce_plus_update(comm, psmp):
    n = 1003
    params = data(n, 0, 9, np.float64) * 4       # the same on every rank
    plain = params.copy()
    step = ShardedStep(comm, params, _sgd, psmp=psmp, op=MPI.SUM)
    for it in range(3):
        g = data(n, comm.rank, it, np.float64)
        total = np.empty_like(g)
        comm.Allreduce(g, total, MPI.SUM)
        _sgd(total, plain)
        step.step(g)
        assert np.array_equal(params, plain)
        assert step.published[-1][0] == n


@pytest.mark.mpi
def test_sharded_psmp_keeps_older_copies(comm):
    n = 600
    params = 10.0 + data(n, 0, 2, np.float64)     # in [4, 16]: no zeros
    step = ShardedStep(comm, params, _sgd, psmp=(0.05, 0.0), op=bmlmpi.AVG)
    before = params.copy()
    g = np.where(np.arange(n) % 3 == 0, 2.0, 0.01)     # big steps on every third element
    step.step(g)
    rel = np.abs(0.5 * g) / np.abs(before)
    sent = rel >= 0.05
    assert np.array_equal(params[sent], before[sent] - 0.5 * g[sent])
    assert np.array_equal(params[~sent], before[~sent])         # older copies kept
    everyone = comm.comm.allgather(params.tobytes())
    assert all(e == everyone[0] for e in everyone)
    assert np.array_equal(step.master, (before - 0.5 * g)[step.lo:step.hi])  # nothing lost
    assert step.published[-1] == (int(sent.sum()), False)


@pytest.mark.mpi
def test_gradient_buckets_compression(comm):
    shapes = [(40,), (7, 3), (500,), (1,)]
    grads = [np.zeros(s, np.float32) for s in shapes]
    phi = 3.5
    b = bmlmpi.GradientBuckets(grads, comm=comm, op=MPI.SUM, plan="layer",
                               compression=threshold(phi))
    res = [[np.zeros(int(np.prod(s)), np.float64) for s in shapes] for _ in range(comm.size)]
    for it in range(3):
        for i in reversed(range(len(grads))):
            grads[i][...] = data(grads[i].size, comm.rank, it + i).reshape(shapes[i])
            b.mark_ready(i)
        b.wait()
        for i, s in enumerate(shapes):
            want = np.zeros(int(np.prod(s)))
            for r in range(comm.size):
                y = data(want.size, r, it + i).astype(np.float64) + res[r][i]
                drop = np.abs(y) < phi
                want += np.where(drop, 0, y)
                res[r][i] = np.where(drop, y, 0)
            assert np.array_equal(grads[i].reshape(-1).astype(np.float64), want)
    b.close()


@pytest.mark.mpi
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_topk_with_k_equal_n_is_the_plain_allreduce(comm, path):
    """k = n keeps everything: the result is MPI's own sum bit for bit (small integers), on
    both exchanges, and nothing is left in the residual."""
    n = 777
    c = topk(n)
    c.path = path
    out = np.empty(n, np.float32)
    for it in range(2):
        x = data(n, comm.rank, it)
        comm.Allreduce(x, out, MPI.SUM, compression=c)
        want = np.empty_like(x)
        comm.comm.Allreduce(x, want, MPI.SUM)
        assert np.array_equal(out, want)
        assert not next(iter(c.residuals.values())).any()
    assert set(c.calls) == {path}


@pytest.mark.mpi
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_topk_sums_what_every_rank_kept(comm, path):
    """Each rank keeps its own k largest |y| (its positions differ from the others'): the
    result is the exact sum of what the ranks sent, every kept |y| is at least every dropped
    one, and y = sent + kept on every rank."""
    n, k = 1200, 50
    c = topk(k)
    c.path, c.record = path, True
    out = np.empty(n, np.float32)
    for it in range(3):
        x = data(n, comm.rank, it, ints=False)
        comm.Allreduce(x, out, MPI.SUM, compression=c)
        _, y, sent, kept = c.history[-1]
        picked = sent != 0
        assert picked.sum() <= k
        assert np.abs(y[picked]).min(initial=np.inf) >= np.abs(kept).max(initial=0)
        assert np.array_equal(y.astype(np.float64), sent.astype(np.float64) + kept)
        everyone = np.stack(comm.comm.allgather(sent)).astype(np.float64)
        assert np.allclose(out, everyone.sum(axis=0), rtol=1e-6, atol=1e-5)
        results = comm.comm.allgather(out.tobytes())
        assert all(r == results[0] for r in results)


@pytest.mark.mpi
def test_topk_with_different_k_raises_on_every_rank(comm):
    if comm.size == 1:
        return
    x = data(300, comm.rank, 0)
    out = np.full_like(x, -1.0)
    for mine in (topk(10 + comm.rank), topk(ratio=0.1 if comm.rank else 0.2)):
        # the first-call agreement names each rank's settings
        with pytest.raises(ValueError, match=r"arguments differ across ranks.*TopK \("):
            comm.Allreduce(x, out, MPI.SUM, compression=mine)
        assert (out == -1.0).all()
    comm.Allreduce(x, out, MPI.SUM, compression=topk(10))   # still usable
    # without that agreement (validate=False) the compressed call's own agreement refuses
    unchecked = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=comm.algorithm, validate=False)
    try:
        with pytest.raises(ValueError, match=r"different compressors.*'TopK'"):
            unchecked.Allreduce(x, out, MPI.SUM, compression=topk(10 + comm.rank))
        unchecked.Allreduce(x, out, MPI.SUM, compression=topk(10))
    finally:
        unchecked.Free()


@pytest.mark.mpi
def test_gradient_buckets_topk(comm):
    """GradientBuckets with top-k: every group's result is the sum of what the ranks sent
    for it (error feedback per group), the k largest of each group's y."""
    shapes = [(40,), (7, 3), (500,), (1,)]
    grads = [np.zeros(s, np.float32) for s in shapes]
    c = topk(ratio=0.1)
    c.record = True
    b = bmlmpi.GradientBuckets(grads, comm=comm, op=MPI.SUM, plan="layer", compression=c)
    for it in range(3):
        for i in reversed(range(len(grads))):
            grads[i][...] = data(grads[i].size, comm.rank, it + i, ints=False).reshape(shapes[i])
            b.mark_ready(i)
        b.wait()
        calls = c.history[-len(shapes):]
        assert sorted(key for key, *_ in calls) == [(i,) for i in range(len(shapes))]
        for key, y, sent, kept in calls:
            (i,) = key
            assert np.count_nonzero(sent) <= math.ceil(0.1 * y.size)
            assert np.array_equal(y.astype(np.float64), sent.astype(np.float64) + kept)
            everyone = np.stack(comm.comm.allgather(sent)).astype(np.float64).sum(axis=0)
            assert np.allclose(grads[i].reshape(-1), everyone, rtol=1e-6, atol=1e-5)
    assert sum(c.iterations.values()) == 3 * len(shapes)
    b.close()
