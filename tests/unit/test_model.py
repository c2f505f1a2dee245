"""The cost model on cases worked by hand, the BML paper's numbers, and cheapest()."""

import math
from fractions import Fraction as F

import pytest

from bmlmpi.calibrate import _read_cache, _write_cache, fit_overheads
from bmlmpi.model import (
    BCubeNetwork,
    Calibration,
    FatTree,
    LinkMatrixNetwork,
    SharedMemoryNode,
    algorithm_cost,
    cheapest,
    crossover,
    estimate,
    fat_tree_groups,
    price,
    price_symmetric,
)
from bmlmpi.schedules.bml import bml_schedule, bml_schedules
from bmlmpi.schedules.ps import ps_schedule, ps_schedules
from bmlmpi.schedules.ring import ring_schedule, ring_schedules
from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer
from bmlmpi.topology.links import preset


def sched(rank, size, count, steps, name="hand"):
    return Schedule(name, rank, size, count, tuple(Step(tuple(s), tuple(r)) for s, r in steps))


def idle(size, count, nsteps, busy):
    """Schedules for ``size`` ranks: ``busy`` maps rank -> steps, the others do nothing."""
    return [busy.get(r, sched(r, size, count, [((), ())] * nsteps)) for r in range(size)]


# -- hand-worked cases ----------------------------------------------------------------------

def test_two_ranks_exchanging_halves_on_fat_tree():
    c = 10
    s0 = sched(0, 2, c, [([Transfer(1, 5, 10)], [Recv(1, 0, 5, reduce=True)]),
                         ([Transfer(1, 0, 5)], [Recv(1, 5, 10)])])
    s1 = sched(1, 2, c, [([Transfer(0, 0, 5)], [Recv(0, 5, 10, reduce=True)]),
                         ([Transfer(0, 5, 10)], [Recv(0, 0, 5)])])
    cost = price([s0, s1], FatTree(2))
    assert cost.step_t_f() == [F(1, 2), F(1, 2)]
    assert cost.t_f == 1  # 2(N-1)/N T_F at N = 2
    # seconds: 2 steps of alpha plus T_F = count * itemsize * beta
    assert cost.seconds(4, alpha=1e-6, beta=1e-9) == pytest.approx(2e-6 + 40e-9)


def test_ring_on_four_servers_fat_tree():
    cost = price(ring_schedules(4, 400), FatTree(4))
    assert cost.nsteps == 6
    assert cost.step_t_f() == [F(1, 4)] * 6
    assert cost.t_f == F(3, 2)  # 2 * 3/4


def test_bcube_3x3_bml_walkthrough():
    cost = price(bml_schedules(9, 18 * 5, (3, 3)), BCubeNetwork((3, 3)))
    t_c = F(1, 18)
    assert cost.step_t_f() == [6 * t_c, 2 * t_c, 2 * t_c, 6 * t_c]
    assert cost.t_f == F(16, 18) == F(8, 9)


def test_two_hop_transfer_loads_two_nic_pairs():
    net = BCubeNetwork((3, 3))
    # 0 = digits (0,0) to 4 = (1,1): relayed by 1 = (1,0) when digit 0 is fixed first
    assert net.route(0, 4) == (("up", 0, 0), ("down", 1, 0), ("up", 1, 1), ("down", 4, 1))
    # the transfer's level goes first: through 3 = (0,1)
    assert net.route(0, 4, level=1) == (("up", 0, 1), ("down", 3, 1), ("up", 3, 0),
                                        ("down", 4, 0))
    m = 7
    alone = idle(9, 100, 1, {0: sched(0, 9, 100, [([Transfer(4, 0, m)], ())])})
    assert price(alone, net).time == m
    # the relay's own level-1 send to 4 shares its level-1 uplink with the relayed one
    both = idle(9, 100, 1, {0: sched(0, 9, 100, [([Transfer(4, 0, m)], ())]),
                            1: sched(1, 9, 100, [([Transfer(4, 0, m, level=1)], ())])})
    cost = price(both, net)
    assert cost.time == 2 * m
    assert cost.steps[0].link in {("up", 1, 1), ("down", 4, 1)}


