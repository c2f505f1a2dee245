"""Shared-memory schedules (the allreduce and the rest of the family: reduce-scatter,
allgather, reduce, broadcast), proven without MPI: the verifier's rules for shared-memory
steps (every element of every output as its collective's contract says, no read before the
owner published, no overwrite under a reader, every reader waited for in every call, the
in-place input read before it is overwritten), and a simulator that runs every rank's ops
under adversarial random interleavings, each op only once its waits are met, over several
calls that reuse the two buffer images, with real data: a read of a stale or half-written
range shows as a wrong result."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from bmlmpi.schedules.collectives import collective
from bmlmpi.schedules.hierarchical import hierarchical_schedules
from bmlmpi.schedules.shm import (
    MAX_CHUNKS,
    chunk_count,
    shm_collective_schedule,
    shm_schedule,
    shm_schedules,
)
from bmlmpi.schedules.types import FETCH, PUBLISH, REDUCE, Copy, ShmOp, Step
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.nodes import consecutive_nodes


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 9, 12])
@pytest.mark.parametrize("count", [0, 1, 7, 100, 1031])
@pytest.mark.parametrize("chunk", [4, 256 * 1024])
def test_shm_schedules_verify(size, count, chunk):
    verify(shm_schedules(size, count, 4, chunk))
    verify(shm_schedules(size, count, 4, chunk, max_chunks=10 ** 6))  # many chunks


@pytest.mark.parametrize("size,per_node", [(4, 2), (6, 3), (6, 2), (5, 2), (8, 4), (9, 3),
                                           (12, 4), (12, 5), (3, 1)])
@pytest.mark.parametrize("count", [0, 1, 5, 31, 1031])
def test_hierarchical_shm_tier_verifies(size, per_node, count):
    nodes = consecutive_nodes(size, per_node)
    verify(hierarchical_schedules(size, count, nodes, intra="shm", chunk_bytes=16))


def test_steps_and_chunks():
    # 3 stages per chunk; one rank: a reduce (copy) per chunk
    s = shm_schedule(0, 4, 4096, 4, 256, max_chunks=100)
    c = chunk_count(4096, 4, 4, 256, 100)
    assert c == 16 and s.nsteps == 3 * c
    assert chunk_count(4096, 4, 4, 256) == MAX_CHUNKS  # at most this many by default
    assert shm_schedule(0, 1, 10, 4).nsteps == 1
    assert shm_schedule(0, 3, 0, 4).nsteps == 0
    assert all(not st.sends and not st.recvs for st in s.steps)


def _replace_op(scheds, rank, step, index, **changes):
    out = list(scheds)
    s = out[rank]
    st = s.steps[step]
    ops = list(st.shm)
    ops[index] = dataclasses.replace(ops[index], **changes)
    steps = list(s.steps)
    steps[step] = Step(shm=tuple(ops))
    out[rank] = dataclasses.replace(s, steps=tuple(steps))
    return out


def _first(scheds, rank, kind):
    for i, st in enumerate(scheds[rank].steps):
        for j, o in enumerate(st.shm):
            if o.kind == kind:
                return i, j, o
    raise AssertionError(kind)


def test_verifier_catches_a_read_before_publish():
    scheds = shm_schedules(3, 30, 4, 8)
    i, j, o = _first(scheds, 0, REDUCE)
    bad = _replace_op(scheds, 0, i, j, after=o.after[:1])  # waits for one peer of two
    with pytest.raises(ScheduleError, match="before its owner published"):
        verify(bad)


def test_verifier_catches_a_fetch_without_wait():
    scheds = shm_schedules(2, 30, 4, 8)
    i, j, _ = _first(scheds, 1, FETCH)
    with pytest.raises(ScheduleError, match="before its owner published"):
        verify(_replace_op(scheds, 1, i, j, after=()))


def test_verifier_catches_an_overwrite_under_a_reader():
    # rank 0 republishes its input over a range rank 1 reduces from, in the same step
    scheds = shm_schedules(2, 8, 4, 1 << 20)
    i, _, o = _first(scheds, 1, REDUCE)
    extra = ShmOp(PUBLISH, o.lo, o.hi)
    s0 = scheds[0]
    steps = list(s0.steps)
    steps[i] = Step(shm=(*steps[i].shm, extra))
    bad = [dataclasses.replace(s0, steps=tuple(steps)), scheds[1]]
    with pytest.raises(ScheduleError, match="may still read|before its owner published"):
        verify(bad)


def test_verifier_catches_a_missing_contribution():
    scheds = shm_schedules(3, 30, 4, 1 << 20)
    i, j, o = _first(scheds, 2, REDUCE)
    with pytest.raises(ScheduleError, match="exactly once"):
        verify(_replace_op(scheds, 2, i, j, peers=o.peers[:1]))


def test_verifier_catches_input_read_after_overwrite():
    # fetching into a range before publishing the input there: in place that is lost
    scheds = shm_schedules(2, 8, 4, 1 << 20)
    s = scheds[0]
    steps = list(s.steps)
    fetch = next(o for st in steps for o in st.shm if o.kind == FETCH)
    steps.append(Step(shm=(ShmOp(PUBLISH, fetch.lo, fetch.hi),)))
    s1 = scheds[1]
    bad = [dataclasses.replace(s, steps=tuple(steps)),
           dataclasses.replace(s1, steps=(*s1.steps, Step()))]
    with pytest.raises(ScheduleError, match="input after the result overwrote"):
        verify(bad)


def test_verifier_catches_a_wait_on_a_later_step():
    scheds = shm_schedules(2, 8, 4, 1 << 20)
    i, j, o = _first(scheds, 0, REDUCE)
    with pytest.raises(ScheduleError, match="not an earlier one"):
        verify(_replace_op(scheds, 0, i, j, after=((1, i),)))


def one_shot(size: int, count: int) -> list:
    """The small allreduce every rank reduces alone: publish the whole input (step 0), then
    fold the own input with every peer's segment, in member order, into the result."""
    scheds = []
    for r in range(size):
        peers = tuple(p for p in range(size) if p != r)
        steps = (Step(shm=(ShmOp(PUBLISH, 0, count),)),
                 Step(shm=(ShmOp(REDUCE, 0, count, peers, tuple((p, 0) for p in peers)),)))
        scheds.append(dataclasses.replace(shm_schedule(r, size, count), steps=steps))
    return scheds


