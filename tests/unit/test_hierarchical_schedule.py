"""Hierarchical allreduce: nodes, the schedule proved by the verifier on every shape up to 64
ranks, its step counts and tiers, the two-tier network, and the docstring's formulas against
the cost model."""

import math
import random
from fractions import Fraction as F

import numpy as np
import pytest

from bmlmpi import selection
from bmlmpi.model import (
    Calibration,
    SharedMemoryNode,
    TwoTierNetwork,
    algorithm_cost,
    estimate,
    price,
)
from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.hierarchical import (
    MAX_BML_RADIX,
    hierarchical_schedule,
    hierarchical_schedules,
    inter_algorithm,
    theory_t_f,
)
from bmlmpi.schedules.ring import ring_schedules
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.bcube import default_shape, prime_factors
from bmlmpi.topology.links import links_from_nodes, preset
from bmlmpi.topology.nodes import (
    Nodes,
    consecutive_nodes,
    nodes_from_ids,
    nodes_from_placement,
    ranks_per_node_from_env,
    resolve_nodes,
)

# -- nodes ------------------------------------------------------------------------------------


def test_consecutive_nodes_and_remainder():
    n = consecutive_nodes(8, 2)
    assert n.members == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert n.count == 4 and n.max_local == 2 and n.equal
    assert [n.node_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [n.local_rank(r) for r in range(8)] == [0, 1] * 4
    odd = consecutive_nodes(7, 3)
    assert odd.sizes == (3, 3, 1) and not odd.equal
    assert consecutive_nodes(3, 8).members == ((0, 1, 2),)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            consecutive_nodes(4, bad)


def test_nodes_from_ids_and_placement():
    ids = ["b", "a", "b", "a", "c"]
    n = nodes_from_ids(ids)
    assert n.members == ((0, 2), (1, 3), (4,))
    assert nodes_from_placement(links_from_nodes(ids)) == n
    assert nodes_from_placement(links_from_nodes([0] * 5)).members == ((0, 1, 2, 3, 4),)
    with pytest.raises(ValueError, match="not a placement matrix"):
        nodes_from_placement(preset("p3.16xlarge"))
    with pytest.raises(ValueError, match="not a partition"):
        Nodes(((0, 1), (1, 2)))
    with pytest.raises(ValueError, match="not a partition"):
        Nodes(((0, 2),))


def test_resolve_nodes_and_env():
    w = links_from_nodes([0, 0, 1, 1])
    assert resolve_nodes(4, w).members == ((0, 1), (2, 3))
    assert resolve_nodes(4, w, ranks_per_node=4).count == 1  # the pretence wins
    assert resolve_nodes(3).members == ((0, 1, 2),)
    with pytest.raises(ValueError, match="placement matrix has 4 ranks"):
        resolve_nodes(5, w)
    assert ranks_per_node_from_env({}) is None
    assert ranks_per_node_from_env({"BMLMPI_RANKS_PER_NODE": " 2 "}) == 2
    for bad in ("0", "x", "-2", "1.5"):
        with pytest.raises(ValueError, match="BMLMPI_RANKS_PER_NODE"):
            ranks_per_node_from_env({"BMLMPI_RANKS_PER_NODE": bad})


def test_restrict_keeps_survivors_on_their_nodes():
    # What the fault-tolerant communicator does after failures: survivors keep their nodes.
    home = consecutive_nodes(6, 2)
    assert home.restrict(range(6)) == home
    after = home.restrict([0, 2, 3, 5])  # ranks 1 and 4 died
    assert after.members == ((0,), (1, 2), (3,))
    assert home.restrict([0, 1, 4, 5]).members == ((0, 1), (2, 3))  # node 1 gone entirely
    scattered = nodes_from_ids(["a", "b", "a", "b"]).restrict([1, 2, 3])
    assert scattered.members == ((0, 2), (1,))
    for bad in ([], [0, 0], [6], [-1]):
        with pytest.raises(ValueError, match="not distinct ranks"):
            home.restrict(bad)
    # and the schedule over them is proved, as for any unequal nodes
    for c in (0, 1, 7, 1031):
        verify(hierarchical_schedules(4, c, after))


# -- the schedule, proved -----------------------------------------------------------------------


def shape_counts(nodes: Nodes) -> list[int]:
    """0, 1, fewer than the pieces, odd, large."""
    m = nodes.count
    k = len(default_shape(m)) if inter_algorithm(m) == "bml" else 1
    pieces = nodes.max_local * max(m, 1) * max(k, 1)
    return sorted({0, 1, max(pieces - 1, 0), 2 * pieces + 1, 1031, 100_003})


@pytest.mark.parametrize("n", range(1, 65))
def test_verifies_every_size_with_1_to_4_ranks_per_node(n):
    for per_node in range(1, 5):
        nodes = consecutive_nodes(n, per_node)  # unequal where per_node does not divide n
        for c in shape_counts(nodes):
            verify(hierarchical_schedules(n, c, nodes))


def test_verifies_scattered_unequal_nodes():
    rng = random.Random(18)
    for _ in range(60):
        n = rng.randint(1, 24)
        nodes = nodes_from_ids([rng.randrange(max(1, n // 2)) for _ in range(n)])
        for c in shape_counts(nodes):
            verify(hierarchical_schedules(n, c, nodes))


@pytest.mark.parametrize("inter", ["bml", "ring"])
@pytest.mark.parametrize("n,per_node", [(12, 2), (12, 3), (24, 4), (22, 2), (10, 3)])
def test_verifies_each_inter_node_algorithm(inter, n, per_node):
    nodes = consecutive_nodes(n, per_node)
    for c in shape_counts(nodes):
        verify(hierarchical_schedules(n, c, nodes, inter=inter))


def test_verifier_catches_a_broken_hierarchical_schedule():
    nodes = consecutive_nodes(8, 2)
    scheds = hierarchical_schedules(8, 64, nodes)
    s = scheds[3]
    steps = list(s.steps)
    steps.pop()  # rank 3 skips its last allgather step
    scheds[3] = type(s)(s.algorithm, s.rank, s.size, s.count, tuple(steps), s.streams)
    with pytest.raises(ScheduleError):
        verify(scheds)


@pytest.mark.parametrize("m,r", [(1, 4), (2, 2), (4, 2), (8, 2), (9, 3), (6, 4), (11, 2)])
def test_steps_bytes_and_tiers(m, r):
    n = m * r
    nodes = consecutive_nodes(n, r)
    across = inter_algorithm(m)
    k = len(default_shape(m))
    inter_steps = 0 if m == 1 else (2 * k if across == "bml" else 2 * (m - 1))
    count = n * 2 * 3 * 5 * 7 * 11
    for s in hierarchical_schedules(n, count, nodes):
        assert s.nsteps == 2 * (r - 1) + inter_steps
        # every rank sends its node's share: 2(r-1)/r locally, 2(M-1)/M of its shard across
        assert s.sent_elements() == (2 * (r - 1) * count // r + 2 * (m - 1) * count // (m * r))
        for i, st in enumerate(s.steps):
            for t in (*st.sends, *st.recvs):
                local = nodes.node_of(t.peer) == nodes.node_of(s.rank)
                assert local == (t.level == 0), (i, t)
                assert local == (i < r - 1 or i >= r - 1 + inter_steps), (i, t)
                if not local:
                    # the shard's owners only: the same local rank on every node
                    assert nodes.local_rank(t.peer) == nodes.local_rank(s.rank)


def test_inter_node_choice():
    assert inter_algorithm(1) == "bml"
    assert inter_algorithm(12) == "bml"
    assert inter_algorithm(2 * MAX_BML_RADIX) == "bml"
    big_prime = next(p for p in range(MAX_BML_RADIX + 1, 100) if prime_factors(p) == [p])
    assert inter_algorithm(big_prime) == "ring"
    assert inter_algorithm(big_prime, "bml") == "bml"
    with pytest.raises(ValueError, match="inter-node algorithm"):
        inter_algorithm(4, "tree")
    with pytest.raises(ValueError, match="node shape"):
        hierarchical_schedule(0, 8, 10, consecutive_nodes(8, 2), node_shape=(3,))
    with pytest.raises(ValueError, match="nodes describe 8 ranks"):
        hierarchical_schedule(0, 6, 10, consecutive_nodes(8, 2))


def test_explicit_node_shape():
    nodes = consecutive_nodes(16, 2)
    for shape in ((2, 4), (4, 2), (8,)):
        verify(hierarchical_schedules(16, 1001, nodes, node_shape=shape))


# -- the two-tier network and the formulas --------------------------------------------------------


def test_two_tier_routes():
    net = TwoTierNetwork([2, 2, 2, 2], inter="bcube", intra=10)
    assert net.cube.radices == (2, 2)
    assert net.route(0, 1) == (("out", 0), ("in", 1))
    assert net.route(0, 2) == (("up", 0, 0), ("down", 1, 0))           # nodes 0 -> 1
    assert net.route(2, 4) == (("up", 1, 0), ("down", 0, 0),           # nodes 1 -> 2: relay
                               ("up", 0, 1), ("down", 2, 1))
    assert net.route(2, 4, level=2)[0] == ("up", 1, 1)                 # level 1+1 first
    assert net.bandwidth(("out", 3)) == 10 and net.bandwidth(("up", 1, 0)) == 1
    fat = TwoTierNetwork([3, 1], inter="fat-tree")
    assert fat.route(1, 3) == (("up", 0), ("down", 1))
    assert np.array_equal(fat.weights, links_from_nodes([0, 0, 0, 1]))
    with pytest.raises(ValueError, match="has 4 nodes"):
        TwoTierNetwork([2, 2, 2], inter="2x2")


CASES = [(m, r, inter, b) for m in (2, 3, 4, 6, 8, 9) for r in (2, 4)
         for inter in ("fat-tree", "bcube") for b in (1, 10)]


@pytest.mark.parametrize("m,r,inter,b", CASES)
def test_model_matches_the_docstring_formulas(m, r, inter, b):
    net = TwoTierNetwork([r] * m, inter=inter, intra=b)
    n = m * r
    count = n * math.lcm(*range(1, 10))  # no range rounds
    local_first = (r, *default_shape(m))
    got = {
        "hierarchical": price(hierarchical_schedules(n, count, net.nodes), net),
        "ring": price(ring_schedules(n, count), net),
        "bml": price(bml_schedules(n, count, local_first), net),
    }
    for name, cost in got.items():
        assert cost.t_f == theory_t_f(name, m, r, b, inter), name
    k = len(default_shape(m))
    assert got["hierarchical"].nsteps == 2 * (r - 1) + 2 * k
    assert got["ring"].nsteps == 2 * (n - 1)


def test_formula_examples():
    # r = 2, fast intra links, one node level: flat BML 3(M-1)/M, hierarchical 2(M-1)/M + 1/b
    assert theory_t_f("bml", 3, 2, 10**6, "fat-tree") == 2
    assert theory_t_f("hierarchical", 3, 2, 10**6, "fat-tree") == F(4, 3) + F(1, 10**6)
    assert theory_t_f("hierarchical", 4, 2, 10, "bcube") == F(1, 10) + F(3, 4)
    assert theory_t_f("hierarchical", 8, 4, 1, "bcube") == F(3, 2) + F(7, 12)


def test_catalog_prices_hierarchical_on_two_tier_networks():
    net = TwoTierNetwork([2] * 4, inter="bcube", intra=10)
    cost = algorithm_cost("hierarchical", 8 * 720, 4, 8, net)
    assert cost.t_f == theory_t_f("hierarchical", 4, 2, 10, "bcube")
    # without node information (no placement matrix) the ranks form one node: the local ring
    assert algorithm_cost("hierarchical", 100, 4, 8, SharedMemoryNode(8)).nsteps == 2 * 7


def test_auto_considers_hierarchical_only_with_shared_nodes():
    assert "hierarchical" not in selection.candidates(100, 8)
    assert "hierarchical" not in selection.candidates(100, 8, consecutive_nodes(8, 1))
    assert "hierarchical" not in selection.candidates(100, 8, consecutive_nodes(8, 8))
    assert "hierarchical" in selection.candidates(100, 8, consecutive_nodes(8, 2))
    calib = Calibration(alpha=1e-5, beta=1e-9, step_overhead=2e-5, msg_overhead=1e-6,
                        native=((8, 1.0), (1 << 24, 1.0)))  # a very slow native
    nodes = consecutive_nodes(8, 4)
    pick = selection.choose(1 << 16, 4, 8, calib=calib, nodes=nodes)
    assert pick in selection.candidates(1 << 16, 8, nodes)
    times = estimate(selection.candidates(1 << 16, 8, nodes), 1 << 16, 4, 8, calib=calib,
                     nodes=nodes)
    assert pick == min(times, key=times.__getitem__)
    assert "hierarchical" in selection.algorithms()


@pytest.mark.parametrize("sizes", [(2, 2, 2, 2), (3, 3, 3), (4, 4), (3, 1, 2), (2,) * 11],
                         ids=lambda s: "/".join(map(str, s)))
def test_the_executors_plan_runs_it(sizes):
    """Through the executor's Plan and tags, every rank simulated with MPI's matching rules
    (the schedule annotates levels, so the plan runs it in lockstep, one lane)."""
    from test_lanes import plan_of, simulate

    nodes = TwoTierNetwork(sizes).nodes
    n = nodes.size
    for count in (0, 1, 7, 1001):
        scheds = hierarchical_schedules(n, count, nodes)
        assert all(len(plan_of(s).lanes) <= 1 for s in scheds)
        for seed in range(2):
            simulate(scheds, seed)