def test_level_that_the_addresses_do_not_differ_in_is_an_error():
    with pytest.raises(ValueError, match="agree in digit 1"):
        BCubeNetwork((3, 3)).route(0, 1, level=1)
    with pytest.raises(ValueError, match="itself"):
        FatTree(4).route(2, 2)


def test_link_matrix_bandwidths_and_shared_pcie_port():
    w = preset("p3.16xlarge")
    net = LinkMatrixNetwork(w, name="p3.16xlarge")
    assert w[0, 3] == 3 and w[0, 1] == 2 and w[0, 5] == 1
    m = 10

    def one_step(sends):
        return idle(8, 100, 1, {0: sched(0, 8, 100, [(sends, ())])})

    assert price(one_step([Transfer(3, 0, m)]), net).time == F(m, 2)   # double NVLink
    assert price(one_step([Transfer(1, 0, m)]), net).time == m         # single NVLink
    assert price(one_step([Transfer(5, 0, m)]), net).time == F(5 * m, 2)  # PCIe 2/5
    # two PCIe transfers from rank 0 share its host port; NVLinks to other peers do not
    assert price(one_step([Transfer(5, 0, m), Transfer(6, 0, m)]), net).time == 5 * m
    assert price(one_step([Transfer(1, 0, m), Transfer(3, 0, m)]), net).time == m
    z = [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    with pytest.raises(ValueError, match="no link"):
        LinkMatrixNetwork(z).route(0, 2)
    with pytest.raises(ValueError, match="no bandwidth for link weight 5"):
        LinkMatrixNetwork([[0, 5], [5, 0]]).bandwidth(("link", 0, 1, 5.0))


def test_shared_memory_bus_is_shared_by_every_transfer():
    n, count = 4, 400
    free = price(ps_schedules(n, count), SharedMemoryNode(n))
    bus = price(ps_schedules(n, count), SharedMemoryNode(n, bus=2))
    assert free.t_f == F(3, 2)
    # the push moves N(N-1) shards of count/N through one bus of bandwidth 2
    assert bus.step_t_f() == [F(n * (n - 1), n * 2)] * 2
    assert price_symmetric(ps_schedule(0, n, count), SharedMemoryNode(n, bus=2)).t_f == bus.t_f


def test_seconds_counts_only_active_steps_and_all_terms():
    c = 8
    quiet = idle(2, c, 2, {0: sched(0, 2, c, [([Transfer(1, 0, 8)], ()), ((), ())]),
                           1: sched(1, 2, c, [((), [Recv(0, 0, 8, reduce=True)]), ((), ())])})
    cost = price(quiet, FatTree(2))
    assert [s.active for s in cost.steps] == [True, False]
    t = cost.seconds(2, alpha=1.0, beta=0.5, step_overhead=0.25, msg_overhead=0.125,
                     gamma=1 / 16)
    # one step: alpha + overhead + 1 message + 8 elements * 2 B * beta + 8 reduced * 2 B * gamma
    assert t == pytest.approx(1.0 + 0.25 + 0.125 + 8 + 1)


# -- symmetry ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 3), (2, 3), (4, 2), (2, 2, 2), (5,)],
                         ids=lambda s: "x".join(map(str, s)))
def test_symmetric_pricing_equals_full_pricing(shape):
    n = math.prod(shape)
    count = len(shape) * n * 3
    for net in (BCubeNetwork(shape), FatTree(n), SharedMemoryNode(n)):
        assert price_symmetric(bml_schedule(0, n, count, shape), net).steps == \
            price(bml_schedules(n, count, shape), net).steps
        assert price_symmetric(ps_schedule(0, n, count), net).steps == \
            price(ps_schedules(n, count), net).steps
    for net in (FatTree(n), SharedMemoryNode(n)):
        assert price_symmetric(ring_schedule(0, n, count, 2), net).steps == \
            price(ring_schedules(n, count, 2), net).steps


