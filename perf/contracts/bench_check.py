"""The cost of the argument checks (docs/contracts.md), blocking native Allreduce, N ranks.

Rows, interleaved block by block in one run so that load drifts hit them alike:
  mpi4py        comm.Allreduce on the user's communicator (the baseline)
  watchdog      bmlmpi, check="first-call", BMLMPI_BLOCKING=watchdog: MPI_Allreduce itself
  polled        bmlmpi, check="first-call", polled: MPI_Iallreduce into a private buffer
  every-call    bmlmpi, check="every-call": one agreement Iallreduce, then as polled
The polled rows are built with BMLMPI_BLOCKING=polled set before their Communicator.

    bmlmpi-run -n 2 python perf/contracts/bench_check.py [blocks] [iterations]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

comm = MPI.COMM_WORLD
blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 5
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 400


def make(mode: str):
    if mode == "mpi4py":
        return lambda a, b: comm.Allreduce(a, b, MPI.SUM)
    os.environ["BMLMPI_BLOCKING"] = "watchdog" if mode == "watchdog" else "polled"
    check = "every-call" if mode == "every-call" else "first-call"
    ctx = bmlmpi.Communicator(comm, algorithm="native", check=check)
    return lambda a, b: ctx.Allreduce(a, b, MPI.SUM)


modes = ["mpi4py", "watchdog", "polled", "every-call"]
calls = {m: make(m) for m in modes}
load = os.getloadavg()
for nbytes in (8, 1 << 20):
    n = nbytes // 8
    a, b = np.ones(n), np.empty(n)
    times = {m: [] for m in modes}
    for m in modes:  # first call of the signature (checked) and warm-up, outside the timing
        for _ in range(10):
            calls[m](a, b)
    for _ in range(blocks):
        for m in modes:
            fn = calls[m]
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(iters):
                fn(a, b)
            times[m].append((time.perf_counter() - t) / iters * 1e6)
    if comm.rank == 0:
        base = np.median(times["mpi4py"])
        for m in modes:
            med = np.median(times[m])
            print(f"{nbytes:>8} B  {m:<11} median {med:9.2f} us  (x{med / base:5.2f} of mpi4py)"
                  f"  blocks: {' '.join(f'{t:.1f}' for t in times[m])}", flush=True)
if comm.rank == 0:
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; N = {comm.size}; machine shared")
