"""Recovery schedules for the survivors (no MPI): verified for every failure set asked for."""

import itertools
import math
from fractions import Fraction

import pytest

from bmlmpi.ft.recovery import (
    MAX_PLANNED_SERVERS,
    RecoveryError,
    bcube_recovery_schedule,
    bcube_recovery_schedules,
    candidate_schedules,
    fresh_bml_schedule,
    fresh_shape,
    nic_piece_times,
    recovery_pieces,
    recovery_plan,
)
from bmlmpi.ft.rescale import rescaled_batch
from bmlmpi.model import BCubeNetwork, BCubeWithout, price
from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.verify import verify
from bmlmpi.topology.bcube import BCube

# BCube(n, k) as radices: BCube(3,2), BCube(2,3), BCube(4,2) — the three cubes
REQUIRED = [(3, 3), (2, 2, 2), (4, 4)]


#: Up to this many servers every pair of dead servers is tried; on a larger cube, the pairs
#: with server 0. BCube is vertex-transitive (permuting one digit's values maps the cube onto
#: itself), so every pair is the image of a pair with server 0: every kind of double failure is
#: still verified, and every single one, while the 4x4 cube's 120 pairs (each a recovery
#: search of seconds) would cost the test command minutes.
EXHAUSTIVE_SERVERS = 9


def dead_sets(n: int):
    """No failure, every single failure, and the double failures (see EXHAUSTIVE_SERVERS)."""
    yield ()
    yield from ((d,) for d in range(n))
    if n <= EXHAUSTIVE_SERVERS:
        yield from itertools.combinations(range(n), 2)
    else:
        yield from ((0, d) for d in range(1, n))


def counts(n_live: int, k: int) -> list[int]:
    pieces = k * n_live
    return [0, 1, pieces - 1, 3 * pieces + 1, 1000]


def live_of(n: int, dead) -> list[int]:
    return [r for r in range(n) if r not in dead]


@pytest.mark.parametrize("shape", REQUIRED, ids=lambda s: "x".join(map(str, s)))
def test_failure_sets_of_up_to_two_servers_verify(shape):
    n, k = math.prod(shape), len(shape)
    cube = BCube(shape)
    for dead in dead_sets(n):
        live = live_of(n, dead)
        for count in counts(len(live), k):
            scheds = bcube_recovery_schedules(shape, dead, count)
            verify(scheds, live=live)
            for s in scheds:
                assert s.participants == tuple(live)
                for st in s.steps:
                    for t in (*st.sends, *st.recvs):
                        # survivors keep their addresses: only BCube links (one switch), and
                        # the transfer's level is the digit in which the two servers differ
                        differ = [lv for lv in range(k)
                                  if cube.digit(s.rank, lv) != cube.digit(t.peer, lv)]
                        assert differ == [t.level], (dead, s.rank, t)


