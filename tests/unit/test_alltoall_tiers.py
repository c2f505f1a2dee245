"""The all-to-all inside one node's shared memory (``shm``) and across nodes in three tiers
(``hierarchical``), MPI-free: the verifier proves each delivers every block, element for
element, to its place, at every N from 1 to 20 and a sample up to 64, equal blocks and uneven
pair counts with zeros, on equal and unequal nodes; it rejects a block fetched from the
wrong peer or before its sender published it; the layouts and message counts the modules
state; the model prices both."""

from __future__ import annotations

import dataclasses

import pytest

from bmlmpi.model import SharedMemoryNode, TwoTierNetwork, algorithm_cost
from bmlmpi.schedules import algorithms
from bmlmpi.schedules.algorithms import Context
from bmlmpi.schedules.shm import alltoall_slots, shm_alltoall_schedule
from bmlmpi.schedules.types import FETCH, PUBLISH, ShmOp, Step
from bmlmpi.schedules.verify import ScheduleError, verify
from bmlmpi.topology.nodes import consecutive_nodes, nodes_from_ids


def uneven(size: int) -> tuple[int, ...]:
    return tuple((s * 5 + d * 3 + 1) % 4 for s in range(size) for d in range(size))


def sparse(size: int) -> tuple[int, ...]:
    return tuple(0 if (s + 2 * d) % 3 else s + d + 1 for s in range(size) for d in range(size))


def contexts(size: int, nodes=None) -> list[Context]:
    out = [Context(size, size * size * b, 4, collective="alltoall", nodes=nodes)
           for b in (1, 5)]
    for pairs in (uneven(size), sparse(size), (0,) * (size * size)):
        out.append(Context(size, sum(pairs), 4, collective="alltoall", counts=pairs,
                           nodes=nodes))
    return out


def layouts(size: int) -> list:
    """One node; nodes of 2 and 3 consecutive ranks (the last one short); unequal nodes
    whose ranks interleave."""
    out = [consecutive_nodes(size, size)]
    out += [consecutive_nodes(size, k) for k in (2, 3) if k < size]
    if size >= 4:
        out.append(nodes_from_ids([(r * 7) % 3 if r % 4 else 0 for r in range(size)]))
    return out


def check(name: str, ctx: Context):
    scheds = algorithms.schedules(name, ctx)
    assert all(s.collective == "alltoall" and s.counts == ctx.pairs() for s in scheds)
    verify(scheds)
    return scheds


@pytest.mark.parametrize("size", range(1, 21))
def test_shm_verifies_small(size):
    for ctx in contexts(size):
        for chunk in (1, 1 << 20):  # many chunks (pipelined), and one
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("BMLMPI_SHM_CHUNK", str(chunk))
                check("shm", ctx)


@pytest.mark.parametrize("size", range(1, 21))
def test_hierarchical_verifies_small_on_every_layout(size):
    for nodes in layouts(size):
        for ctx in contexts(size, nodes):
            check("hierarchical", ctx)


@pytest.mark.parametrize("size", [23, 32, 36, 64])
def test_both_verify_at_larger_sizes(size):
    pairs = uneven(size)
    ctx = Context(size, sum(pairs), 4, collective="alltoall", counts=pairs)
    check("shm", ctx)
    for k in (4, 8):
        check("hierarchical", dataclasses.replace(ctx, nodes=consecutive_nodes(size, k)))


def test_shm_gives_every_block_one_slot_on_both_sides():
    size = 5
    pairs = uneven(size)
    slot = alltoall_slots(size, pairs)
    # slot k is as wide as the widest block travelling k ranks on; no slot holds two blocks
    # of one row or of one column
    for k in range(size):
        assert slot[k + 1] - slot[k] == max(pairs[s * size + (s + k) % size]
                                            for s in range(size))
    for rank in range(size):
        sched = shm_alltoall_schedule(rank, size, pairs, chunk_bytes=1 << 20)
        assert sched.count == slot[-1]
        assert [c.at for c in sched.input_copies()] == [
            slot[(d - rank) % size] for d in range(size) if pairs[rank * size + d]]
        assert len(sched.steps) == 2          # one chunk: G then F
        fetched = {o.peers[0] for o in sched.steps[1].shm if o.kind == FETCH}
        assert fetched == {s for s in range(size) if s != rank and pairs[s * size + rank]}
        assert not any(st.sends or st.recvs for st in sched.steps)


