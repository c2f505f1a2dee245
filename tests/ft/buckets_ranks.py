"""Rank-side program of the GradientBuckets failure test: a rank dies mid-iteration.

Started by ``tests/test_buckets_ft.py`` as ``bmlmpi-run --ft -n 4 python
tests/ft/buckets_ranks.py PLAN`` (needs ULFM; never collected by pytest). Every rank registers
the same gradient arrays on a fault-tolerant communicator (op SUM) and runs three iterations.
In iteration 1 every rank marks the back half of the arrays ready and waits until their buckets
are reduced (those results hold every rank's input), then the victim (the last rank) dies
(SIGKILL).
The survivors mark everything, ``wait()``, and must hold the exact sum over the survivors'
inputs of that iteration in every array; iteration 2 runs on the survivors alone.

``... PLAN lag``: the victim dies in iteration 1 right after marking the back half ready,
its buckets in flight (started, not waited on), and rank 0 marks its front half 0.3 s late,
so the survivors have started different numbers of buckets when the failure is noticed.

Output, one JSON line per survivor, prefixed ``BUCKETS-FT``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi import ft

SHAPES = [(40,), (3, 7), (1,), (300,), (0,), (17,), (64,), (5, 5)]


def inputs(rank: int, it: int) -> list[np.ndarray]:
    return [((np.arange(int(np.prod(s))) * 7 + rank * 1000 + it * 100_000 + j) % 99_991
             ).astype(np.float64).reshape(s) for j, s in enumerate(SHAPES)]


def main() -> int:
    ft.install_exit_handlers()
    plan = sys.argv[1]
    lag = sys.argv[2:] == ["lag"]
    world = MPI.COMM_WORLD
    comm = bmlmpi.Communicator(world, algorithm="bml", fault_tolerant=True, timeout=60,
                               hang_timeout=20)
    me, size = comm.original_rank, comm.original_size
    victim = size - 1
    grads = [np.zeros(s) for s in SHAPES]
    buckets = bmlmpi.GradientBuckets(grads, comm=comm, op=MPI.SUM, plan=plan,
                                     fusion_bytes=512)
    report: dict = {"rank": me, "plan": plan, "buckets": buckets.buckets, "iterations": []}
    try:
        for it in range(3):
            alive = [r for r in range(size) if not (it >= 1 and r == victim)]
            mine = inputs(me, it)
            for i in reversed(range(len(grads))):
                np.copyto(grads[i], mine[i])
                buckets.mark_ready(i)
                if it == 1 and i == len(grads) // 2 and lag:
                    if me == victim:
                        print(f"buckets_ranks: rank {me} dies with buckets in flight",
                              file=sys.stderr, flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)
                    if me == 0:
                        time.sleep(0.3)
                elif it == 1 and i == len(grads) // 2:
                    # every rank takes the back half's results (they include the victim's
                    # input); the victim then dies
                    for j in range(i, len(grads)):
                        buckets.wait(j)
                    if me != victim:
                        continue
                    print(f"buckets_ranks: rank {me} dies mid-iteration", file=sys.stderr,
                          flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            buckets.wait()
            want = [sum(inputs(r, it)[j] for r in alive) for j in range(len(grads))]
            exact = [bool(np.array_equal(g, w)) for g, w in zip(grads, want, strict=True)]
            report["iterations"].append({"it": it, "exact": exact, "size": comm.size,
                                         "failed": list(buckets.failed),
                                         "revised": sorted(buckets.revised)})
        buckets.close()
    except Exception as exc:   # reported, then this survivor leaves cleanly
        report["error"] = f"{type(exc).__name__}: {exc}"
    print("BUCKETS-FT " + json.dumps(report), flush=True)
    ft.finish(0, timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