@pytest.mark.parametrize("shape", [(3, 2), (2, 3), (2, 4), (2, 2, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mixed_radix_cubes_with_one_or_two_dead(shape):
    n = math.prod(shape)
    for dead in dead_sets(n):
        live = live_of(n, dead)
        verify(bcube_recovery_schedules(shape, dead, 257), live=live)


@pytest.mark.parametrize("shape", REQUIRED, ids=lambda s: "x".join(map(str, s)))
def test_work_is_repartitioned_into_k_times_survivors_balanced_pieces(shape):
    n, k = math.prod(shape), len(shape)
    for dead in [(), (0,), (1, n - 1)]:
        live = live_of(n, dead)
        count = 10 * k * len(live) + 3
        per_pipeline = recovery_pieces(shape, dead, count)
        assert len(per_pipeline) == k
        for pieces in per_pipeline:
            assert sorted(o for o, _, _ in pieces) == live  # one piece per survivor
            sizes = [hi - lo for _, lo, hi in pieces]
            assert max(sizes) - min(sizes) <= 1
        ranges = sorted((lo, hi) for pieces in per_pipeline for _, lo, hi in pieces)
        assert ranges[0][0] == 0 and ranges[-1][1] == count
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert bcube_recovery_schedule(live[0], shape, dead, count).meta["pieces"] == \
            k * len(live)


@pytest.mark.parametrize("shape", [(3, 3), (2, 2, 2), (4, 4), (2, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_without_failures_it_is_bml(shape):
    n, k = math.prod(shape), len(shape)
    count = 6 * k * n + 5
    ours = bcube_recovery_schedules(shape, (), count)
    theirs = bml_schedules(n, count, shape)
    for a, b in zip(ours, theirs, strict=True):
        assert a.nsteps == b.nsteps == 2 * k
        for sa, sb in zip(a.steps, b.steps, strict=True):
            assert sorted(map(repr, sa.sends)) == sorted(map(repr, sb.sends))
            assert sorted(map(repr, sa.recvs)) == sorted(map(repr, sb.recvs))


def test_seed_example_bcube_3_2_without_server_0_0():
    """Seed 001: BCube(3,2) without [0,0], 2·8 = 16 pieces (T_C = T_F/16).

    The schedule that runs is the searched one (timed trees, tests/unit/test_recovery_search.py):
    BML's 4 steps, the busiest NIC (sent or received, per level) carrying 4 pieces in each:
    16·T_C = T_F, against the seed's 18·T_C = 9/8·T_F.

    The relay planner's schedule, priced beside it, costs 20·T_C = 5/4·T_F: its depth-0 main
    step is BML's (a server of a complete row/column sends the pieces of the other two, 3 + 3 =
    6), the stand-in's NIC adds the first hop of the auxiliary transfer round dead [0,0] to the
    depth-1 main step (3), the second hop is a step of its own (1), and the allgather mirrors it.
    """
    piece = 100
    scheds = bcube_recovery_schedules((3, 3), [0], 16 * piece)
    verify(scheds, live=list(range(1, 9)))
    assert {s.meta["plan"] for s in scheds} == {"trees T=2"}
    per_step = nic_piece_times(scheds, piece)
    assert per_step == [4, 4, 4, 4]
    # the cost model prices it the same way on the cube without [0,0]: 16/16 = T_F
    cost = price(scheds, BCubeWithout("3x3", [0]))
    assert cost.t_f == 1
    assert [x * 16 for x in cost.step_t_f()] == per_step
    plan = recovery_plan((3, 3), frozenset({0}))
    relays = next(c for c in plan.candidates if c.label == "relays")
    assert relays.t_c == 20 and relays.nsteps == 6 and relays.t_c > plan.chosen.t_c
    relay_scheds = candidate_schedules(relays, (3, 3), [0], 16 * piece)
    verify(relay_scheds, live=list(range(1, 9)))
    assert nic_piece_times(relay_scheds, piece) == [6, 3, 1, 1, 3, 6]
    # the auxiliary step relays dead [0,0]'s share through a live server of another row
    relays_at = {s.rank for s in relay_scheds if s.steps[2].sends}
    assert relays_at and 0 not in relays_at
    # healthy BCube(3,2) BML for comparison: 16·T_C' = 8/9·T_F (T_C' = T_F/18)
    assert price(bml_schedules(9, 18 * piece, (3, 3)), BCubeNetwork("3x3")).t_f == \
        Fraction(8, 9)


def test_two_dead_neighbours_of_a_hypercube_need_longer_routes():
    # BCube(2,3) without 0 and 3: servers 1 and 2 lose both of their common neighbours, so
    # the planner goes further round (or splits / redirects parts) and still verifies
    scheds = bcube_recovery_schedules((2, 2, 2), [0, 3], 180)
    verify(scheds, live=[1, 2, 4, 5, 6, 7])
    assert max(s.nsteps for s in scheds) > 6


def test_unreachable_survivors_raise():
    # BCube(2,2) is a 4-cycle 0-1-3-2-0: without 1 and 2, servers 0 and 3 are cut apart
    with pytest.raises(RecoveryError, match="cannot reach"):
        bcube_recovery_schedule(0, (2, 2), [1, 2], 10)


def test_bad_arguments():
    with pytest.raises(ValueError, match="not a live server"):
        bcube_recovery_schedule(0, (3, 3), [0], 10)
    with pytest.raises(ValueError, match="outside"):
        bcube_recovery_schedule(1, (3, 3), [9], 10)
    with pytest.raises(ValueError, match="negative"):
        bcube_recovery_schedule(1, (3, 3), [0], -1)
    with pytest.raises(RecoveryError, match="limit"):
        side = math.isqrt(MAX_PLANNED_SERVERS) + 1
        bcube_recovery_schedule(1, (side, side), [0], 10)


@pytest.mark.parametrize("survivors", range(1, 17))
def test_fresh_bcube_over_the_survivors_verifies(survivors):
    k = max(len(fresh_shape(survivors)), 1)
    for count in (0, 1, 5 * k * survivors + 1):
        verify([fresh_bml_schedule(r, survivors, count) for r in range(survivors)])


def test_rescaled_batch():
    assert rescaled_batch(32.0, 9, 1) == pytest.approx(32 + 32 / 8)
    assert rescaled_batch(30, 4, 1) == 40
    assert rescaled_batch(32, 9, 0) == 32
    # integers without rank: nearest, ties up (32·9/8 = 36; 10·3/2 = 15; 1·3/2 = 1.5 -> 2)
    assert rescaled_batch(32, 9, 1) == 36
    assert rescaled_batch(1, 3, 1) == 2
    # with rank: the survivors' batches add up to the old global batch exactly
    for u, n, x in [(32, 9, 2), (7, 5, 3), (1, 8, 1), (100, 7, 6)]:
        split = [rescaled_batch(u, n, x, rank=r) for r in range(n - x)]
        assert sum(split) == u * n
        assert max(split) - min(split) <= 1
    with pytest.raises(ValueError):
        rescaled_batch(32, 4, 4)
    with pytest.raises(ValueError):
        rescaled_batch(-1, 4, 1)
    with pytest.raises(ValueError):
        rescaled_batch(32, 4, 1, rank=3)
    with pytest.raises(TypeError):
        rescaled_batch(32, 4.0, 1)