def test_counts_below_the_piece_count_price_every_rank():
    # with empty ranges, unevenly placed, rank 0 no longer stands for the others
    net = SharedMemoryNode(5)
    assert algorithm_cost("ring", 2, 4, 5, net).steps == price(ring_schedules(5, 2), net).steps
    assert algorithm_cost("ps", 3, 4, 5, net).steps == price(ps_schedules(5, 3), net).steps
    assert algorithm_cost("ring", 2, 4, 5, net).nsteps == 8  # one sender per step, 2(N-1)


def test_symmetric_pricing_needs_a_symmetric_network():
    with pytest.raises(ValueError, match="no rank-transitive symmetry"):
        price_symmetric(ring_schedule(0, 8, 8), LinkMatrixNetwork(preset("p3.16xlarge")))


# -- the paper's numbers ------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(3, 2), (4, 2), (2, 3), (4, 3), (32, 2)])
def test_table_ii_gst(n, k):
    size = n ** k
    count = k * size * 2
    shape = (n,) * k
    bml = price_symmetric(bml_schedule(0, size, count, shape), BCubeNetwork(shape))
    assert bml.t_f == F(2 * (size - 1), k * size)
    if size <= 64:
        ps = price(ps_schedules(size, count), FatTree(size))
        ring = price(ring_schedules(size, count), FatTree(size))
        assert ps.t_f == ring.t_f == F(2 * (size - 1), size)
        assert ring.t_f != F(size, size - 1)  # the Table II transcription in seed 001


@pytest.mark.parametrize("ports,n", [(4, 4), (16, 32)])
def test_fig5_bars(ports, n):
    size = n * n
    assert math.prod(fat_tree_groups(ports)) == size
    count = 6 * size  # 2 and 3 pipelines (BCube and Fat-Tree hierarchy) split it evenly
    bcube = BCubeNetwork((n, n))
    bml = price_symmetric(bml_schedule(0, size, count, (n, n)), bcube).t_f
    ps_bcube = price_symmetric(ps_schedule(0, size, count), bcube).t_f
    hier = price_symmetric(bml_schedule(0, size, count, fat_tree_groups(ports)),
                           FatTree(size)).t_f
    ps_ft = price_symmetric(ps_schedule(0, size, count), FatTree(size)).t_f
    assert bml == F(size - 1, size)
    assert hier == ps_ft == F(2 * (size - 1), size)  # "the same GST as PS in Fat-Tree"
    # flat PS relays each 2-hop transfer: (n-1)/n of the buffer per NIC, push and pull
    assert ps_bcube == F(2 * (n - 1), n)


def test_fat_tree_groups():
    assert fat_tree_groups(4) == (2, 2, 4)
    assert fat_tree_groups(16) == (8, 8, 16)
    with pytest.raises(ValueError):
        fat_tree_groups(5)


# -- calibration and cheapest --------------------------------------------------------------------

def test_native_interpolation():
    c = Calibration(alpha=1e-6, beta=1e-9, native=((1000, 2.0), (10, 1.0), (100, 1.0)))
    assert c.native == ((10, 1.0), (100, 1.0), (1000, 2.0))
    assert c.native_seconds(1) == 1.0
    assert c.native_seconds(550) == pytest.approx(1.5)
    assert c.native_seconds(1900) == pytest.approx(3.0)  # extrapolated along the last segment
    assert Calibration(alpha=0, beta=0).native_seconds(5) is None
    with pytest.raises(ValueError, match="alpha"):
        Calibration(alpha=-1.0, beta=0.0)


