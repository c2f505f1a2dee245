"""Allreduce and the rest of the family on GPU arrays across ranks: cupy arrays and torch
CUDA tensors.

Skipped, as a whole module, where cupy is missing or sees no CUDA device (CI). Launched under
mpiexec by ``tests/gpu/test_gpu_mpi_launch.py`` where a GPU exists; several ranks may share
one device. Inputs are the position- and rank-dependent data of the host tests, made on the
device, so a misplaced range or a stale staging copy fails.
"""

import numpy as np
import pytest
from conftest import all_ranks_agree, rank_input, reference
from mpi4py import MPI

import bmlmpi
from bmlmpi.kernels import gpu

cupy = pytest.importorskip("cupy")
if not gpu.gpu_available():
    pytest.skip("no CUDA device visible to cupy", allow_module_level=True)

ALGORITHMS = bmlmpi.algorithms()
DTYPES = [np.float16, np.float32, np.float64, np.int32, np.uint8]
OPS = [(MPI.SUM, "sum"), (MPI.MAX, "max"), (bmlmpi.AVG, "avg")]


def _counts(size: int) -> list[int]:
    return [0, 1, 3 * size + 1, 1031, (1 << 20) + 3]


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cupy_arrays_every_algorithm(comm, algorithm):
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
    failures = []
    for dtype in DTYPES:
        for op, op_id in OPS:
            for n in _counts(comm.size):
                want = reference(n, comm.size, dtype, op)
                x = cupy.asarray(rank_input(n, comm.rank, dtype, op))
                out = cupy.full_like(x, 99)
                ctx.Allreduce(x, out, op=op)
                inplace = x.copy()
                ctx.Allreduce(MPI.IN_PLACE, inplace, op=op)
                for label, got in (("out", out), ("in_place", inplace)):
                    if not np.array_equal(cupy.asnumpy(got), want):
                        failures.append(f"{np.dtype(dtype).name} {op_id} n={n} {label}")
                if not np.array_equal(cupy.asnumpy(x), rank_input(n, comm.rank, dtype, op)):
                    failures.append(f"{np.dtype(dtype).name} {op_id} n={n}: sendbuf modified")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_returning_allreduce_gives_a_device_array(comm):
    x = cupy.asarray(rank_input(4099, comm.rank, np.float32, MPI.SUM))
    got = bmlmpi.Communicator(comm, algorithm="bml").allreduce(x)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), reference(4099, comm.size, np.float32,
                                                               MPI.SUM))


@pytest.mark.mpi
def test_data_made_on_a_busy_stream_is_waited_for(comm):
    """The input is still being written by a queued kernel on a non-default stream when
    Allreduce is called: staging must synchronise that stream, not read stale memory."""
    n = 1 << 22
    failures = []
    ctx = bmlmpi.Communicator(comm, algorithm="ring")
    for trial in range(3):
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.zeros(n, cupy.float64)
            for _ in range(50):  # long enough that the copy would race it if unsynchronised
                x += 1.0
            x += comm.rank + trial
            out = cupy.empty_like(x)
            ctx.Allreduce(x, out)
        want = comm.size * 50.0 + sum(range(comm.size)) + comm.size * trial
        got = cupy.asnumpy(out)
        if not np.all(got == want):
            failures.append(f"trial {trial}: {np.unique(got)[:4]} want {want}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_torch_cuda_tensors(comm):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    n = 10_007
    base = rank_input(n, comm.rank, np.float32, MPI.SUM)
    x = torch.from_numpy(base).cuda()
    out = torch.empty_like(x)
    bmlmpi.Allreduce(x, out, comm=comm, algorithm="multitree")
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), reference(n, comm.size, np.float32,
                                                                MPI.SUM))


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["bml", "ring", "native"])
def test_cupy_arrays_in_the_family(comm, algorithm):
    """Reduce-scatter, allgather(v), reduce and broadcast of cupy arrays (staged through
    host memory as Allreduce's), against numpy's result of the same data."""
    size, rank = comm.size, comm.rank
    ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
    failures = []
    counts = [(r * 5 + 3) % 4 + (1 << 16) * (r % 2) for r in range(size)]
    total, off = sum(counts), np.cumsum([0] + counts).tolist()
    for dtype, op in ((np.float32, MPI.SUM), (np.int32, MPI.MAX), (np.float64, bmlmpi.AVG)):
        x = rank_input(total, rank, dtype, op)
        want = reference(total, size, dtype, op)
        out = cupy.full(counts[rank], 7, dtype)
        ctx.Reduce_scatter(cupy.asarray(x), out, counts, op)
        if not np.array_equal(cupy.asnumpy(out), want[off[rank]:off[rank + 1]]):
            failures.append(f"Reduce_scatter {np.dtype(dtype).name}")
        if algorithm in bmlmpi.algorithms("reduce"):
            red = cupy.zeros(total, dtype)
            ctx.Reduce(cupy.asarray(x), red if rank == size - 1 else None, op, size - 1)
            if rank == size - 1 and not np.array_equal(cupy.asnumpy(red), want):
                failures.append(f"Reduce {np.dtype(dtype).name}")
        gathered = cupy.zeros(total, dtype)
        ctx.Allgatherv(cupy.asarray(x[off[rank]:off[rank + 1]]), [gathered, counts])
        parts = [rank_input(total, r, dtype, op)[off[r]:off[r + 1]] for r in range(size)]
        if not np.array_equal(cupy.asnumpy(gathered), np.concatenate(parts)):
            failures.append(f"Allgatherv {np.dtype(dtype).name}")
        if algorithm in bmlmpi.algorithms("bcast"):
            buf = cupy.asarray(rank_input(total, rank, dtype, op))
            ctx.Bcast(buf, size // 2)
            if not np.array_equal(cupy.asnumpy(buf), rank_input(total, size // 2, dtype, op)):
                failures.append(f"Bcast {np.dtype(dtype).name}")
    ctx.Free()
    all_ranks_agree(comm, failures)
