"""All-to-all's schedules (``pairwise``, ``bruck``, ``bcube``), MPI-free: the verifier proves
each delivers every block, element for element, to its place, for every N from 1 to 20 and a
sample of larger N up to 64 (primes, powers of two, mixed radices: building and verifying all
three at every N above 20 costs about a minute on two cores), equal blocks of several sizes
and uneven pair counts with zeros; the verifier rejects a misplaced block; the records serve
all-to-all, offered and opted in to ``auto``; the executor posts each receive where the
schedule lands it; the model prices the schedules in the documented order, and ``auto`` uses
it where the MPI library's own all-to-all was timed."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from bmlmpi.model import BCubeNetwork, FatTree, algorithm_cost, estimate
from bmlmpi.schedules import algorithms
from bmlmpi.schedules.algorithms import Context
from bmlmpi.schedules.bcube_exchange import bcube_exchange_schedule
from bmlmpi.schedules.bruck import bruck_rounds, bruck_schedule
from bmlmpi.schedules.collectives import collective
from bmlmpi.schedules.types import INPUT, OUTPUT, WORK, Copy, Recv, Schedule, Step, Transfer
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.bcube import BCube, default_shape

ALLTOALL = ("pairwise", "bruck", "bcube")


def uneven(size: int) -> tuple[int, ...]:
    """Pair counts that differ by position and hold zeros (a third of them or so)."""
    return tuple((s * 5 + d * 3 + 1) % 4 for s in range(size) for d in range(size))


def sparse(size: int) -> tuple[int, ...]:
    """Most pairs empty, the rest of sizes that grow with both ranks."""
    return tuple(0 if (s + 2 * d) % 3 else s + d + 1 for s in range(size) for d in range(size))


def cases(size: int) -> list[Context]:
    out = [Context(size, size * size * b, 4, collective="alltoall") for b in (1, 3, 8)]
    for pairs in (uneven(size), sparse(size), (0,) * (size * size)):
        out.append(Context(size, sum(pairs), 4, collective="alltoall", counts=pairs))
    return out


def check(name: str, ctx: Context) -> list[Schedule]:
    scheds = algorithms.schedules(name, ctx)
    assert all(s.collective == "alltoall" and s.counts == ctx.pairs() for s in scheds)
    verify(scheds)
    return scheds


@pytest.mark.parametrize("name", ALLTOALL)
@pytest.mark.parametrize("size", range(1, 21))
def test_every_alltoall_schedule_verifies_small(name, size):
    for ctx in cases(size):
        check(name, ctx)


@pytest.mark.parametrize("name", ALLTOALL)
@pytest.mark.parametrize("size", [23, 31, 32, 36, 60, 64])
def test_alltoall_schedules_verify_at_larger_sizes(name, size):
    pairs = uneven(size)
    check(name, Context(size, sum(pairs), 4, collective="alltoall", counts=pairs))


@pytest.mark.parametrize("shape", [(3, 3), (2, 3), (3, 2), (2, 2, 3), (3, 2, 2), (4, 4), (5,),
                                   (2, 2, 2, 2)], ids=lambda s: "x".join(map(str, s)))
def test_bcube_verifies_on_every_shape_and_pipeline_count(shape):
    cube = BCube(shape)
    size = cube.size
    for ctx in cases(size):
        for pipelines in (None, 1, 2, len(shape)):
            scheds = check("bcube", dataclasses.replace(ctx, shape=shape, pipeline=pipelines))
            for s in scheds:
                assert s.nsteps == len(shape)
                for w, step in enumerate(s.steps):
                    for t in (*step.sends, *step.recvs):
                        # pipeline e works on level (e + w) mod k, with the peer across it
                        assert t.level == (t.stream + w) % len(shape)
                        assert cube.color(t.peer, t.level) == cube.color(s.rank, t.level)


def test_step_counts_and_what_each_rank_moves():
    b = 5
    for size in (2, 7, 9, 12, 16):
        ctx = Context(size, size * size * b, 4, collective="alltoall")
        pairwise = algorithms.schedules("pairwise", ctx)
        assert {s.nsteps for s in pairwise} == {size - 1}
        # one partner each way per round, each element sent once: the row and the column
        for s in pairwise:
            assert all(len(st.sends) == len(st.recvs) == 1 for st in s.steps)
            assert s.sent_elements() == s.received_elements() == (size - 1) * b
            # nothing relayed, so nothing through a work buffer: each block straight from
            # the sender's input into the receiver's output, the own block copied across
            assert s.count == 0 and not s.input_copies() and not s.output_copies()
            assert all(t.buffer == INPUT for st in s.steps for t in st.sends)
            assert all(t.into == OUTPUT for st in s.steps for t in st.recvs)
            assert s.through == (Copy(s.rank * b, (s.rank + 1) * b, s.rank * b),)
        for s in algorithms.schedules("bruck", ctx):
            assert s.nsteps == bruck_rounds(size)
            for k, st in enumerate(s.steps):
                assert {t.peer for t in st.sends} == {(s.rank + (1 << k)) % size}
                assert {t.peer for t in st.recvs} == {(s.rank - (1 << k)) % size}
                # the blocks whose distance has bit k set
                moved = sum(1 for i in range(1, size) if i >> k & 1)
                assert sum(t.n for t in st.sends) == moved * b
        k = len(default_shape(size))
        for s in algorithms.schedules("bcube", ctx):
            assert s.nsteps == k and s.streams == k


def test_transfer_counts_the_modules_quote():
    pairs = (60,) * (64 * 64)
    per_round = [len(st.sends) for st in bruck_schedule(0, 64, pairs).steps]
    assert per_round == [1, 32, 24, 16, 10, 6]
    shape = default_shape(64)
    pipelined = bcube_exchange_schedule(0, 64, pairs, shape)
    single = bcube_exchange_schedule(0, 64, pairs, shape, pipelines=1)
    assert sum(len(st.sends) for st in pipelined.steps) == 666
    assert sum(len(st.sends) for st in single.steps) == 88


# -- the verifier catches what is wrong ------------------------------------------------------

def _replace_recv(s: Schedule, step: int, index: int, **change) -> Schedule:
    st = s.steps[step]
    recvs = list(st.recvs)
    recvs[index] = dataclasses.replace(recvs[index], **change)
    steps = list(s.steps)
    steps[step] = Step(st.sends, tuple(recvs))
    return dataclasses.replace(s, steps=tuple(steps))


@pytest.mark.parametrize("name", ALLTOALL)
def test_the_verifier_rejects_a_misplaced_block(name):
    size = 6
    ctx = Context(size, size * size * 4, 4, collective="alltoall")
    scheds = list(algorithms.schedules(name, ctx))
    verify(scheds)
    r = 3
    s = scheds[r]
    i = next(i for i, st in enumerate(s.steps) if st.recvs)
    t = s.steps[i].recvs[0]
    # land the block one element further on: the rest of the buffer no longer matches
    bad = _replace_recv(s, i, 0, at=t.target[0] + 1) if t.target[1] < s.count else \
        _replace_recv(s, i, 0, at=t.target[0] - 1)
    with pytest.raises(ScheduleError):
        verify(scheds[:r] + [bad] + scheds[r + 1:])
    # two output blocks swapped
    outs = list(s.output_copies())
    if len(outs) > 1:
        a, b = outs[0], outs[-1]
        if a.n == b.n:
            outs[0], outs[-1] = Copy(a.lo, a.hi, b.at), Copy(b.lo, b.hi, a.at)
            with pytest.raises(ScheduleError):
                verify(scheds[:r] + [dataclasses.replace(s, outputs=tuple(outs))]
                       + scheds[r + 1:])


def test_the_verifier_names_the_wrong_element():
    # two ranks, blocks of 2: rank 1 receives rank 0's block for rank 1 into its own block's
    # place in the output, and its own block where rank 0's belongs
    pairs = (2, 2, 2, 2)
    good = [algorithms.build("pairwise", Context(2, 8, 4, rank=r, collective="alltoall",
                                                 counts=pairs)) for r in range(2)]
    verify(good)
    assert good[1].through == (Copy(2, 4, 2),)
    swapped = dataclasses.replace(_replace_recv(good[1], 0, 0, at=2), through=(Copy(2, 4, 0),))
    with pytest.raises(ScheduleError, match=r"rank 1: output element 0 holds rank 1's input "
                                            r"element 2, expected rank 0's input element 2"):
        verify([good[0], swapped])
    dropped = dataclasses.replace(good[1], through=())
    with pytest.raises(ScheduleError, match="output element 2 holds nothing"):
        verify([good[0], dropped])
    # a block written twice into the output
    twice = dataclasses.replace(good[1], through=(Copy(2, 4, 0),))
    with pytest.raises(ScheduleError, match="written twice"):
        verify([good[0], twice])


def test_only_a_relaying_collective_lands_elsewhere_and_it_reduces_nothing():
    # an allgather whose receive lands at another offset is refused by rule 12
    ag = [Schedule("x", r, 2, 2, (Step((Transfer(1 - r, r, r + 1),),
                                       (Recv(1 - r, 1 - r, 2 - r),)),),
                   collective="allgather", counts=(1, 1), inputs=(Copy(0, 1, r),),
                   outputs=(Copy(0, 2, 0),)) for r in range(2)]
    verify(ag)
    verify([ag[0], _replace_recv(ag[1], 0, 0, at=0)])  # at == lo: the same offset
    with pytest.raises(ScheduleError, match="another offset"):
        verify([ag[0], _replace_recv(ag[1], 0, 0, at=1)])
    # an all-to-all that reduces, or lands outside its buffer
    pairs = (1, 1, 1, 1)
    a2a = [algorithms.build("pairwise", Context(2, 4, 4, rank=r, collective="alltoall",
                                                counts=pairs)) for r in range(2)]
    verify(a2a)
    with pytest.raises(ScheduleError, match="reduces nothing"):
        verify([a2a[0], _replace_recv(a2a[1], 0, 0, reduce=True)])
    with pytest.raises(ScheduleError, match="outside"):  # its output holds 2 elements
        verify([a2a[0], _replace_recv(a2a[1], 0, 0, at=2)])
    with pytest.raises(ScheduleError, match="outside"):  # its work buffer none
        verify([a2a[0], _replace_recv(a2a[1], 0, 0, into=WORK)])
    # a landing range written while a send of the same step reads it (Bruck relays through
    # the work buffer: its round 1 sends what round 0 received)
    bruck = [algorithms.build("bruck", Context(4, 16, 4, rank=r, collective="alltoall"))
             for r in range(4)]
    verify(bruck)
    s = bruck[0]
    send = next(t for t in s.steps[1].sends if t.buffer == WORK)
    with pytest.raises(ScheduleError, match="written while"):
        verify([_replace_recv(s, 1, 0, at=send.lo, into=WORK), *bruck[1:]])
    # the pair matrix must be square
    with pytest.raises(ScheduleError, match="2x2"):
        verify([dataclasses.replace(x, counts=(1, 1, 1)) for x in a2a])


def test_the_contract_is_rank_js_block_for_rank_r():
    record = collective("alltoall")
    pairs = (1, 2, 0,
             3, 0, 4,
             5, 6, 7)
    # rank 1's input is its row, its output its column, packed
    assert record.input_size(1, 0, 0, pairs) == 7
    assert record.output_size(1, 0, 0, pairs) == 8
    # output [0,2) from rank 0's input at 1, [2,2) none, [2,8) from rank 2's input at 5
    assert record.regions(1, [0, 1, 2], 0, 0, pairs) == [(0, 2, (0,), 1), (2, 8, (2,), 5)]


# -- the records and the model --------------------------------------------------------------

def test_the_records_serve_alltoall_and_are_offered():
    # shm and hierarchical (tests/unit/test_alltoall_tiers.py) serve the rest of the family too
    assert algorithms.scheduled("alltoall") == ["hierarchical", "shm", *ALLTOALL]
    for name in ALLTOALL:
        record = algorithms.get(name)
        assert record.collectives == ("alltoall",)
        assert record.offered and record.auto and not record.calibrated
        assert name in algorithms.candidates(Context(4, 16, collective="alltoall"))
    assert algorithms.get("native").serves("alltoall")
    assert algorithms.algorithms("alltoall") == ["auto", "hierarchical", "shm", *ALLTOALL,
                                                 "native"]
    with pytest.raises(ValueError, match="no schedule for allreduce"):
        algorithms.build("bruck", Context(4, 16))
    with pytest.raises(ValueError, match="pair counts"):
        Context(3, 9, collective="alltoall", counts=(1, 2, 3))


def test_the_model_prices_them_in_the_documented_order():
    tiny, large = {}, {}
    for size in (9, 64):
        for b, into in ((1, tiny), (1 << 16, large)):
            into[size] = estimate(ALLTOALL, size * size * b, 4, size, alpha=1e-6, beta=1e-9,
                                  collective="alltoall")
            assert all(t > 0 for t in into[size].values())
    # tiny blocks: log N rounds beat N - 1; large blocks: the bytes Bruck relays cost more
    assert tiny[64]["bruck"] < tiny[64]["pairwise"] / 5
    assert large[64]["pairwise"] < large[64]["bruck"]
    assert large[9]["pairwise"] < large[9]["bruck"]


def test_bcube_uses_every_level_of_a_bcube_at_once():
    b = 900
    count = 81 * b
    on_bcube = {n: algorithm_cost(n, count, 4, 9, BCubeNetwork("3x3"), collective="alltoall")
                for n in ALLTOALL}
    on_fat_tree = {n: algorithm_cost(n, count, 4, 9, FatTree(9), collective="alltoall")
                   for n in ALLTOALL}
    # BCube(3,2): (n - 1)/n · N·b = 6·b on the busiest NIC, both levels busy in each step
    assert Fraction(on_bcube["bcube"].time) == 6 * b
    assert {s.link[2] for s in on_bcube["bcube"].steps} <= {0, 1}
    # any all-to-all through one NIC: every block but its own crosses it, (N - 1)·b
    assert Fraction(on_fat_tree["pairwise"].time) == 8 * b
    assert min(c.time for c in on_fat_tree.values()) == 8 * b
    assert on_bcube["bcube"].time < min(on_bcube["pairwise"].time, on_bcube["bruck"].time)


def test_auto_prices_them_where_native_alltoall_was_timed_else_the_fixed_rule():
    from bmlmpi import selection
    from bmlmpi.model.estimate import Calibration

    bcast = (tuple(("bcast", b, 1e-3) for b in (8, 1 << 22)))
    no_alltoall = Calibration(alpha=1e-6, beta=1e-9, natives=bcast)
    # no timing of the MPI library's all-to-all: native below BMLMPI_AUTO_BML_BYTES, the
    # first record that opts in from there (the user's calls then time it against native)
    small = selection.explain_collective("alltoall", 16, 4, 4, no_alltoall)
    big = selection.explain_collective("alltoall", 1 << 20, 4, 4, no_alltoall)
    assert (small.chosen, small.rule) == ("native", "fixed rule")
    assert (big.chosen, big.rule) == ("pairwise", "fixed rule")
    # no calibration at all: native, as the rest of the family
    assert selection.explain_collective("alltoall", 1 << 20, 4, 4).chosen == "native"
    # where native was timed (slow here), the model prices every record against it
    slow = Calibration(alpha=1e-6, beta=1e-10,
                       natives=tuple(("alltoall", b, 1.0) for b in (8, 1 << 22)))
    why = selection.explain_collective("alltoall", 1 << 20, 4, 4, slow)
    assert why.rule == "cost model" and why.chosen in ALLTOALL
    assert {c.name for c in why.candidates} == {*ALLTOALL, "native"}


@pytest.mark.parametrize("name", ALLTOALL)
def test_the_executor_posts_each_receive_where_the_schedule_lands_it(name):
    """A relayed block lands at :attr:`Recv.target`, not at its sender's offset: the plan
    posts every receive on that range (and its sends on the sender's), so it runs the
    schedule the verifier proved."""
    from bmlmpi.execute import Plan

    pairs = uneven(6)
    for rank in range(6):
        sched = algorithms.build(name, Context(6, sum(pairs), 4, rank=rank,
                                               collective="alltoall", counts=pairs))
        plan = Plan.flat(sched, None)
        posted = [[(p.world_peer, p.lo, p.hi) for p in sp.recvs] for lane in plan.lanes
                  for sp in lane]
        wanted = [[(t.peer, *t.target) for t in st.recvs] for st in sched.steps]
        assert posted == wanted
        moved = [t for st in sched.steps for t in st.recvs if t.target != (t.lo, t.hi)]
        assert moved  # blocks land past the row, not at their sender's offset


def _in_place_run(scheds: list[Schedule], saved: list[tuple]) -> list[list]:
    """Every rank's buffer after an in-place run of ``scheds`` as the executor makes it
    (:func:`bmlmpi.execute._direct_run`), in the worst order MPI allows: each step's
    receives land before its sends read. Elements are labels (rank, input position); the
    input is the output, ``saved[r]`` the ranges rank r copied aside before step 0."""
    mem = [[(s.rank, i) for i in range(sum(s.counts[s.rank * s.size:(s.rank + 1) * s.size]))]
           for s in scheds]
    aside = [{i: mem[r][i] for lo, hi in saved[r] for i in range(lo, hi)}
             for r in range(len(scheds))]
    work = [[None] * s.count for s in scheds]
    for s in scheds:
        for c in s.input_copies():
            work[s.rank][c.at:c.at + c.n] = mem[s.rank][c.lo:c.hi]
    for i in range(max(s.nsteps for s in scheds)):
        landed = []
        for s in scheds:
            for t in s.steps[i].recvs:
                sender = scheds[t.peer]
                send = next(x for x in sender.steps[i].sends
                            if (x.peer, x.lo, x.hi, x.buffer) == (s.rank, t.lo, t.hi,
                                                                  t.buffer))
                landed.append((s.rank, t, send, sender.rank))
        # the receives land first, into the output (which is the input) or the work buffer
        data = {}
        for _, t, send, q in landed:
            if send.buffer == WORK:
                data[id(t)] = work[q][t.lo:t.hi]
        for r, t, send, q in landed:
            if send.buffer == INPUT:  # read now: after the step's receives landed
                data[id(t)] = [aside[q].get(k, mem[q][k]) for k in range(t.lo, t.hi)]
            lo, hi = t.target
            (mem[r] if t.into == OUTPUT else work[r])[lo:hi] = data[id(t)]
    for s in scheds:
        for c in s.through:
            if c.lo != c.at:
                mem[s.rank][c.at:c.at + c.n] = [aside[s.rank][k] for k in range(c.lo, c.hi)]
        for c in s.output_copies():
            mem[s.rank][c.at:c.at + c.n] = work[s.rank][c.lo:c.hi]
    return mem


@pytest.mark.parametrize("name", ALLTOALL)
def test_in_place_saves_what_a_receive_would_overwrite_before_its_send(name):
    """In place the input is the output: a block received straight into the output can land
    on a block of the row not yet sent. The executor copies aside exactly
    :meth:`Plan.saved_in_place`'s ranges first; run in the worst order (each step's
    receives before its sends), every rank then ends with its column; with nothing saved,
    pairwise delivers the overwritten blocks instead."""
    from bmlmpi.execute import Plan

    for size in (2, 3, 4, 5, 6, 9):
        for pairs in ((3,) * (size * size),
                      tuple((min(s, d) * 3 + max(s, d) + 2) % 4 for s in range(size)
                            for d in range(size))):  # symmetric: MPI's in-place rule
            scheds = [algorithms.build(name, Context(size, sum(pairs), 4, rank=r,
                                                     collective="alltoall", counts=pairs))
                      for r in range(size)]
            saved = [Plan.flat(s, None).saved_in_place() for s in scheds]
            got = _in_place_run(scheds, saved)
            for r in range(size):
                want = [(j, sum(pairs[j * size:j * size + r]) + k) for j in range(size)
                        for k in range(pairs[j * size + r])]
                assert got[r] == want, (size, pairs, r)
            if name == "pairwise" and size > 2 and set(pairs) == {3}:
                b = 3
                # rank 0 sends slot k + 1 in round k and receives slot N − 1 − k: from
                # round ⌈(N − 2)/2⌉ on, the slot it sends has been landed on
                first = -(-(size - 2) // 2)
                assert saved[0] == (((first + 1) * b, size * b),)
                assert _in_place_run(scheds, [()] * size) != got
