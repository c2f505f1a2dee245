"""A hang made on purpose, for the flight recorder's two readers
(``tests/test_fr_trace_launch.py``). Every rank first makes one allreduce on a plain
``bmlmpi.Communicator`` of ``MPI.COMM_WORLD`` (recorded as process group ``c0``), then calls
``all_reduce`` on backend ``bmlmpi`` ``CALLS`` times (group ``0``, ``default_pg``); rank
``SKIPPER`` skips the last one and ends, and the others wait in it until their deadline
(``BMLMPI_TIMEOUT``) and raise. Every completed call's result is checked (rank- and
position-dependent data).

Output: ``FR-SKIP rank R calls K`` (the torch calls it completed), ``FR-SKIP rank R raised
NAME: ...`` or ``FR-SKIP rank R ... WRONG``; a rank that raised or saw a wrong value exits 1.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import bmlmpi
import bmlmpi.torch

CALLS = 3
SKIPPER = 1


def main() -> int:
    world = MPI.COMM_WORLD
    rank, n = world.rank, world.size
    plain = bmlmpi.Communicator(world)
    a = np.arange(100, dtype=np.int64) * (rank + 1)
    b = np.empty_like(a)
    plain.Allreduce(a, b)
    if not np.array_equal(b, np.arange(100, dtype=np.int64) * (n * (n + 1) // 2)):
        print(f"FR-SKIP rank {rank} plain allreduce WRONG", flush=True)
        return 1
    bmlmpi.torch.init_process_group()
    done = 0
    try:
        for i in range(CALLS):
            if rank == SKIPPER and i == CALLS - 1:
                continue
            t = torch.arange(1000, dtype=torch.float32) * (i + 1) + rank
            dist.all_reduce(t)
            want = torch.arange(1000, dtype=torch.float32) * (i + 1) * n + n * (n - 1) // 2
            if not torch.equal(t, want):
                print(f"FR-SKIP rank {rank} call {i + 1} WRONG", flush=True)
                return 1
            done += 1
    except Exception as exc:  # noqa: BLE001 - the test reads what was raised
        print(f"FR-SKIP rank {rank} raised {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        return 1
    print(f"FR-SKIP rank {rank} calls {done}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
