"""GradientBuckets on real ranks: fused results equal per-array allreduces bit for bit, every plan
and dtype mix; progress while the caller computes; the registration check raises everywhere."""

import time

import numpy as np
import pytest

import bmlmpi
from bmlmpi.training import Batching, Profile, flat_arena

# sizes 0 and 1, odd shapes, and 6000 elements: past the 4 KiB cap of the threshold plan
SHAPES = [(3, 4), (0,), (1,), (6000,), (7, 5), (2, 0, 3), (129,), (1,), (40, 3)]
MIXES = {
    "f64": [np.float64] * len(SHAPES),
    "mixed": [np.float32, np.int64, np.float64, np.float32, np.int32, np.float16,
              np.complex128, np.uint8, np.float64],
}
PLANS = ["layer", "single", "threshold", "ibatch", "ibatch-profiled", "ibatch-measured"]


def grads_input(shapes, dtypes, rank: int, it: int) -> list[np.ndarray]:
    """Rank-, position- and iteration-dependent small integers: every sum is exact."""
    out = []
    for j, (s, dt) in enumerate(zip(shapes, dtypes, strict=True)):
        n = int(np.prod(s))
        v = ((np.arange(n) * 7 + rank * 3 + j * 5 + it) % 11).astype(dt).reshape(s)
        out.append(v)
    return out


def made_buckets(plan: str, grads, comm, fusion: str = "auto"):
    n = len(grads)
    if plan == "ibatch":
        profile = Profile(tuple(1e-4 * (i % 3 + 1) for i in range(n)),
                          tuple(2e-4 * ((i + 1) % 4 + 1) for i in range(n)),
                          tuple(a.nbytes for a in grads), 5e-5, 1e-8)
        return bmlmpi.GradientBuckets(grads, comm=comm, plan="ibatch", profile=profile,
                                      fusion=fusion)
    if plan == "ibatch-profiled":
        return bmlmpi.GradientBuckets(grads, comm=comm, plan="ibatch", fusion=fusion)
    if plan == "ibatch-measured":   # costs timed on the communicator during the re-plan
        return bmlmpi.GradientBuckets(grads, comm=comm, plan="ibatch", fusion=fusion,
                                      cost="measured")
    return bmlmpi.GradientBuckets(grads, comm=comm, plan=plan, fusion_bytes=4096, fusion=fusion)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("layout", ["arrays", "arena"])
def test_fused_equals_per_array_allreduce(comm, plan, mix, layout):
    dtypes = MIXES[mix]
    if layout == "arena":
        if mix != "f64":
            pytest.skip("one arena holds one dtype")
        _, grads = flat_arena(SHAPES, np.float64)
    else:
        grads = [np.zeros(s, dtype=dt) for s, dt in zip(SHAPES, dtypes, strict=True)]
    c = bmlmpi.Communicator(comm)
    ref_comm = bmlmpi.Communicator(comm)
    b = made_buckets(plan, grads, c)
    try:
        # ibatch-profiled: iteration 0 warms up, 1-3 are profiled, 4-5 run the iBatch plan
        for it in range(6 if plan in ("ibatch-profiled", "ibatch-measured") else 3):
            inputs = grads_input(SHAPES, dtypes, comm.rank, it)
            for i in reversed(range(len(grads))):     # the backward pass, last layer first
                np.copyto(grads[i], inputs[i])
                np.sqrt(np.arange(2000.0)).sum()      # some computation between layers
                b.mark_ready(i)
            for i in range(len(grads)):               # the next forward pass
                b.wait(i)
                want = np.empty_like(inputs[i])
                ref_comm.Allreduce(inputs[i], want, bmlmpi.AVG)
                assert want.dtype == grads[i].dtype
                assert grads[i].tobytes() == want.tobytes(), (plan, it, i)
        b.wait()
        if plan.startswith("ibatch"):
            assert b.profile is not None and b.plan_name == "ibatch"
        covered = [i for first, end in b.buckets for i in range(first, end)]
        assert covered == list(range(len(grads)))
        if layout == "arena" and plan == "single":
            assert all(g.in_place for bk in b._buckets for g in bk.groups)
    finally:
        b.close()


