import math

import pytest

from bmlmpi.schedules.bml import bml_schedule, bml_schedules
from bmlmpi.schedules.verify import verify
from bmlmpi.topology.bcube import BCube, default_shape

EXPLICIT = [(3, 3), (2, 2, 2), (2, 3), (3, 2), (2, 2, 3), (3, 2, 2), (4, 4), (4, 2), (2, 4),
            (5, 3), (6,), (4, 4, 2), (2, 3, 5)]


def counts(shape):
    n, k = math.prod(shape), max(len(shape), 1)
    return sorted({0, 1, k * n - 1, k * n + 1, 10_007})


@pytest.mark.parametrize("n", range(1, 65))
def test_default_shape_verifies(n):
    shape = default_shape(n)
    for c in counts(shape):
        verify(bml_schedules(n, c, shape))


@pytest.mark.parametrize("shape", EXPLICIT, ids=lambda s: "x".join(map(str, s)))
def test_explicit_shapes_verify(shape):
    n = math.prod(shape)
    for c in counts(shape):
        verify(bml_schedules(n, c, shape))


@pytest.mark.parametrize("shape", [(3, 3), (2, 2, 3), (4, 4), (2, 2, 2, 2), (7,)],
                         ids=lambda s: "x".join(map(str, s)))
def test_steps_and_bytes_match_theory(shape):
    n, k = math.prod(shape), len(shape)
    count = k * n * 6  # divisible: every piece has 6 elements
    cube = BCube(shape)
    for s in bml_schedules(n, count, shape):
        assert s.nsteps == 2 * k
        assert s.sent_elements() == 2 * (n - 1) * count // n
        assert s.received_elements() == 2 * (n - 1) * count // n
        for w, step in enumerate(s.steps):
            # one level per pipeline per step, all k levels busy, and only group peers
            levels = {t.level for t in step.sends}
            assert levels == set(range(k))
            for t in (*step.sends, *step.recvs):
                assert t.peer in cube.group(s.rank, t.level)
                assert t.stream == (t.level - (w if w < k else 2 * k - 1 - w)) % k
            for lv in range(k):
                # pipeline e at reduce-scatter step w sends (n_l - 1) * N / (n_L0...n_Lw) pieces
                sent = sum(t.n for t in step.sends if t.level == lv)
                e = (lv - (w if w < k else 2 * k - 1 - w)) % k
                order = [(e + j) % k for j in range(k)]
                depth = w if w < k else 2 * k - 1 - w
                pieces = (shape[lv] - 1) * n // math.prod(shape[x] for x in order[:depth + 1])
                assert sent == pieces * 6


@pytest.mark.parametrize("shape", [(2,), (3,), (2, 2), (3, 3), (2, 3), (2, 2, 3)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pipeline", [2, 3, 7])
def test_pipelined_schedules_verify_and_cut_each_reduce_scatter_step(shape, pipeline):
    n, k = math.prod(shape), len(shape)
    for c in counts(shape) + [k * n * pipeline * 3]:
        piped = bml_schedules(n, c, shape, pipeline)
        verify(piped)
        for plain, s in zip(bml_schedules(n, c, shape), piped, strict=True):
            assert s.nsteps == k * (pipeline + 1)
            assert s.sent_elements() == plain.sent_elements()
            assert s.steps[k * pipeline:] == plain.steps[k:]  # the allgather as it was
            for w in range(k):  # sub-steps of step w: its transfers cut in order
                subs = s.steps[w * pipeline:(w + 1) * pipeline]
                for kind in ("sends", "recvs"):
                    whole = getattr(plain.steps[w], kind)
                    got = [t for sub in subs for t in getattr(sub, kind)]
                    for t in whole:
                        parts = sorted((u.lo, u.hi) for u in got
                                       if (u.peer, u.level, u.stream) == (t.peer, t.level,
                                                                          t.stream)
                                       and t.lo <= u.lo and u.hi <= t.hi)
                        assert parts[0][0] == t.lo and parts[-1][1] == t.hi
                        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    with pytest.raises(ValueError, match="pipeline"):
        bml_schedule(0, 2, 10, (2,), 0)


def test_bcube_3x3_walkthrough_matches_paper():
    # Fig. 4: per-NIC time 6, 2, 2, 6 piece-times (T_C) per step, 16 T_C in all.
    count = 18 * 100
    s = bml_schedule(0, 9, count, (3, 3))
    per_step = [max(sum(t.n for t in st.sends if t.level == lv) for lv in (0, 1)) // 100
                for st in s.steps]
    assert per_step == [6, 2, 2, 6]
    assert sum(per_step) == 16


def test_uneven_counts_balance():
    # 101 elements over k*N = 36 pieces: every piece holds 2 or 3 elements, so a transfer of
    # p pieces holds between 2p and 3p elements.
    shape, n, count = (2, 2, 3), 12, 101
    for s in bml_schedules(n, count, shape):
        first = s.steps[0]
        for t in first.sends:
            pieces = (shape[t.level] - 1) and n // shape[t.level]
            assert 2 * pieces <= t.n <= 3 * pieces


def test_bad_arguments():
    with pytest.raises(ValueError, match="servers"):
        bml_schedule(0, 8, 10, (3, 3))
    with pytest.raises(ValueError, match="rank"):
        bml_schedule(9, 9, 10, (3, 3))
    with pytest.raises(ValueError, match="negative"):
        bml_schedule(0, 9, -1, (3, 3))


def test_large_bcube_one_rank_is_fast_and_small():
    s = bml_schedule(12345, 65536, 10**8, (16, 16, 16, 16))
    assert s.nsteps == 8
    assert sum(len(st.sends) for st in s.steps) == 2 * 4 * 4 * 15