def test_cheapest_follows_alpha_and_beta():
    names = ["ring", "bml", "ps", "tree"]
    # latency only: the fewest steps (ps: 2, bml on 2x2: 4, tree: 4, ring: 6)
    assert cheapest(names, 1000, 4, 4, alpha=1e-3, beta=0.0) == "ps"
    # bandwidth only: ring, bml and ps all move 2(N-1)/N of the buffer; tree moves it all
    t = estimate(names, 1 << 20, 4, 4, alpha=0.0, beta=1e-9)
    assert t["ring"] == pytest.approx(t["bml"]) == pytest.approx(t["ps"])
    assert t["tree"] > 2 * t["ring"]
    assert cheapest(names, 1 << 20, 4, 4, alpha=0.0, beta=1e-9) == "ring"  # ties: first


def test_cheapest_native_small_schedule_large():
    calib = Calibration(alpha=50e-6, beta=1e-9, native=((8, 10e-6), (1 << 20, 20e-3)))
    assert cheapest(["bml", "native"], 2, 4, 4, calib=calib) == "native"
    assert cheapest(["bml", "native"], 1 << 20, 4, 4, calib=calib) == "bml"
    with pytest.raises(ValueError, match="no estimate for any"):
        cheapest(["native"], 10, 4, 4, alpha=1e-6, beta=1e-9)


