"""``shm`` against mpi4py's blocking ``comm.Allreduce``, interleaved, as perf/shm/README.md.

    mpiexec -n 2 python perf/shm/bench.py        # or bmlmpi-run -n 2 python perf/shm/bench.py
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

SIZES = [64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20]
BLOCKS = 5


def main() -> None:
    comm = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(comm, algorithm="shm")
    for nbytes in SIZES:
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        calls = max(5, min(200, (256 << 20) // nbytes))
        rows = {"shm": lambda a=a, b=b: ctx.Allreduce(a, b),
                "mpi4py": lambda a=a, b=b: comm.Allreduce(a, b)}
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
        if comm.rank == 0:
            s, m = np.median(times["shm"]), np.median(times["mpi4py"])
            print(f"N={comm.size} {nbytes:>9} shm {s * 1e6:9.1f} us mpi4py {m * 1e6:9.1f} us "
                  f"mpi4py/shm {m / s:.2f} load {os.getloadavg()[0]:.2f}", flush=True)
    ctx.Free()


if __name__ == "__main__":
    main()