def _with_op(s, step: int, index: int, op: ShmOp):
    ops = list(s.steps[step].shm)
    ops[index] = op
    steps = list(s.steps)
    steps[step] = Step(shm=tuple(ops))
    return dataclasses.replace(s, steps=tuple(steps))


def test_the_verifier_rejects_a_wrong_peer_and_a_fetch_too_early():
    size = 4
    pairs = (3,) * 16
    scheds = [shm_alltoall_schedule(r, size, pairs, chunk_bytes=1 << 20) for r in range(size)]
    verify(scheds)
    s = scheds[1]
    i, j = next((i, j) for i, st in enumerate(s.steps) for j, o in enumerate(st.shm)
                if o.kind == FETCH)
    o = s.steps[i].shm[j]
    other = next(p for p in range(size) if p not in (1, o.peers[0]))
    wrong_peer = dataclasses.replace(o, peers=(other,), after=((other, o.after[0][1]),))
    with pytest.raises(ScheduleError):
        verify([scheds[0], _with_op(s, i, j, wrong_peer), *scheds[2:]])
    no_wait = dataclasses.replace(o, after=())
    with pytest.raises(ScheduleError, match="before its owner published it"):
        verify([scheds[0], _with_op(s, i, j, no_wait), *scheds[2:]])
    publish = next(j for j, o in enumerate(s.steps[0].shm) if o.kind == PUBLISH)
    shifted = dataclasses.replace(s.steps[0].shm[publish], source="result")
    with pytest.raises(ScheduleError):
        verify([scheds[0], _with_op(s, 0, publish, shifted), *scheds[2:]])


def test_hierarchical_crosses_between_nodes_once_per_pair_of_nodes():
    size, per_node = 12, 3
    nodes = consecutive_nodes(size, per_node)
    ctx = Context(size, size * size * 2, 4, collective="alltoall", nodes=nodes)
    scheds = check("hierarchical", ctx)
    assert {s.nsteps for s in scheds} == {3}
    across = [(s.rank, t.peer, t.n) for s in scheds for t in s.steps[1].sends]
    assert all(nodes.node_of(a) != nodes.node_of(b) for a, b, _ in across)
    # one pair of ranks for each ordered pair of nodes, carrying every block between them
    partners = {(a, b) for a, b, _ in across}
    assert sorted((nodes.node_of(a), nodes.node_of(b)) for a, b in partners) == sorted(
        (a, b) for a in range(4) for b in range(4) if a != b)
    for a, b in partners:
        assert sum(n for x, y, n in across if (x, y) == (a, b)) == per_node * per_node * 2
    # one node: a one-step direct exchange
    one = check("hierarchical", dataclasses.replace(ctx, nodes=consecutive_nodes(size, size)))
    assert {s.nsteps for s in one} == {1}


def test_the_records_serve_alltoall_and_the_model_prices_both():
    assert algorithms.algorithms("alltoall") == ["auto", "hierarchical", "shm", "pairwise",
                                                 "bruck", "bcube", "native"]
    assert algorithms.fixed_choice("alltoall") == "pairwise"
    one_node = Context(4, 64, 4, collective="alltoall", nodes=consecutive_nodes(4, 4))
    two_nodes = Context(4, 64, 4, collective="alltoall", nodes=consecutive_nodes(4, 2))
    assert "shm" in algorithms.candidates(one_node)
    assert "hierarchical" not in algorithms.candidates(one_node)
    assert "hierarchical" in algorithms.candidates(two_nodes)
    assert "shm" not in algorithms.candidates(two_nodes)
    # shm: a rank copies its 3 blocks of 4 for the others into its segment, fetches the 3
    # for it, and copies its own block once; priced at the copy rate per step
    shm = algorithm_cost("shm", 64, 4, 4, SharedMemoryNode(4), collective="alltoall")
    assert sum(st.copied for st in shm.steps) == 2 * 3 * 4 + 4
    assert shm.seconds(4, 1e-6, 1e-9, shm_sync=1e-6, shm_copy=1e-10) > 0
    # hierarchical: priced on nodes of two behind NICs, cheaper than pairwise for tiny
    # blocks (3 steps against N - 1 = 7 latencies)
    nodes = consecutive_nodes(8, 2)
    net = TwoTierNetwork(nodes)
    tiny = {n: algorithm_cost(n, 64, 4, 8, net, collective="alltoall", nodes=nodes)
            .seconds(4, 1e-5, 1e-9) for n in ("hierarchical", "pairwise")}
    assert 0 < tiny["hierarchical"] < tiny["pairwise"]
