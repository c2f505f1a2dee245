"""The shared-memory allreduce (``algorithm="shm"``) and hierarchical's shared-memory node tier
on real ranks: every dtype and op, in place and not, counts 0, 1, odd and not multiples of the
chunk, position-dependent data, against numpy and comm.Allreduce.

Small chunks (``BMLMPI_SHM_CHUNK``, read when a signature's schedule is built) make even small
counts run many pipelined chunks; one large count runs the default chunk. The launcher's plain
``pytest tests/mpi`` at N = 1..12 runs this module: every datatype at 1-4 ranks, and beyond
the datatypes of ``conftest.DTYPES_BEYOND_4``, one of each element size (the chunks are cut
in bytes) and kernel family, with every op, count and mode (tests/mpi/conftest.py says why).
"""

import numpy as np
import pytest
from conftest import ALL_DTYPES, OP_IDS, OPS, all_ranks_agree, rank_input, reference
from mpi4py import MPI

import bmlmpi
from bmlmpi.shm import ShmRun, ShmUnavailable

SMALL_CHUNK = "96"  # bytes per rank's slice: several chunks already at a few hundred elements


def _counts(size: int) -> list[int]:
    # 0, 1, fewer than the slices, odd, not a multiple of any chunk
    return [0, 1, 2 * size + 1, 1031]


def _check(ctx, comm, n, dtype, op, in_place, failures, label):
    x = rank_input(n, comm.rank, dtype, op)
    if in_place:
        got = x.copy()
        ctx.Allreduce(MPI.IN_PLACE, got, op=op)
    else:
        got = np.full_like(x, 99)
        ctx.Allreduce(x, got, op=op)
        if not np.array_equal(x, rank_input(n, comm.rank, dtype, op)):
            failures.append(f"{label}: sendbuf modified")
    want = reference(n, comm.size, dtype, op)
    if not np.array_equal(got, want):
        bad = np.nonzero(got != want)[0][0]
        failures.append(f"{label}: first bad index {bad} got {got[bad]} want {want[bad]}")
    if op is not bmlmpi.AVG:
        native = np.empty_like(x)
        comm.Allreduce(x, native, op=op)
        if np.array_equal(native, want) and not np.array_equal(got, native):
            failures.append(f"{label}: differs from comm.Allreduce")


def _runs_in_shared_memory(ctx, n: int) -> bool:
    req = ctx.Iallreduce(np.ones(n), np.empty(n))
    kind = req.run
    req.Wait()
    return isinstance(kind, ShmRun)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_shm_every_dtype_op_count_and_mode(comm, dtype):
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    failures = []
    for n in _counts(comm.size):
        for op, name in zip(OPS, OP_IDS, strict=True):
            if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
                continue  # not defined for complex numbers (refused, tested elsewhere)
            for in_place in (False, True):
                _check(ctx, comm, n, dtype, op, in_place, failures,
                       f"shm n={n} {np.dtype(dtype).name} {name} in_place={in_place}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_shm_many_chunks(comm, monkeypatch):
    """Small chunks: many pipelined chunks, counts that are no multiple of a chunk, each
    signature twice (the blocking fast path, the other buffer image)."""
    monkeypatch.setenv("BMLMPI_SHM_CHUNK", SMALL_CHUNK)
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    failures = []
    for n in (1031, 3 * comm.size + 2):
        for dtype, op in ((np.int32, MPI.SUM), (np.float64, bmlmpi.AVG), (np.uint8, MPI.MAX),
                          (np.float16, MPI.MIN), (np.complex128, MPI.PROD)):
            for in_place in (False, True):
                for again in ("", " again"):
                    _check(ctx, comm, n, dtype, op, in_place, failures,
                           f"shm{again} n={n} {np.dtype(dtype).name} {in_place}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_shm_default_chunk_large_and_growth(comm):
    """Counts that grow the window, then shrink again; the default (cache-sized) chunk on a
    count that is no multiple of it; the plan runs on the node's shared window."""
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    failures = []
    for n in (300_001, 17, 1_000_003, 5):
        for dtype in (np.float32, np.int64):
            for in_place in (False, True):
                _check(ctx, comm, n, dtype, MPI.SUM, in_place, failures,
                       f"n={n} {np.dtype(dtype).name} in_place={in_place}")
    if not _runs_in_shared_memory(ctx, 1000):
        failures.append("the allreduce did not run in shared memory")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_shm_nonblocking_calls_overlap(comm):
    """Two shared-memory allreduces outstanding at once, waited on in reverse order: the
    second waits for the first (one window), neither hangs."""
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    a = rank_input(5001, comm.rank, np.float64, MPI.SUM)
    b = rank_input(333, comm.rank, np.int32, MPI.MAX)
    ra, rb = np.empty_like(a), np.empty_like(b)
    qa = ctx.Iallreduce(a, ra)
    qb = ctx.Iallreduce(b, rb, op=MPI.MAX)
    qb.Wait()
    qa.Wait()
    ok = (np.array_equal(ra, reference(5001, comm.size, np.float64, MPI.SUM))
          and np.array_equal(rb, reference(333, comm.size, np.int32, MPI.MAX)))
    ctx.Free()
    all_ranks_agree(comm, [] if ok else ["wrong result"])


@pytest.mark.mpi
def test_shm_refused_on_every_rank_across_nodes(comm, monkeypatch):
    """With one rank per (pretended) node the communicator spans nodes: every rank raises
    the same clear error, nobody hangs, and the communicator stays usable."""
    if comm.size == 1:
        pytest.skip("one rank is one node")
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", "1")
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    monkeypatch.delenv("BMLMPI_RANKS_PER_NODE")
    x = np.ones(10)
    with pytest.raises(ShmUnavailable, match="one node"):
        ctx.Allreduce(MPI.IN_PLACE, x)
    y = np.ones(10)
    bmlmpi.Allreduce(MPI.IN_PLACE, y, comm=comm, algorithm="ring")
    ok = np.array_equal(y, np.full(10, comm.size, dtype=float))
    ctx.Free()
    all_ranks_agree(comm, [] if ok else ["wrong result"])


@pytest.mark.mpi
@pytest.mark.parametrize("per_node", [2, 3])
def test_hierarchical_node_tier_in_shared_memory(comm, monkeypatch, per_node):
    """Pretended nodes inside this machine: hierarchical's node tier runs in shared memory
    (and the nodes between them by messages), equal and unequal nodes."""
    monkeypatch.setenv("BMLMPI_SHM_CHUNK", SMALL_CHUNK)
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", str(per_node))
    ctx = bmlmpi.Communicator(comm, algorithm="hierarchical")
    monkeypatch.delenv("BMLMPI_RANKS_PER_NODE")
    failures = []
    for n in (1, 2 * comm.size + 1, 5_001):
        for dtype, op in ((np.int32, MPI.SUM), (np.float64, bmlmpi.AVG), (np.int16, MPI.MIN),
                          (np.complex64, MPI.PROD), (np.float16, MPI.MAX)):
            for in_place in (False, True):
                _check(ctx, comm, n, dtype, op, in_place, failures,
                       f"hierarchical/{per_node} n={n} {np.dtype(dtype).name} {in_place}")
    if not _runs_in_shared_memory(ctx, 1000):
        failures.append("the node tier did not run in shared memory")
    ctx.Free()
    all_ranks_agree(comm, failures)
