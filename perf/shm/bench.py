"""``shm`` against mpi4py's own blocking call, interleaved, for the allreduce and the rest of
the family, as perf/shm/README.md.

    mpiexec -n 2 python perf/shm/bench.py                     # the allreduce, every size
    mpiexec -n 2 python perf/shm/bench.py --collectives all --sizes 65536,1048576,4194304,67108864

Sizes are the bytes of the work buffer (float32 reductions; for a reduce-scatter the whole
input, for an allgather the whole output, a broadcast's buffer). Each row: ``BLOCKS`` rounds,
each a block of ``max(5, min(200, 256 MiB / size))`` back-to-back calls of bmlmpi's ``shm``
and then of mpi4py's call (after one untimed call and a barrier each), the median of the
block means on rank 0 (roots are rank 0), with the 1-minute load average at the row's end.
An allreduce row also gives the memory floor of that size measured right after it, in the
same run (``perf/baseline/memfloor.py``: every rank reads its peers' slices and copies the
reduced ones, all ranks at once), and ``shm`` ÷ floor.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import bmlmpi

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from perf.baseline.memfloor import measure as memory_floor  # noqa: E402

SIZES = [64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20]
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "reduce", "bcast")
BLOCKS = 5


def calls_for(collective: str, nbytes: int, comm: MPI.Comm, ctx: bmlmpi.Communicator
              ) -> dict[str, Callable[[], None]]:
    """The two calls compared for one collective and size, on the same buffers."""
    n, size = nbytes // 4, comm.size
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    if collective == "allreduce":
        return {"shm": lambda: ctx.Allreduce(a, b), "mpi4py": lambda: comm.Allreduce(a, b)}
    if collective == "reduce_scatter":
        a = np.ones(n // size * size, np.float32)
        block = np.empty(n // size, np.float32)
        return {"shm": lambda: ctx.Reduce_scatter_block(a, block),
                "mpi4py": lambda: comm.Reduce_scatter_block(a, block)}
    if collective == "allgather":
        mine = np.ones(n // size, np.float32)
        whole = np.empty(n // size * size, np.float32)
        return {"shm": lambda: ctx.Allgather(mine, whole),
                "mpi4py": lambda: comm.Allgather(mine, whole)}
    if collective == "reduce":
        return {"shm": lambda: ctx.Reduce(a, b, MPI.SUM, 0),
                "mpi4py": lambda: comm.Reduce(a, b, MPI.SUM, 0)}
    return {"shm": lambda: ctx.Bcast(a, 0), "mpi4py": lambda: comm.Bcast(a, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", default="allreduce",
                        help="comma-separated, or 'all'")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    args = parser.parse_args()
    which = COLLECTIVES if args.collectives == "all" else tuple(args.collectives.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    comm = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    for collective in which:
        for nbytes in sizes:
            rows = calls_for(collective, nbytes, comm, ctx)
            calls = max(5, min(200, (256 << 20) // nbytes))
            times: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(BLOCKS):
                for name, call in rows.items():
                    call()
                    comm.Barrier()
                    start = time.perf_counter()
                    for _ in range(calls):
                        call()
                    times[name].append((time.perf_counter() - start) / calls)
                    comm.Barrier()
            floor = ""
            if collective == "allreduce":
                us = memory_floor(comm, nbytes, 5)["floor_us"]
                floor = f" floor {us:9.1f} us shm/floor {np.median(times['shm']) * 1e6 / us:5.2f}"
            if comm.rank == 0:
                s, m = np.median(times["shm"]), np.median(times["mpi4py"])
                print(f"N={comm.size} {collective:<14} {nbytes:>9} shm {s * 1e6:9.1f} us "
                      f"mpi4py {m * 1e6:9.1f} us mpi4py/shm {m / s:5.2f}{floor} "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
    ctx.Free()


if __name__ == "__main__":
    main()
