"""Shared-memory schedules, proven without MPI: the verifier's rules for shared-memory steps
(every element reduced once from every rank's input, no read before the owner published, no
overwrite under a reader, the in-place input read before it is overwritten), and a simulator
that runs every rank's ops under adversarial random interleavings, each op only once its waits
are met, over several calls that reuse the two buffer images, with real data: a read of a
stale or half-written range shows as a wrong result."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from bmlmpi.schedules.hierarchical import hierarchical_schedules
from bmlmpi.schedules.shm import MAX_CHUNKS, chunk_count, shm_schedule, shm_schedules
from bmlmpi.schedules.types import FETCH, PUBLISH, REDUCE, ShmOp, Step
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


# -- the interleaving simulator --------------------------------------------------------------

def simulate(scheds, calls: int, seed: int, in_place: bool) -> None:
    """Run ``calls`` allreduces back to back, every rank advancing one op at a time in a random
    order, an op only once its waits are met (peer flags, as the executor keeps them), each
    call on buffer image ``call % 2``; check every result exactly."""
    rng = random.Random(seed)
    size, count = scheds[0].size, scheds[0].count
    segs = [[np.full(count, -7.0e9) for _ in range(2)] for _ in range(size)]
    flags = [0] * size
    nsteps = max(s.nsteps for s in scheds)
    ops = {r: [(i, o) for i, st in enumerate(s.steps) for o in st.shm]
           for r, s in enumerate(scheds)}
    inputs = {(r, c): np.arange(count) * 1000.0 + r * 10 + c for r in range(size)
              for c in range(calls)}
    outs = {(r, c): (inputs[(r, c)].copy() if in_place else np.full(count, 3.3e9))
            for r in range(size) for c in range(calls)}
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
            src = outs[(r, c)] if in_place else inputs[(r, c)]
            out, mine = outs[(r, c)], segs[r][c % 2]
            lo, hi = o.lo, o.hi
            if o.kind == PUBLISH:
                mine[lo:hi] = (out if o.source == "result" else src)[lo:hi]
            elif o.kind == REDUCE:
                total = src[lo:hi].copy()
                for q in o.peers:
                    total += segs[q][c % 2][lo:hi]
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
        want = sum(inputs[(r, c)] for r in range(size))
        for r in range(size):
            np.testing.assert_array_equal(outs[(r, c)], want, err_msg=f"rank {r} call {c}")


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [1, 7, 64])
@pytest.mark.parametrize("seed", range(3))
def test_random_interleavings_give_the_allreduce(size, count, seed):
    scheds = shm_schedules(size, count, 8, 16, max_chunks=10 ** 6)
    simulate(scheds, calls=4, seed=seed, in_place=bool(seed % 2))