def test_progress_while_caller_computes(comm):
    """A bucket completes while this thread runs numpy code without calling into bmlmpi."""
    grads = [np.zeros(20_000) for _ in range(3)]
    b = bmlmpi.GradientBuckets(grads, comm=comm, plan="single")
    try:
        for it in range(2):
            for i in reversed(range(3)):
                grads[i][:] = comm.rank + i + it
                b.mark_ready(i)
            deadline = time.monotonic() + 30
            x = np.random.default_rng(comm.rank).random((120, 120))
            while not b.done() and time.monotonic() < deadline:
                x = np.tanh(x @ x.T / 120.0)    # the caller's computation (GIL released)
            assert b.done(), "the allreduce made no progress while the caller computed"
            b.wait()
            total = sum(range(comm.size))
            for i in range(3):
                assert np.all(grads[i] == total / comm.size + i + it)
    finally:
        b.close()


@pytest.mark.parametrize("kind", ["shape", "dtype", "count", "order", "plan"])
def test_registration_mismatch_raises_on_every_rank(comm, kind):
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    odd = comm.rank == comm.size - 1
    shapes = [(4,), (3, 2), (5,)]
    dtypes = [np.float64, np.float32, np.float64]
    plan = "threshold"
    if odd and kind == "shape":
        shapes[1] = (2, 3)
    if odd and kind == "dtype":
        dtypes[2] = np.float32
    if odd and kind == "count":
        shapes.append((1,))
        dtypes.append(np.float64)
    if odd and kind == "order":
        shapes.reverse()
        dtypes.reverse()
    if odd and kind == "plan":
        plan = "layer"
    grads = [np.zeros(s, dtype=dt) for s, dt in zip(shapes, dtypes, strict=True)]
    with pytest.raises(bmlmpi.RegistrationMismatch, match="rank"):
        bmlmpi.GradientBuckets(grads, comm=comm, plan=plan)


def test_bad_array_raises_on_every_rank(comm):
    grads = [np.zeros(4), np.zeros((4, 4))]
    if comm.rank == 0:
        grads[1] = grads[1][:, ::2]     # not C-contiguous
    with pytest.raises(bmlmpi.RegistrationMismatch):
        bmlmpi.GradientBuckets(grads, comm=comm)


def test_bad_cost_raises_on_every_rank(comm):
    grads = [np.zeros(4), np.zeros(3)]
    cost = "guess" if comm.rank == 0 else "measured"
    with pytest.raises(bmlmpi.RegistrationMismatch, match="cost|rejected"):
        bmlmpi.GradientBuckets(grads, comm=comm, plan="ibatch", cost=cost)


def test_measured_cost_is_the_same_on_every_rank(comm):
    """The measured startup and per-byte times are agreed (the slowest rank's) and sane."""
    from bmlmpi.training.costs import measured_cost
    grads = [np.zeros(s) for s in (7, 0, 3000, 1, 20_000)]
    c = bmlmpi.Communicator(comm)
    startup, per_byte = measured_cost(c, grads, reps=2)
    everyone = comm.allgather((startup, per_byte))
    assert all(e == everyone[0] for e in everyone)
    assert startup >= 0 and per_byte >= 0
    if comm.size > 1:
        assert startup + per_byte * sum(a.nbytes for a in grads) > 0
    with pytest.raises(ValueError, match="reps"):
        measured_cost(c, grads, reps=0)


def test_misuse_is_an_error_not_a_hang(comm):
    grads = [np.zeros(3), np.zeros(3)]
    b = bmlmpi.GradientBuckets(grads, comm=comm, plan="single")
    try:
        b.mark_ready(1)
        with pytest.raises(RuntimeError, match="marked ready"):
            b.wait(1)                   # its bucket cannot start: array 0 is not ready
        with pytest.raises(RuntimeError, match="twice"):
            b.mark_ready(1)
        b.mark_ready(0)
        b.wait()
    finally:
        b.close()


def test_custom_batching_and_deferred_buckets(comm):
    """A split plan: the front buckets start only after every array is marked, front first."""
    grads = [np.full(10, float(comm.rank + i)) for i in range(5)]
    b = bmlmpi.GradientBuckets(grads, comm=comm, plan=Batching((2, 3, 5), 3))
    try:
        for i in reversed(range(5)):
            b.mark_ready(i)
        b.wait()
        for i in range(5):
            assert np.all(grads[i] == (comm.size - 1) / 2 + i)
    finally:
        b.close()
