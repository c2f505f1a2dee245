"""The collective family's schedules (reduce-scatter, allgather, reduce, broadcast), proven by
the verifier against each collective's own contract, for every algorithm the records list;
the verifier's new rules reject what they must; a toy algorithm registered here alone is
built, verified, priced, calibrated, chosen by name and swept by ``bmlmpi-bench``, and
considered by ``auto`` only once its record opts in."""

from __future__ import annotations

import dataclasses

import pytest

from bmlmpi import calibrate, selection
from bmlmpi.cli import bench
from bmlmpi.model import Calibration, SharedMemoryNode, algorithm_cost, estimate
from bmlmpi.schedules import algorithms
from bmlmpi.schedules.algorithms import Algorithm, Context
from bmlmpi.schedules.collectives import NAMES
from bmlmpi.schedules.types import Copy, Recv, Schedule, Step, Transfer, balanced_bounds, compact
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.bcube import default_shape

FAMILY = ("reduce_scatter", "allgather", "reduce", "bcast")


def block_cases(size: int) -> list[tuple[int, ...]]:
    """Block counts: all zero, one each, fewer elements than ranks, odd and uneven with zeros,
    large equal blocks."""
    cases = [(0,) * size, (1,) * size, tuple(1 if i == size // 2 else 0 for i in range(size)),
             tuple((i * 7 + 3) % 5 for i in range(size)), (97,) * size]
    return list(dict.fromkeys(cases))


def contexts(coll: str, size: int, shape=None):
    if coll in ("reduce_scatter", "allgather"):
        for counts in block_cases(size):
            yield Context(size, sum(counts), 4, collective=coll, counts=counts, shape=shape)
    else:
        for count in (0, 1, size - 1, 2 * size + 1, 1000):
            for root in sorted({0, size // 2, size - 1}):
                yield Context(size, max(count, 0), 4, collective=coll, root=root, shape=shape)


def names_for(coll: str, size: int) -> list[str]:
    names = algorithms.scheduled(coll)
    if size > 16:  # multi-tree sets cost seconds of CPU to generate at many ranks
        names = [n for n in names if n != "multitree"]
    return names


@pytest.mark.parametrize("coll", FAMILY)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12])
def test_every_family_schedule_verifies_small(coll, size):
    for name in names_for(coll, size):
        for ctx in contexts(coll, size):
            scheds = algorithms.schedules(name, ctx)
            assert all(s.collective == coll for s in scheds)
            verify(scheds)


@pytest.mark.parametrize("coll", FAMILY)
def test_every_family_schedule_verifies_up_to_64_ranks(coll):
    for size in range(13, 65):
        for name in names_for(coll, size):
            counts = tuple((i * 5 + 1) % 4 for i in range(size))
            if coll in ("reduce_scatter", "allgather"):
                ctx = Context(size, sum(counts), 4, collective=coll, counts=counts)
            else:
                ctx = Context(size, 3 * size + 1, 4, collective=coll, root=size // 3)
            verify(algorithms.schedules(name, ctx))


def test_every_bcube_factorisation_verifies():
    for shape in [(2, 2), (3, 3), (2, 3), (3, 2), (2, 2, 3), (2, 2, 2), (4, 4), (3, 3, 3)]:
        size = 1
        for n in shape:
            size *= n
        for coll in FAMILY:
            if "bml" not in algorithms.scheduled(coll):
                continue
            for ctx in contexts(coll, size, shape):
                verify(algorithms.schedules("bml", ctx))


def two_tier_cases():
    from bmlmpi.topology.nodes import Nodes, consecutive_nodes
    cases = [consecutive_nodes(n, r) for n in (2, 4, 6, 8, 9, 12) for r in (2, 3, 4) if r < n]
    return cases + [Nodes(((0, 1, 2), (3,), (4, 5))), Nodes(((0, 3), (1, 2, 4, 5), (6,)))]


@pytest.mark.parametrize("intra", ["ring", "shm"])
def test_hierarchical_reduce_and_bcast_verify_on_two_tiers(intra):
    """Both node tiers: the ring, and shared memory (one chunk, and chunks of 16 bytes: many,
    pipelined), where the root's node also hands the shards between root and owners through
    the segments."""
    from bmlmpi.schedules.hierarchical import hierarchical_rooted_schedule
    for nodes in two_tier_cases():
        n = nodes.size
        for coll in ("reduce", "bcast"):
            for count in (0, 1, n - 1, 2 * n + 1, 300):
                for root in sorted({0, n // 2, n - 1}):
                    scheds = algorithms.schedules("hierarchical", Context(
                        n, count, 4, collective=coll, root=root, nodes=nodes, intra=intra))
                    verify(scheds)
                    assert all(s.uses_shm == (intra == "shm" and count > 0) for s in scheds
                               if len(nodes.members[nodes.node_of(s.rank)]) > 1)
                    if intra == "shm":
                        verify([hierarchical_rooted_schedule(coll, r, n, count, nodes, root,
                                                             intra=intra, chunk_bytes=16)
                                for r in range(n)])


@pytest.mark.parametrize("intra", ["ring", "shm"])
@pytest.mark.parametrize("inter", ["bml", "ring"])
def test_hierarchical_reduce_scatter_and_allgather_verify_on_two_tiers(inter, intra):
    """MPI's block layout over the columns of local ranks, every node layout the MPI tests
    pretend (2 ranks a node at N = 2..12), unequal and scattered nodes, both network tiers,
    both node tiers (shared memory in chunks of 16 bytes: many, pipelined)."""
    import random

    from bmlmpi.schedules.hierarchical_blocks import hierarchical_blocks_schedule
    from bmlmpi.topology.nodes import consecutive_nodes, nodes_from_ids
    cases = two_tier_cases() + [consecutive_nodes(n, 2) for n in (1, 2, 3, 5, 7, 9, 12)]
    rng = random.Random(26)
    cases += [nodes_from_ids([rng.randrange(max(1, n // 2)) for _ in range(n)])
              for n in (rng.randint(2, 20) for _ in range(12))]
    for nodes in cases:
        n = nodes.size
        for coll in ("reduce_scatter", "allgather"):
            for counts in block_cases(n):
                scheds = [hierarchical_blocks_schedule(coll, r, n, counts, nodes, inter,
                                                       intra=intra, chunk_bytes=16)
                          for r in range(n)]
                verify(scheds)
                # the node tier's ring (r − 1 steps) and the network tier's
                k = len(scheds[0].meta["node_shape"] or ()) if inter == "bml" else nodes.count - 1
                if nodes.count > 1 and nodes.equal and intra == "ring":
                    assert all(s.nsteps == nodes.max_local - 1 + k for s in scheds)
    # one node, ranks in order: MPI's layout itself (the executor's plain copies)
    for coll in ("reduce_scatter", "allgather"):
        s = hierarchical_blocks_schedule(coll, 1, 3, (2, 3, 4), consecutive_nodes(3, 3))
        plain = algorithms.build("ring", Context(3, 9, 4, rank=1, collective=coll,
                                                 counts=(2, 3, 4)))
        assert (s.inputs, s.outputs) == (plain.inputs, plain.outputs)


def test_ring_halves_move_what_theory_says():
    size, counts = 5, (4, 0, 7, 1, 3)
    rs = algorithms.schedules("ring", Context(size, 15, 4, collective="reduce_scatter",
                                              counts=counts, segments=1))
    ag = algorithms.schedules("ring", Context(size, 15, 4, collective="allgather",
                                              counts=counts, segments=1))
    for r in range(size):
        # N−1 steps; every block but one's own (reduce-scatter: the one it ends with) passes
        assert rs[r].sent_elements() == 15 - counts[r]
        assert ag[r].sent_elements() == 15 - counts[(r + 1) % size]
        assert rs[r].received_elements() == 15 - counts[(r - 1) % size]
    # BML's halves on BCube(3,2), equal blocks: (N−1)/N of the data each, in k = 2 steps
    for coll in ("reduce_scatter", "allgather"):
        for s in algorithms.schedules("bml", Context(9, 9 * 18, 4, collective=coll,
                                                     shape=(3, 3))):
            assert s.sent_elements() == s.received_elements() == 8 * 18
            assert s.nsteps == 2


# -- the verifier's contract rules -------------------------------------------------------------

def ring_rs(size=4, counts=(2, 3, 1, 2)):
    return algorithms.schedules("ring", Context(size, sum(counts), 4,
                                                collective="reduce_scatter", counts=counts,
                                                segments=1))


def test_a_reduce_scatter_ending_on_the_wrong_block_is_rejected():
    bad = []
    for s in ring_rs():
        # take block r+1 out instead of block r
        nxt = (s.rank + 1) % s.size
        lo = sum(s.counts[:nxt])
        n = min(s.counts[s.rank], s.counts[nxt])
        bad.append(dataclasses.replace(s, outputs=(Copy(lo, lo + n, 0),)))
    with pytest.raises(ScheduleError):
        verify(bad)


def test_a_missing_or_doubled_output_is_rejected():
    good = ring_rs()
    verify(good)
    short = [dataclasses.replace(s, outputs=()) if s.rank == 1 else s for s in good]
    with pytest.raises(ScheduleError, match="written for 0"):
        verify(short)
    double = [dataclasses.replace(s, outputs=s.outputs * 2) if s.rank == 1 else s for s in good]
    with pytest.raises(ScheduleError, match="twice|outside"):
        verify(double)


def test_garbage_and_mixed_positions_are_rejected():
    # an allgather whose rank 0 never copies its input in: its block is garbage everywhere
    ag = algorithms.schedules("ring", Context(3, 6, 4, collective="allgather", segments=1))
    no_input = [dataclasses.replace(s, inputs=()) if s.rank == 0 else s for s in ag]
    with pytest.raises(ScheduleError, match="garbage 1"):
        verify(no_input)
    # an input copied one element off: reductions mix input positions
    rs = ring_rs(2, (3, 3))
    shifted = [dataclasses.replace(s, inputs=(Copy(1, 6, 0), Copy(0, 1, 5))) if s.rank == 0
               else s for s in rs]
    with pytest.raises(ScheduleError, match="input positions"):
        verify(shifted)


def test_a_non_root_that_writes_its_reduce_output_is_rejected():
    steps = (Step((Transfer(0, 0, 4),), ()),)
    root = Schedule("t", 0, 2, 4, (Step((), (Recv(1, 0, 4, reduce=True),)),),
                    collective="reduce", inputs=(Copy(0, 4, 0),), outputs=(Copy(0, 4, 0),))
    other = Schedule("t", 1, 2, 4, steps, collective="reduce", inputs=(Copy(0, 4, 0),),
                     outputs=())
    verify([root, other])
    with pytest.raises(ScheduleError, match="outside"):
        verify([root, dataclasses.replace(other, outputs=(Copy(0, 4, 0),))])


def test_a_broadcast_must_carry_the_roots_data():
    def bc(sender):
        recv = 1 - sender
        return [Schedule("t", sender, 2, 3, (Step((Transfer(recv, 0, 3),), ()),),
                         collective="bcast", root=0,
                         inputs=(Copy(0, 3, 0),) if sender == 0 else (),
                         outputs=(Copy(0, 3, 0),)),
                Schedule("t", recv, 2, 3, (Step((), (Recv(sender, 0, 3),)),),
                         collective="bcast", root=0,
                         inputs=(Copy(0, 3, 0),) if recv == 0 else (),
                         outputs=(Copy(0, 3, 0),))]
    verify(bc(0))
    with pytest.raises(ScheduleError):
        verify(bc(1))  # rank 1 sends what it never received


# -- the records -------------------------------------------------------------------------------

def test_the_records_list_each_collectives_algorithms():
    assert selection.algorithms() == ["auto", "bml", "ring", "tree", "multitree", "hierarchical",
                                   "shm", "native"]
    for coll in NAMES:
        names = selection.algorithms(coll)
        assert names[0] == "auto" and names[-1] == "native"
        assert "ps" not in names
    assert "ring" in selection.algorithms("reduce_scatter")
    with pytest.raises(ValueError, match="unknown collective"):
        selection.algorithms("alltoallw")
    assert selection.algorithms("alltoall") == ["auto", "hierarchical", "shm", "pairwise",
                                                "bruck", "bcube", "native"]
    with pytest.raises(ValueError, match="implemented for reduce_scatter"):
        selection.check_algorithm("hierarchical_not", "reduce_scatter")


def _direct_reduce_scatter(ctx: Context) -> Schedule:
    """Toy: every rank sends block j straight to rank j, one step."""
    blocks = [0]
    for c in ctx.blocks():
        blocks.append(blocks[-1] + c)
    r = ctx.rank
    peers = [p for p in range(ctx.size) if p != r]
    step = Step(tuple(Transfer(p, blocks[p], blocks[p + 1]) for p in peers
                      if blocks[p + 1] > blocks[p]),
                tuple(Recv(p, blocks[r], blocks[r + 1], reduce=True) for p in peers
                      if blocks[r + 1] > blocks[r]))
    n = blocks[r + 1] - blocks[r]
    return Schedule("toy", r, ctx.size, ctx.count, (step,), collective="reduce_scatter",
                    counts=ctx.blocks(), inputs=(Copy(0, ctx.count, 0),) if ctx.count else (),
                    outputs=(Copy(blocks[r], blocks[r + 1], 0),) if n else ())


def _direct_allreduce(ctx: Context) -> Schedule:
    """Toy: the direct reduce-scatter, then every rank sends its reduced block straight to
    every other rank (two steps)."""
    blocks = balanced_bounds(0, ctx.count, ctx.size)
    r = ctx.rank
    peers = [p for p in range(ctx.size) if p != r]
    push = Step(tuple(Transfer(p, blocks[p], blocks[p + 1]) for p in peers),
                tuple(Recv(p, blocks[r], blocks[r + 1], reduce=True) for p in peers))
    pull = Step(tuple(Transfer(p, blocks[r], blocks[r + 1]) for p in peers),
                tuple(Recv(p, blocks[p], blocks[p + 1], reduce=False) for p in peers))
    return Schedule("toy", r, ctx.size, ctx.count, compact([push, pull]))


def test_a_toy_algorithm_is_one_registration(capsys):
    toy = Algorithm("toy", {"reduce_scatter": _direct_reduce_scatter,
                            "allreduce": _direct_allreduce}, calibrated=True)
    algorithms.register(toy)
    try:
        assert "toy" in selection.algorithms("reduce_scatter")
        assert "toy" in selection.algorithms()
        assert selection.algorithms("reduce_scatter")[-1] == "native"
        for size in (1, 2, 3, 4, 7):
            verify(algorithms.schedules("toy", Context(size, 11, 8)))   # its allreduce too
        ctx = Context(4, 10, 4, collective="reduce_scatter", counts=(1, 2, 3, 4))
        verify(algorithms.schedules("toy", ctx))                        # verified
        assert algorithms.build("toy", ctx.at(2)).outputs == (Copy(3, 6, 0),)  # by name
        cost = algorithm_cost("toy", 10, 4, 4, SharedMemoryNode(4),
                              collective="reduce_scatter", counts=(1, 2, 3, 4))
        assert cost.nsteps == 1                                         # priced
        assert "toy" in algorithms.calibrated(4)                        # calibrated
        calib = Calibration(alpha=1e-6, beta=1e-9,
                            natives=(("reduce_scatter", 8, 1.0), ("reduce_scatter", 1 << 20,
                                                                   1.0)))
        t = estimate(["toy", "ring", "native"], 10, 4, 4, calib=calib,
                     collective="reduce_scatter", counts=(1, 2, 3, 4))
        assert set(t) == {"toy", "ring", "native"} and t["native"] == 1.0
        # calibration times its allreduce and its factors travel in the cache's vector
        verify([calibrate._schedule("toy", r, 4, 1 << 16) for r in range(4)])
        fixes = tuple(("toy", b, 2.0) for b in calibrate.CORRECTION_BYTES)
        fixed = dataclasses.replace(calib, corrections=fixes)
        assert calibrate._unpack(calibrate._pack(fixed), {}).corrections == fixes
        plain = estimate(["toy"], 1 << 16, 8, 4, calib=calib)["toy"]
        assert estimate(["toy"], 1 << 16, 8, 4, calib=fixed)["toy"] == pytest.approx(2 * plain)
        # auto: not offered until the record opts in, even where it is the cheapest by far
        cheap = dataclasses.replace(calib, native=((8, 1.0), (1 << 24, 1.0)), corrections=tuple(
            ("toy", b, 1e-3) for b in calibrate.CORRECTION_BYTES))
        assert estimate(["toy", "bml"], 1 << 16, 8, 4, calib=cheap)["toy"] < \
            estimate(["bml"], 1 << 16, 8, 4, calib=cheap)["bml"] / 10
        _auto_never_runs("toy", cheap)
        algorithms.register(dataclasses.replace(toy, auto=True))
        assert "toy" in selection.candidates(10, 4, collective="reduce_scatter",
                                          counts=(1, 2, 3, 4))          # considered by auto
        why = selection.explain(1 << 16, 8, 4, cheap)
        assert why.chosen == "toy" and why.rule == "cost model"         # priced and chosen
        assert "toy" in [c.name for c in why.candidates]
        assert selection.choose(10, 4, 4, calib, collective="reduce_scatter",
                             counts=(1, 2, 3, 4)) in ("toy", "ring")
        algorithms.register(toy)                                        # opted out again
        _auto_never_runs("toy", cheap)
        # the sweep offers it and runs it (one rank here: the unit tests' MPI)
        assert "toy" in bench.sweep_names("reduce_scatter")
        capsys.readouterr()
        assert bench.main(["--collective", "reduce_scatter", "--algorithms", "toy", "-m",
                           "8:64", "-i", "2", "-x", "1", "-c"]) == 0
        table = capsys.readouterr().out
        assert "algorithm: toy" in table and "Fail" not in table and table.count("Pass") == 4
    finally:
        algorithms.unregister("toy")
    assert "toy" not in selection.algorithms("reduce_scatter")
    assert "toy" not in algorithms.calibrated(4)


def _auto_never_runs(name: str, calib: Calibration) -> None:
    """``auto`` neither prices nor chooses ``name``, for any collective, size or rule."""
    for coll in NAMES:
        assert name not in selection.candidates(1 << 16, 4, collective=coll)
        for count in (0, 10, 1 << 16):
            for size in (1, 2, 4):
                for c in (calib, None):
                    for why in (selection.explain(count, 8, size, c, collective=coll),
                                selection.explain_collective(coll, count, 8, size, c)):
                        assert why.chosen != name, why
                        assert name not in [k.name for k in why.candidates], why


def test_auto_without_a_native_timing_for_the_collective_uses_the_fixed_rule():
    calib = Calibration(alpha=1e-6, beta=1e-9, native=((8, 1e-6), (1 << 20, 1e-3)))
    assert selection.choose(10, 4, 4, calib, collective="allgather") == "native"
    big = selection.choose(1 << 20, 4, 4, calib, collective="allgather")
    assert big in selection.algorithms("allgather")[1:-1]


def test_shapes_resolve_as_the_communicator_does():
    assert Context(12, 5).radices() == tuple(default_shape(12))
    assert Context(9, 5, shape="3x3").radices() == (3, 3)


# -- the cost model per collective -------------------------------------------------------------

def test_the_model_prices_each_half_of_bml_at_one_kth_of_a_one_nic_fat_tree():
    """BCube(3,2), 18 pieces: BML's reduce-scatter and allgather each take (N−1)/(kN)·T_F =
    8·T_C = 4/9·T_F (half of the paper's Fig. 4 walk-through, 16·T_C), ring's on the one-NIC
    Fat-Tree twin (N−1)/N·T_F = 8/9·T_F: the 1/k effect, per half."""
    from fractions import Fraction as F

    from bmlmpi.model import BCubeNetwork, FatTree
    count = 18 * 9 * 4
    for coll in ("reduce_scatter", "allgather"):
        bml = algorithm_cost("bml", count, 4, 9, BCubeNetwork((3, 3)), collective=coll)
        ring = algorithm_cost("ring", count, 4, 9, FatTree(9), collective=coll)
        assert bml.t_f == F(4, 9) and bml.nsteps == 2
        assert ring.t_f == F(8, 9) and ring.nsteps == 8
    # reduce and broadcast: the two halves, 2(N−1)/(kN)·T_F, as the allreduce
    for coll in ("reduce", "bcast"):
        bml = algorithm_cost("bml", count, 4, 9, BCubeNetwork((3, 3)), collective=coll,
                             root=4)
        assert bml.t_f == F(8, 9) and bml.nsteps == 4


def test_auto_prices_each_collective_against_its_own_native_call():
    natives = tuple((coll, b, t) for coll in FAMILY for b, t in ((8, 1e-8), (1 << 22, 1.0)))
    slow_native = Calibration(alpha=1e-6, beta=1e-10, natives=natives)
    for coll in FAMILY:
        kw = {"root": 1} if coll in ("reduce", "bcast") else {}
        pick = selection.choose(1 << 20, 4, 4, slow_native, collective=coll, **kw)
        assert pick in selection.algorithms(coll)[1:-1]  # a schedule beats a 1 s native call
        assert selection.choose(2, 4, 4, slow_native, collective=coll, **kw) == "native"
        assert selection.choose_collective(coll, 1 << 20, 4, 4) == "native"  # uncalibrated


def test_the_model_prices_bmls_layout_copies():
    """BML's allgather on two levels copies its whole result out of BML's piece order (one
    pass more than ring, which works in the recvbuf): the model adds it at the copy rate;
    in the plain layout (ring, BML's reduce-scatter, one level) nothing is added."""
    from bmlmpi.model import SharedMemoryNode
    count = 4 * 1024
    net = SharedMemoryNode(4)
    bml = algorithm_cost("bml", count, 8, 4, net, collective="allgather")
    ring = algorithm_cost("ring", count, 8, 4, net, collective="allgather")
    assert bml.copied == count and ring.copied == 0
    assert algorithm_cost("bml", count, 8, 4, net, collective="reduce_scatter").copied == 0
    assert algorithm_cost("bml", count, 8, 2, SharedMemoryNode(2),
                          collective="allgather").copied == 0
    plain = dataclasses.replace(bml, copied=0)
    assert bml.seconds(8, 1e-6, 1e-9) == pytest.approx(plain.seconds(8, 1e-6, 1e-9)
                                                      + count * 8 * 1e-9)
    assert bml.seconds(8, 1e-6, 1e-9, shm_copy=2e-10) == pytest.approx(
        plain.seconds(8, 1e-6, 1e-9, shm_copy=2e-10) + count * 8 * 2e-10)


def test_auto_for_the_family_follows_the_calibrations_measured_corrections():
    """A calibration record whose measured corrections make one schedule of a collective
    cheap (its factor 1e-3, every other's 1e3): ``auto`` runs that one, and the explanation
    reports the factor it applied (and the model before it); a record that favours another
    schedule moves the choice with it. The allreduce's corrections do not leak into it."""
    natives = tuple((coll, b, t) for coll in FAMILY for b, t in ((8, 1.0), (1 << 22, 1.0)))
    sizes = (1 << 16, 1 << 20, 1 << 22)
    for coll in FAMILY:
        kw = {"root": 1} if coll in ("reduce", "bcast") else {}
        names = [a for a in selection.algorithms(coll)[1:-1] if a in algorithms.corrected()
                 and a in selection.candidates(1 << 20, 4, collective=coll, **kw)]
        assert len(names) >= 2, (coll, names)
        for cheap in names[:2]:
            fixes = tuple((coll, a, b, 1e-3 if a == cheap else 1e3) for a in names
                          for b in sizes)
            calib = Calibration(alpha=1e-6, beta=1e-10, natives=natives,
                                family_corrections=fixes,
                                corrections=tuple((a, b, 1e-6) for a in names for b in sizes))
            why = selection.explain_collective(coll, 1 << 20, 4, 4, calib, **kw)
            assert why.chosen == cheap and why.rule == "cost model", str(why)
            priced = {c.name: c for c in why.candidates}
            assert priced[cheap].correction == pytest.approx(1e-3)
            assert priced[cheap].predicted == pytest.approx(priced[cheap].model * 1e-3)
            other = next(a for a in names if a != cheap)
            assert priced[other].correction == pytest.approx(1e3)
            assert "x 0.00" in str(why)  # the table shows the factor applied
    # the allreduce keeps its own corrections only
    calib = Calibration(alpha=1e-6, beta=1e-10, family_corrections=(
        ("reduce_scatter", "ring", 1 << 20, 5.0),), corrections=(("ring", 1 << 20, 2.0),))
    assert calib.correction("ring", 1 << 20) == 2.0
    assert calib.correction("ring", 1 << 20, "reduce_scatter") == 5.0
    assert calib.correction("ring", 1 << 20, "allgather") == 1.0
    assert Calibration.from_dict(calib.to_dict()) == calib
