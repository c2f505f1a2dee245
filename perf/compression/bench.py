"""Bytes on the wire and time per allreduce, per compressor, against the uncompressed call; and
the measured sparse/dense crossover (the cost model's choice checked against both paths).

Run inside the ranks (N = 4 on shared memory here):

    python -m bmlmpi.cli.launch -n 4 python perf/compression/bench.py --count 524288 --iters 8 \
        --out perf/compression/bench.json

Input: a gradient-like float32 array (normal values whose scale varies over blocks, like the
layers of a model), different on every rank and at every iteration; every compressor keeps its
error-feedback memory across the iterations. Bytes: what this rank sent (rank 0; the
schedules are symmetric), from the compressor's own count; the plain call's bytes are its
schedule's. Times: the median over the timed iterations of the slowest rank. The crossover
uses one input whose largest ``density`` fraction passes G-SMP, on the sparse and the dense
path and the one ``auto`` picks (pricing the links it measured on its first call, a fixed
algorithm having no calibration; recorded as ``links_alpha_beta``), and the sparse path with
the same kept elements sent as fp16 codes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi
from bmlmpi.compression import Compressor, bf16, fp16, tdf, threshold, topk
from bmlmpi.compression import random as grp
from bmlmpi.compression.network_price import known

PHI = 2.0  # G-SMP's initial threshold, in units of the array's typical |g| (see gradient())


def gradient(n: int, rank: int, it: int) -> np.ndarray:
    rng = np.random.default_rng([rank, it])
    blocks = np.repeat(10.0 ** rng.uniform(-2, 0, size=n // 1000 + 1), 1000)[:n]
    return (rng.standard_normal(n) * blocks).astype(np.float32)


def compressors() -> dict[str, Compressor | None]:
    return {"none": None, "fp16": fp16(), "bf16": bf16(),
            f"threshold({PHI * 0.05:g},0.5)": threshold(PHI * 0.05, 0.5),
            "random(0.9)": grp(0.9, 1),
            f"tdf({PHI * 0.05:g},0.5,0.9,fp16)": tdf(PHI * 0.05, 0.5, 0.9, "fp16"),
            f"tdf({PHI * 0.05:g},0.5,0.9,none)": tdf(PHI * 0.05, 0.5, 0.9, None),
            "topk(0.01)": topk(ratio=0.01), "topk(0.01,fp16)": topk(ratio=0.01, wire="fp16")}


def timed(comm, c, x, out, comp) -> float:
    comm.comm.Barrier()
    t0 = time.perf_counter()
    c.Allreduce(x, out, MPI.SUM, compression=comp)
    t = time.perf_counter() - t0
    return comm.comm.allreduce(t, op=MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1 << 20)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--algorithm", default="bml")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    c = bmlmpi.Communicator(world, algorithm=args.algorithm)
    rows = []
    out = np.empty(args.count, np.float32)
    for name, comp in compressors().items():
        times = []
        for it in range(args.iters + 2):
            x = gradient(args.count, c.rank, it)
            t = timed(c, c, x, out, comp)
            if it >= 2:
                times.append(t)
        if comp is None:
            sched = c.schedule(args.algorithm, args.count, 4)
            nbytes = sched.sent_elements() * 4
            paths = {"plain": args.iters + 2}
        else:
            nbytes = sum(comp.bytes_sent.values()) / sum(comp.calls.values())
            paths = dict(comp.calls)
        rows.append({"compressor": name, "bytes_per_call": nbytes, "paths": paths,
                     "median_s": float(np.median(times)), "min_s": float(np.min(times))})
        if c.rank == 0:
            print(f"{name:28s} {nbytes / 1e6:8.3f} MB  median {np.median(times) * 1e3:8.2f} ms"
                  f"  {paths}", flush=True)
    # the crossover: one threshold at several densities, forced sparse and forced dense
    cross = []
    x0 = gradient(args.count, c.rank, 99)
    for density in (0.001, 0.01, 0.03, 0.1, 0.3):
        phi = float(np.quantile(np.abs(x0), 1 - density))
        res = {"density": density}
        for path in ("sparse", "dense", "auto", "sparse_fp16"):
            ts, chose = [], set()
            for it in range(args.iters // 2 + 1):
                # a fresh compressor each call: no residual, so the density stays the nominal
                # (sparse_fp16: the same kept elements, sent as 16-bit codes)
                comp = threshold(phi) if path != "sparse_fp16" else tdf(phi, 0.0, 1.0, "fp16")
                comp.path = path.removesuffix("_fp16")
                t = timed(c, c, x0, out, comp)
                chose |= set(comp.calls)
                if it:
                    ts.append(t)
            res[path + "_s"] = float(np.median(ts))
            if path == "auto":
                res["auto_chose"] = sorted(chose)
        cross.append(res)
        if c.rank == 0:
            print(f"density {density:6.3f}: sparse {res['sparse_s'] * 1e3:8.2f} ms (fp16 pairs "
                  f"{res['sparse_fp16_s'] * 1e3:8.2f} ms), dense {res['dense_s'] * 1e3:8.2f} ms, "
                  f"auto chose {res['auto_chose']}", flush=True)
    if c.rank == 0 and args.out:
        meta = {"ranks": c.size, "count": args.count, "dtype": "float32",
                "algorithm": args.algorithm, "iters": args.iters,
                # what auto priced the links with (measured on its first call: no calibration)
                "links_alpha_beta": known(c.compression),
                "load_average": os.getloadavg(), "host": platform.node(),
                "cpus": os.cpu_count(), "mpi": MPI.Get_library_version().splitlines()[0]}
        Path(args.out).write_text(json.dumps({**meta, "rows": rows, "crossover": cross},
                                             indent=1))


if __name__ == "__main__":
    main()