def one_shot_results(size: int, count: int) -> list[np.ndarray]:
    """Each rank's float32 result of :func:`one_shot`, folded in the kernels' order."""
    rng = np.random.default_rng(5)
    x = [rng.standard_normal(count).astype(np.float32) for _ in range(size)]
    out = []
    for s in one_shot(size, count):
        o = s.steps[1].shm[0]
        acc = x[s.rank].copy()
        for p in o.peers:
            acc += x[p]
        out.append(acc)
    return out


def test_verifier_catches_ranks_that_reduce_one_element_in_different_orders():
    # rank 0 folds (x0 + x1) + x2, rank 2 (x2 + x0) + x1 = (x0 + x2) + x1: the float bits
    # differ, as they do here in float32
    got = one_shot_results(3, 1000)
    assert not np.array_equal(got[0], got[2])
    with pytest.raises(ScheduleError, match=r"another order than rank 0.*\(\(x0\+x2\)\+x1\)"):
        verify(one_shot(3, 10))
    # two ranks fold x0 + x1 and x1 + x0: one operation, the same bits; it passes
    got = one_shot_results(2, 1000)
    assert np.array_equal(got[0], got[1])
    verify(one_shot(2, 10))


def test_verifier_accepts_one_rank_reducing_for_all():
    # rank 0 reduces the whole buffer and publishes it, the others fetch it: one tree
    size, count = 3, 10
    scheds = []
    for r in range(size):
        peers = tuple(p for p in range(size) if p != r)
        if r == 0:
            steps = (Step(shm=(ShmOp(PUBLISH, 0, count),)),
                     Step(shm=(ShmOp(REDUCE, 0, count, peers, tuple((p, 0) for p in peers),
                                     publish=True),)),
                     Step())
        else:
            steps = (Step(shm=(ShmOp(PUBLISH, 0, count, after=((0, -1),)),)),
                     Step(),
                     Step(shm=(ShmOp(FETCH, 0, count, (0,), ((0, 1),)),)))
        scheds.append(dataclasses.replace(shm_schedule(r, size, count), steps=steps))
    verify(scheds)


# -- the interleaving simulator --------------------------------------------------------------

SAME_POSITIONS = ("allreduce", "allgather", "reduce", "bcast")  # in place: input is the result


def _expected(coll, scheds, inputs, r, c):
    s = scheds[r]
    if coll.name == "allgather":
        return np.concatenate([inputs[(q, c)] for q in range(s.size)])
    if coll.name == "bcast":
        return inputs[(s.root, c)]
    total = sum(inputs[(q, c)] for q in range(s.size))
    if coll.name == "reduce_scatter":
        off = int(sum(s.counts[:r]))
        return total[off:off + s.counts[r]]
    return total if coll.name == "allreduce" or r == s.root else np.empty(0)


