"""Every rank builds the same BCube-preserving recovery schedule, with no communication.

The fault-tolerant communicator has each survivor plan the recovery on its own
(:func:`bmlmpi.ft.recovery.bcube_recovery_schedule`, a deterministic search): here
every process plans seed 001's example and a two-server failure, and the ranks compare hashes.
"""

import hashlib

import pytest
from conftest import all_ranks_agree

from bmlmpi.ft.recovery import bcube_recovery_schedule, recovery_plan
from bmlmpi.schedules.verify import verify

CASES = [((3, 3), (0,)), ((3, 3), (0, 4))]
COUNT = 1001


def digest(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()


@pytest.mark.mpi
@pytest.mark.parametrize("shape,dead", CASES)
def test_every_rank_builds_the_same_recovery_schedule(comm, shape, dead):
    live = [r for r in range(9) if r not in dead]
    role = live[comm.rank % len(live)]         # the survivor this rank plays
    mine = bcube_recovery_schedule(role, shape, dead, COUNT)
    plan = recovery_plan(shape, frozenset(dead))
    seen = comm.allgather((digest(plan.chosen.trees), role, digest(mine.steps)))
    failures = []
    if len({plan_hash for plan_hash, _, _ in seen}) != 1:
        failures.append(f"ranks chose different plans: {[h[:8] for h, _, _ in seen]}")
    by_role: dict[int, set[str]] = {}
    for _, r, h in seen:
        by_role.setdefault(r, set()).add(h)
    if any(len(hs) > 1 for hs in by_role.values()):
        failures.append(f"one survivor's schedule built differently: {by_role}")
    all_ranks_agree(comm, failures)
    # where the ranks play every survivor, their own schedules make one allreduce together
    built = comm.gather(mine, root=0)
    if comm.rank == 0 and comm.size >= len(live):
        verify([built[i] for i in range(len(live))], live=live)
