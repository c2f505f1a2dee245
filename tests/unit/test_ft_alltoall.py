"""The all-to-all's failure contract as the fault-tolerant policy applies it, without MPI:
a call made for its frame, run over the survivors (:func:`bmlmpi.ft.family.retarget`), and
an ``Alltoallv``'s counts completed where a rank was lost while they were gathered
(:func:`bmlmpi.ft.family.complete_lost_counts`)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from bmlmpi.calls import offsets
from bmlmpi.family import prepare_alltoall
from bmlmpi.ft.family import ContributionsLost, complete_lost_counts, retarget


def pair(i: int, j: int) -> int:
    return (i * 5 + j * 3) % 4  # uneven, zeros included


def table(size: int) -> np.ndarray:
    rows = np.array([[pair(i, j) for j in range(size)] for i in range(size)], np.int64)
    return np.concatenate([rows, rows.T], axis=1)


@pytest.mark.parametrize("in_place", [False, True])
def test_a_vector_call_keeps_the_survivors_blocks_where_the_frame_put_them(in_place):
    size, me = 4, 2
    t = table(size)
    if in_place:  # symmetric counts, as MPI requires in place
        rows = np.array([[(i + j) % 4 for j in range(size)] for i in range(size)], np.int64)
        t = np.concatenate([rows, rows.T], axis=1)
    sends, recvs = list(t[me, :size]), list(t[me, size:])
    rdispls = [0] * size
    at = 1
    for j in reversed(range(size)):
        rdispls[j] = at
        at += recvs[j] + 1
    out = np.arange(at, dtype=np.float64) + 0.5
    send = MPI.IN_PLACE if in_place else [np.arange(sum(sends), dtype=np.float64), sends]
    call = prepare_alltoall(me, size, send,
                            [out, recvs, rdispls, MPI.DOUBLE], t, "pairwise")
    call.extra["members"] = (10, 11, 12, 13)
    before = out.copy()
    run = retarget(call, [10, 12, 13], 1)          # original rank 11 lost
    assert (run.rank, run.size) == (1, 3)
    keep = [0, 2, 3]
    assert run.counts == tuple(int(t[i, j]) for i in keep for j in keep)
    assert run.displs == tuple(rdispls[i] for i in keep)
    assert run.send_displs == (None if in_place else tuple(offsets(sends)[i] for i in keep))
    error = run.outcome()
    assert isinstance(error, ContributionsLost) and error.lost == (11,)
    lost = slice(rdispls[1], rdispls[1] + recvs[1])
    assert not out[lost].any()
    rest = np.ones(out.size, bool)
    rest[lost] = False
    assert np.array_equal(out[rest], before[rest])


def test_equal_blocks_run_as_blocks_at_their_offsets():
    size = 3
    out = np.zeros(3 * size, np.int32)
    call = prepare_alltoall(0, size, np.arange(3 * size, dtype=np.int32), out, None, "bruck")
    call.extra["members"] = (0, 1, 2)
    run = retarget(call, [0, 2], 0)
    assert run.counts == (3,) * 4 and run.displs == (0, 6) and run.send_displs == (0, 6)
    assert not run.native_block   # the kept blocks are no longer packed
    assert run.outcome().lost == (1,)


def test_counts_lost_while_gathered_are_rebuilt_from_the_others():
    size = 5
    whole = table(size)
    gathered = whole.copy()
    gathered[[1, 3]] = 0           # the Allgather's slots of the ranks lost hold zeros
    complete_lost_counts(gathered, [1, 3])
    survivors = [0, 2, 4]
    for i in range(size):
        for j in survivors:        # every count a survivor's block depends on is the real one
            assert gathered[i, j] == whole[i, j] and gathered[j, i] == whole[j, i]
    rows, columns = gathered[:, :size], gathered[:, size:]
    assert (rows == columns.T).all()   # the pair matrix agrees: no ArgumentMismatch
