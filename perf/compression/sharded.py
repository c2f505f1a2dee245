"""The pull side: ShardedStep (reduce-scatter, owner update, P-SMP-filtered allgather) against a
plain allreduce followed by the update on every rank; time and parameters published per step.

    python -m bmlmpi.cli.launch -n 4 python perf/compression/sharded.py --out sharded.json

Workload: a float32 model of ``count`` parameters, SGD with a learning rate that decays like a
training run's (so relative changes shrink and P-SMP publishes less over time); gradients
differ per rank and step. P-SMP thresholds φ' as given, d' = 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi.compression import ShardedStep


def grad(n: int, rank: int, it: int) -> np.ndarray:
    return np.random.default_rng([rank, it, 7]).standard_normal(n).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1 << 19)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    c = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm="bml")
    init = np.random.default_rng(5).standard_normal(args.count).astype(np.float32)
    rows = []
    for label, psmp in [("allreduce+update", "plain"), ("sharded", None),
                        ("sharded P-SMP 1e-3", (1e-3, 0.5)), ("sharded P-SMP 1e-2", (1e-2, 0.5))]:
        params = init.copy()
        total = np.empty_like(params)
        times, pub = [], []
        runner = None if psmp == "plain" else ShardedStep(c, params, lambda g, p: None,
                                                         psmp=psmp, op=bmlmpi.AVG)
        for it in range(args.steps):
            lr = np.float32(1e-2 / (1 + it))

            def sgd(g, p, lr=lr):
                p -= lr * g

            g = grad(args.count, c.rank, it)
            c.comm.Barrier()
            t0 = time.perf_counter()
            if runner is None:
                c.Allreduce(g, total, bmlmpi.AVG)
                sgd(total, params)
            else:
                runner.update = sgd
                runner.step(g)
            times.append(c.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            if runner is not None:
                pub.append(runner.published[-1][0] / args.count)
        rows.append({"variant": label, "median_s": float(np.median(times[2:])),
                     "published_fraction": pub})
        if c.rank == 0:
            print(f"{label:20s} median {np.median(times[2:]) * 1e3:8.2f} ms  published "
                  f"{[round(p, 2) for p in pub] if pub else 'all'}", flush=True)
    if c.rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"ranks": c.size, "count": args.count,
                                              "rows": rows, "load_average": os.getloadavg()},
                                             indent=1))


if __name__ == "__main__":
    main()
