"""Rank program of tests/test_large_count.py: an allreduce of 2**31 + 7 int8 (a count past
MPI's int) with each algorithm named on the command line, in place (the input is the result
buffer: one caller's buffer of 2 GiB a rank, plus the private one native gives MPI). Either
every element is exact (the closed form: element i of rank r is ``(i % 7) + r``), or the
call raises ValueError naming the count on every rank. Prints one ``LARGE {json}`` line per
rank and algorithm."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import bmlmpi

N = 2**31 + 7
CHUNK = 7 * 2**23   # a multiple of the pattern's period: every chunk starts at phase 0



def periodic(period: np.ndarray, n: int) -> np.ndarray:
    """``period`` repeated to ``n`` elements, by doubling copies (no temporaries)."""
    out = np.empty(n, period.dtype)
    out[:period.size] = period
    have = period.size
    while have < n:
        take = min(have, n - have)
        out[have:have + take] = out[:take]
        have += take
    return out


world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pattern = np.arange(7, dtype=np.int8)
for algorithm in sys.argv[1:]:
    buf = periodic(pattern + np.int8(rank), N)
    report: dict = {"rank": rank, "algorithm": algorithm}
    try:
        bmlmpi.Communicator(world, algorithm=algorithm).Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
    except ValueError as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    else:
        want = periodic(pattern * np.int8(size) + np.int8(sum(range(size))), CHUNK)
        report["exact"] = all(np.array_equal(buf[at:at + CHUNK], want[:min(CHUNK, N - at)])
                              for at in range(0, N, CHUNK))
    del buf
    print("LARGE " + json.dumps(report), flush=True)
