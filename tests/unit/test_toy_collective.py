"""A toy collective added from its own files alone (tests/toy_collective.py: one record, one
prepare function, one schedule builder): registered, it is verified, priced, listed with
its algorithm (and without ``native``, which serves only MPI's own collectives) and made a
call record the pipeline can number, agree and run; tests/mpi/test_toy_collective_mpi.py
runs it. The registry's refusals are checked here too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from toy_collective import ALGORITHM, NAME, RECORD, Reverse, build, prepare_reverse, registered

from bmlmpi import selection
from bmlmpi.call_numbers import TAG_KINDS
from bmlmpi.model import SharedMemoryNode, algorithm_cost
from bmlmpi.schedules import algorithms, collectives
from bmlmpi.schedules.algorithms import Context
from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer, block_offsets
from bmlmpi.schedules.verify import ScheduleError, verify

COUNTS = {1: (3,), 2: (2, 5), 3: (4, 0, 1), 4: (1, 2, 3, 4), 5: (0, 3, 1, 4, 2),
          7: (2,) * 7, 9: (1, 0, 2, 3, 0, 5, 1, 1, 4)}


def contexts():
    for size, counts in COUNTS.items():
        yield Context(size, sum(counts), 8, collective=NAME, counts=counts)


def test_the_toy_is_verified_and_priced_once_registered():
    with registered():
        assert selection.algorithms(NAME) == ["auto", ALGORITHM]   # native serves MPI's own
        assert NAME in collectives.called() and NAME in algorithms.get(ALGORITHM).collectives
        for ctx in contexts():
            verify(algorithms.schedules(ALGORITHM, ctx))
            cost = algorithm_cost(ALGORITHM, ctx.count, 8, ctx.size,
                                  SharedMemoryNode(ctx.size), collective=NAME,
                                  counts=ctx.counts)
            assert len(cost.steps) == 1
            moved = any(c and ctx.size - 1 - r != r for r, c in enumerate(ctx.counts))
            assert (cost.steps[0].messages > 0) == moved
    with pytest.raises(ValueError, match="unknown collective"):
        collectives.collective(NAME)
    assert ALGORITHM not in algorithms.REGISTRY


def _to_the_next_rank(ctx: Context) -> Schedule:
    """A misplaced toy: each block to rank r + 1 instead of the partner."""
    off = block_offsets(ctx.blocks())
    r, size = ctx.rank, ctx.size
    to, frm = (r + 1) % size, (r - 1) % size
    step = Step((Transfer(to, off[r], off[r + 1]),) if to != r else (),
                (Recv(frm, off[frm], off[frm + 1]),) if frm != r else ())
    return dataclasses.replace(build(ctx), steps=(step,))


def test_the_verifier_holds_the_toy_to_its_contract():
    with registered():
        ctx = Context(4, 10, 8, collective=NAME, counts=(1, 2, 3, 4))
        with pytest.raises(ScheduleError):
            verify([_to_the_next_rank(ctx.at(r)) for r in range(4)])
        quiet = [dataclasses.replace(build(ctx.at(r)), steps=(Step(),)) for r in range(4)]
        with pytest.raises(ScheduleError):
            verify(quiet)


def test_its_call_record_is_the_pipelines():
    with registered():
        send, recv = np.arange(5, dtype=np.int64) + 10, np.zeros(5, np.int64)
        call = prepare_reverse(1, 3, send, recv, ALGORITHM)
        assert call.tag_kind == RECORD.tag_kind
        assert call.total == 15 and call.counts == (5, 5, 5)
        assert call.signature(())[0] == NAME and "reverse of 15" in call.describe_signature(
            call.signature(()))
        traced = call.traced()
        assert traced.op is None and traced.root is None          # neither reduces nor rooted
        inp, out = call.schedule_buffers()
        assert inp is call.src and out is call.out
        with pytest.raises(TypeError, match="dtype"):
            prepare_reverse(0, 3, send, recv.astype(np.int32), ALGORITHM)


def test_the_registry_refuses_a_builtin_name_and_a_taken_tag_block():
    assert all(0 <= c.tag_kind < TAG_KINDS for c in collectives.COLLECTIVES.values())
    assert all(0 <= k < TAG_KINDS for k in collectives.FREE_TAG_KINDS)
    assert not {c.tag_kind for c in collectives.COLLECTIVES.values()} & set(
        collectives.FREE_TAG_KINDS)
    with pytest.raises(ValueError, match="cannot name a new collective"):
        collectives.register(Reverse("bcast", reduces=False, rooted=False, blocked=True,
                                     tag_kind=6))
    with pytest.raises(ValueError, match="not free"):
        collectives.register(Reverse("other", reduces=False, rooted=False, blocked=True,
                                     tag_kind=4))
    with registered():
        with pytest.raises(ValueError, match="not free"):
            collectives.register(dataclasses.replace(RECORD, name="other"))
    assert NAME not in collectives.COLLECTIVES
