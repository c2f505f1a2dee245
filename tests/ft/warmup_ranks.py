"""Rank program: the fault-tolerant communicator compiles its kernels before its first step.

Launched by ``tests/test_ft_launch.py`` under ``bmlmpi-run --ft``. Each rank records, in
order, the kernel warm-ups bmlmpi asks for and the schedule runs it starts, runs one
allreduce per algorithm given on the command line, and prints ``WARMUP-JSON`` with the events
and whether the result was exact. A first kernel compilation inside a step would land inside
that step's deadline (seconds on a loaded node), so every run must come after a warm-up of
its dtype and op.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import execute, ft, kernels

events: list[list] = []
real_warmup = kernels.warmup
real_run_init = execute.Run.__init__


def warmup(dtypes=None, ops=None, **kwargs) -> None:
    events.append(["warmup", sorted(np.dtype(d).str for d in dtypes or ()), sorted(ops or ())])
    real_warmup(dtypes, ops, **kwargs)


def run_init(self, plan, buf, op, *args, **kwargs) -> None:
    events.append(["run", buf.dtype.str, op])
    real_run_init(self, plan, buf, op, *args, **kwargs)


def main() -> int:
    ft.install_exit_handlers()
    kernels.warmup = warmup
    execute.Run.__init__ = run_init
    comm = bmlmpi.Communicator(MPI.COMM_WORLD, fault_tolerant=True, timeout=60)
    exact = True
    for algorithm in sys.argv[1:]:
        comm.algorithm = algorithm
        x = np.arange(1000, dtype=np.float64) + 1000 * comm.rank
        out = np.empty_like(x)
        comm.Allreduce(x, out)
        expect = sum(np.arange(1000, dtype=np.float64) + 1000 * r for r in range(comm.size))
        exact = exact and bool(np.array_equal(out, expect))
    print("WARMUP-JSON " + json.dumps({"rank": comm.rank, "events": events, "exact": exact}),
          flush=True)
    ft.finish(0)


if __name__ == "__main__":
    sys.exit(main())
