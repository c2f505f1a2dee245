"""Per-call time of small repeated blocking calls, bmlmpi's scheduled fast paths against
mpi4py's own calls: ``bmlmpi-run -n 2 python perf/family/small_calls.py [ring]`` (2 float32
per rank; 2000 calls after 50 untimed, rank 0 prints). Run it under two checkouts
(``PYTHONPATH``) in turn for an A/B on the same machine and load (perf/family/README.md)."""

import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi


def timed(comm: MPI.Comm, name: str, call, reps: int = 2000) -> None:
    for _ in range(50):
        call()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    per_call = (time.perf_counter() - start) / reps
    if comm.rank == 0:
        print(f"{name:34s} {per_call * 1e6:8.1f} us", flush=True)


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    ctx = bmlmpi.Communicator(comm)
    alg = sys.argv[1] if len(sys.argv) > 1 else "ring"
    n = 2
    a = np.arange(n * size, dtype=np.float32) + rank
    block = np.empty(n, np.float32)
    gathered = np.empty(n * size, np.float32)
    full = np.empty(n * size, np.float32)
    cases = [
        ("mpi4py Allreduce", lambda: comm.Allreduce(a, full)),
        (f"bml Allreduce {alg}", lambda: ctx.Allreduce(a, full, algorithm=alg)),
        ("mpi4py Reduce_scatter_block", lambda: comm.Reduce_scatter_block(a, block)),
        (f"bml RSB {alg}", lambda: ctx.Reduce_scatter_block(a, block, algorithm=alg)),
        ("mpi4py Allgather", lambda: comm.Allgather(block, gathered)),
        (f"bml Allgather {alg}", lambda: ctx.Allgather(block, gathered, algorithm=alg)),
        ("mpi4py Reduce", lambda: comm.Reduce(a, full, root=size - 1)),
        ("bml Reduce tree", lambda: ctx.Reduce(a, full, root=size - 1, algorithm="tree")),
        ("mpi4py Bcast", lambda: comm.Bcast(a, root=0)),
        ("bml Bcast tree", lambda: ctx.Bcast(a, root=0, algorithm="tree")),
    ]
    for name, call in cases:
        timed(comm, name, call)
    ctx.Free()


if __name__ == "__main__":
    main()