def simulate(scheds, calls: int, seed: int, in_place: bool) -> None:
    """Run ``calls`` collectives back to back, every rank advancing one op at a time in a
    random order, an op only once its waits are met (peer flags, as the executor keeps them),
    each call on buffer image ``call % 2``; check every output exactly against the
    collective's contract. The input is read through the schedule's input copies; in place
    (and always for a broadcast's one buffer) it is the result itself where the collective
    puts it at the same positions."""
    rng = random.Random(seed)
    size, count = scheds[0].size, scheds[0].count
    coll = collective(scheds[0].collective)
    segs = [[np.full(count, -7.0e9) for _ in range(2)] for _ in range(size)]
    flags = [0] * size
    nsteps = max(s.nsteps for s in scheds)
    ops = {r: [(i, o) for i, st in enumerate(s.steps) for o in st.shm]
           for r, s in enumerate(scheds)}
    inputs, srcs, works = {}, {}, {}
    for r, s in enumerate(scheds):
        n_in = coll.input_size(r, count, s.root, s.counts)
        aliased = coll.name == "bcast" or (in_place and coll.name in SAME_POSITIONS)
        for c in range(calls):
            inputs[(r, c)] = np.arange(n_in) * 1000.0 + r * 10 + c
            inp = np.full(count, np.nan)
            for cp in s.input_copies():
                inp[cp.at:cp.at + cp.n] = inputs[(r, c)][cp.lo:cp.hi]
            works[(r, c)] = inp if aliased else np.full(count, 3.3e9)
            srcs[(r, c)] = works[(r, c)] if aliased else inp
    call = [0] * size
    pos = [0] * size
    for r in range(size):
        if ops[r]:
            flags[r] = ops[r][0][0]
    while any(c < calls for c in call):
        todo = [r for r in range(size) if call[r] < calls]
        rng.shuffle(todo)
        moved = False
        for r in todo:
            c, base = call[r], call[r] * nsteps
            if pos[r] == len(ops[r]):
                flags[r] = base + nsteps
                call[r] += 1
                pos[r] = 0
                if ops[r]:
                    flags[r] = base + nsteps + ops[r][0][0]
                moved = True
                break
            step, o = ops[r][pos[r]]
            if any(flags[q] < base + s + 1 for q, s in o.after):
                continue
            src, out, mine = srcs[(r, c)], works[(r, c)], segs[r][c % 2]
            lo, hi = o.lo, o.hi
            if o.kind == PUBLISH:
                mine[lo:hi] = (out if o.source == "result" else src)[lo:hi]
            elif o.kind == REDUCE:
                total = src[lo:hi].copy()
                for q in o.peers:
                    total += segs[q][c % 2][lo:hi]
                if o.to_result:
                    out[lo:hi] = total
                if o.publish:
                    mine[lo:hi] = total
            else:
                out[lo:hi] = segs[o.peers[0]][c % 2][lo:hi]
            pos[r] += 1
            if pos[r] < len(ops[r]):  # the steps before its next op are complete
                flags[r] = max(flags[r], base + ops[r][pos[r]][0])
            moved = True
            break
        assert moved, f"deadlock: positions {pos}, calls {call}, flags {flags}"
    for c in range(calls):
        for r, s in enumerate(scheds):
            got = np.full(coll.output_size(r, count, s.root, s.counts), np.nan)
            for cp in s.output_copies():
                got[cp.at:cp.at + cp.n] = works[(r, c)][cp.lo:cp.hi]
            np.testing.assert_array_equal(got, _expected(coll, scheds, inputs, r, c),
                                          err_msg=f"rank {r} call {c}")


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [1, 7, 64])
@pytest.mark.parametrize("seed", range(3))
def test_random_interleavings_give_the_allreduce(size, count, seed):
    scheds = shm_schedules(size, count, 8, 16, max_chunks=10 ** 6)
    simulate(scheds, calls=4, seed=seed, in_place=bool(seed % 2))


def family_schedules(coll: str, size: int, count: int, root: int = 0, counts=None,
                     chunk: int = 16, most: int = 10 ** 6):
    return [shm_collective_schedule(coll, r, size, count, 8, chunk, root, counts, most)
            for r in range(size)]