def test_crossover_single_vs_multi_tree():
    calib = Calibration(alpha=10e-6, beta=1 / 25e9, msg_overhead=20e-6)
    net = LinkMatrixNetwork(preset("p3.16xlarge"))
    x = crossover("tree", "multitree", 4, 8, net, calib=calib)
    assert x is not None and x > 8
    below = estimate(["tree", "multitree"], x // 2, 4, 8, net, calib=calib)
    above = estimate(["tree", "multitree"], x * 2, 4, 8, net, calib=calib)
    assert below["tree"] < below["multitree"] and above["multitree"] < above["tree"]


def test_fit_overheads_recovers_synthetic_terms():
    alpha, per_step, per_msg = 5e-6, 3e-6, 2e-6
    runs = [(s, m, s * (alpha + per_step) + m * per_msg) for s, m in [(6, 12), (2, 6), (4, 12)]]
    o_step, o_msg = fit_overheads(alpha, runs)
    assert o_step == pytest.approx(per_step) and o_msg == pytest.approx(per_msg)
    # N = 2: every schedule is 2 steps of 2 messages; all of it goes per step
    o_step, o_msg = fit_overheads(alpha, [(2, 4, 30e-6), (2, 4, 30e-6)])
    assert o_msg == 0 and o_step == pytest.approx(15e-6 - alpha)


def test_corrections_interpolate_in_log_size_and_scale_the_model():
    fixes = (("multitree", 1 << 20, 4.0), ("multitree", 64 << 10, 2.0), ("bml", 1 << 16, 0.5))
    c = Calibration(alpha=10e-6, beta=1e-10, native=((8, 5e-6), (1 << 20, 1e-3)),
                    corrections=fixes)
    assert c.correction("multitree", 1024) == 2.0                    # below: nearest
    assert c.correction("multitree", 1 << 18) == pytest.approx(3.0)  # halfway in log2
    assert c.correction("multitree", 1 << 30) == 4.0                 # above: nearest
    assert c.correction("ring", 1 << 20) == 1.0                      # not measured
    plain = Calibration(alpha=10e-6, beta=1e-10, native=c.native)
    for count in (1 << 14, 1 << 16, 1 << 20):
        with_fix = estimate(["multitree", "bml", "ring"], count, 4, 4, calib=c)
        without = estimate(["multitree", "bml", "ring"], count, 4, 4, calib=plain)
        for name in with_fix:
            assert with_fix[name] == pytest.approx(
                without[name] * c.correction(name, count * 4)), (name, count)
        assert estimate(["multitree"], count, 4, 4, calib=c, corrected=False) == \
            pytest.approx({"multitree": without["multitree"]})
    # a corrected model changes the choice: here the measured factor rules multitree out
    t = estimate(["multitree", "ring"], 1 << 20, 4, 4, calib=plain)
    assert t["multitree"] < 4 * t["ring"]
    slow = Calibration(alpha=10e-6, beta=1e-10, corrections=(("multitree", 1 << 22, 1e3),))
    assert cheapest(["multitree", "ring"], 1 << 20, 4, 4, calib=slow) == "ring"
    # explicit topologies are other machines: no correction
    net = SharedMemoryNode(4)
    assert estimate(["multitree"], 1 << 20, 4, 4, net, calib=slow) == \
        pytest.approx(estimate(["multitree"], 1 << 20, 4, 4, net, calib=plain))
    with pytest.raises(ValueError, match="corrections"):
        Calibration(alpha=0, beta=0, corrections=(("bml", 8, 0.0),))


def test_calibration_broadcast_vector_round_trip():
    from bmlmpi.calibrate import CORRECTION_BYTES, _pack, _unpack
    from bmlmpi.schedules.algorithms import corrected
    fixes = tuple((a, b, 1.0 + i / 10) for i, (a, b) in
                  enumerate((a, b) for a in corrected() for b in CORRECTION_BYTES))
    c = Calibration(alpha=1e-6, beta=2e-10, step_overhead=3e-6, msg_overhead=1e-6,
                    gamma=1e-11, native=((8, 1e-6), (1 << 20, 1e-3)), corrections=fixes)
    back = _unpack(_pack(c), {})
    assert back == c and back.corrections == c.corrections
    assert _unpack(_pack(None), {}) is None
    # the other collectives' native points travel too
    from bmlmpi.calibrate import FAMILY, FAMILY_BYTES
    natives = tuple((coll, b * 8, 1e-6 * (i + 1)) for i, coll in enumerate(FAMILY)
                    for b in FAMILY_BYTES)
    c2 = Calibration(alpha=1e-6, beta=2e-10, native=((8, 1e-6),), natives=natives)
    assert _unpack(_pack(c2), {}).natives == c2.natives
    assert c2.native_seconds(64, "bcast") == 4e-6
    assert c2.native_seconds(64, "reduce") == 3e-6 and c2.native_seconds(64) == 1e-6


def test_cache_round_trip(tmp_path):
    path = tmp_path / "calib-h-mpi.json"
    c = Calibration(alpha=1e-6, beta=2e-10, step_overhead=3e-6, native=((8, 1e-6),),
                    corrections=(("ring", 65536, 1.25),))
    assert _read_cache(path, "ranks=4,nodes=1") is None
    _write_cache(path, "ranks=4,nodes=1", c, "h", "mpi")
    _write_cache(path, "ranks=2,nodes=1", Calibration(alpha=1.0, beta=1.0), "h", "mpi")
    assert _read_cache(path, "ranks=4,nodes=1") == c
    assert _read_cache(path, "ranks=9,nodes=1") is None
    path.write_text("{not json")
    assert _read_cache(path, "ranks=4,nodes=1") is None


def test_auto_keeps_native_unless_a_schedule_is_clearly_faster(monkeypatch):
    from bmlmpi import selection
    assert selection.prefer_kept({"bml": 1.0, "ring": 2.0, "native": 1.05}) == "native"
    assert selection.prefer_kept({"bml": 1.0, "ring": 2.0, "native": 1.2}) == "bml"
    assert selection.prefer_kept({"bml": 1.0, "native": 0.5}) == "native"
    assert selection.prefer_kept({"bml": 1.0, "ring": 0.9}) == "ring"  # no native measured
    assert selection.prefer_kept({"bml": 1.0, "native": 1.05}, margins={"native": 1.0}) == "bml"
    # selection.choose applies it to the calibrated model's prices
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    monkeypatch.delenv("BMLMPI_TREE_ARRAY_BOUND", raising=False)
    calib = Calibration(alpha=10e-6, beta=1e-10, native=((8, 5e-6), (1 << 24, 1e-3)))
    for count in (1, 1 << 12, 1 << 18, 1 << 22):
        t = estimate(selection.candidates(count, 4), count, 4, 4, calib=calib)
        assert selection.choose(count, 4, 4, calib) == selection.prefer_kept(t)