def family_cases(size: int):
    """(collective, count, root, counts): roots first, middle and last; blocks even, uneven
    with zeros, all on one rank, all empty."""
    roots = sorted({0, size // 2, size - 1})
    uneven = tuple((r * 5 + 3) % 4 for r in range(size))
    lone = tuple(9 if r == size // 2 else 0 for r in range(size))
    for counts in dict.fromkeys([(3,) * size, uneven, lone, (0,) * size, (1,) * size]):
        for coll in ("reduce_scatter", "allgather"):
            yield coll, sum(counts), 0, counts
    for count in (0, 1, 2 * size + 1, 97):
        for root in roots:
            for coll in ("reduce", "bcast"):
                yield coll, count, root, None


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("chunk", [4, 1 << 20])
def test_family_schedules_verify(size, chunk):
    for coll, count, root, counts in family_cases(size):
        scheds = family_schedules(coll, size, count, root, counts, chunk)
        assert all(s.collective == coll and s.uses_shm == bool(count and (
            size > 1 or coll != "bcast")) for s in scheds)
        verify(scheds)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(3))
def test_random_interleavings_give_the_family(size, seed):
    for coll, count, root, counts in family_cases(size):
        if count:
            simulate(family_schedules(coll, size, count, root, counts, 8), calls=4,
                     seed=seed, in_place=bool(seed % 2))


def test_family_ranks_that_read_nothing_wait_for_their_readers():
    # an allgather where one rank holds every element: the others fetch it and never
    # publish, so its only wait on them is "entered the call" (step -1); without that wait
    # it could run two calls ahead and overwrite what they still read
    scheds = family_schedules("allgather", 3, 6, counts=(0, 6, 0), chunk=1 << 20)
    i, j, o = _first(scheds, 1, PUBLISH)
    assert set(o.after) == {(0, -1), (2, -1)}
    with pytest.raises(ScheduleError, match="never waits on rank"):
        verify(_replace_op(scheds, 1, i, j, after=()))
    # a broadcast's root likewise
    scheds = family_schedules("bcast", 3, 6, root=2, chunk=1 << 20)
    i, j, o = _first(scheds, 2, PUBLISH)
    assert set(o.after) == {(0, -1), (1, -1)}


def test_verifier_catches_family_mistakes():
    # a reduce-scatter's block copied out from the wrong place
    scheds = family_schedules("reduce_scatter", 3, 9, counts=(3, 3, 3), chunk=1 << 20)
    bad = [dataclasses.replace(scheds[1], outputs=(Copy(0, 3, 0),)), scheds[0], scheds[2]]
    with pytest.raises(ScheduleError, match="contributions|input positions"):
        verify(sorted(bad, key=lambda s: s.rank))
    # a reduce's root fetching a slice from a rank that holds only its own input there
    scheds = family_schedules("reduce", 3, 9, root=0, chunk=1 << 20)
    i, j, o = _first(scheds, 0, FETCH)
    other = 2 if o.peers[0] == 1 else 1
    with pytest.raises(ScheduleError, match="exactly once"):
        verify(_replace_op(scheds, 0, i, j, peers=(other,)))
    # an allgather fetching a block before its owner published it
    scheds = family_schedules("allgather", 2, 8, counts=(4, 4), chunk=1 << 20)
    i, j, _ = _first(scheds, 0, FETCH)
    with pytest.raises(ScheduleError, match="before its owner published"):
        verify(_replace_op(scheds, 0, i, j, after=()))
    # reading input where a rank has none (an allgather's other blocks)
    i, j, o = _first(scheds, 0, PUBLISH)
    with pytest.raises(ScheduleError, match="input where"):
        verify(_replace_op(scheds, 0, i, j, lo=4, hi=8))


# -- pricing -----------------------------------------------------------------------------------

def test_shm_and_hierarchical_node_tier_priced_by_the_shared_memory_model():
    from bmlmpi import selection as select
    from bmlmpi.model import Calibration, estimate

    nodes = consecutive_nodes(4, 2)
    calib = Calibration(alpha=2e-5, beta=1e-9, step_overhead=1e-5, shm_sync=3e-6,
                        shm_copy=1e-10, shm_reduce=2e-10, native=((8, 1e-5), (1 << 26, 1e-1)))
    slow_links = Calibration(**{**calib.to_dict(), "beta": 1e-6, "meta": {}})
    n = 1 << 18
    shm_tier = estimate(["hierarchical"], n, 4, 4, calib=calib, nodes=nodes, intra="shm")
    ring_tier = estimate(["hierarchical"], n, 4, 4, calib=calib, nodes=nodes)
    assert shm_tier != ring_tier
    # auto prices the node tier in shared memory where the calibration measured it
    why = select.explain(n, 4, 4, calib, nodes=nodes)
    got = {c.name: c.model for c in why.candidates}
    assert got["hierarchical"] == pytest.approx(shm_tier["hierarchical"])
    # the shm family: no link term at all (β does not move it), the shared-memory one does
    for coll, kw in (("reduce_scatter", {"counts": (n // 4,) * 4}), ("allgather", {}),
                     ("reduce", {"root": 1}), ("bcast", {"root": 3})):
        one = estimate(["shm"], n, 4, 4, calib=calib, collective=coll, **kw)["shm"]
        assert one == estimate(["shm"], n, 4, 4, calib=slow_links, collective=coll,
                               **kw)["shm"]
        dearer = Calibration(**{**calib.to_dict(), "shm_copy": 1e-9, "meta": {}})
        assert estimate(["shm"], n, 4, 4, calib=dearer, collective=coll, **kw)["shm"] > one
