"""Two costs behind GradientBuckets' design, measured side by side on the same ranks.

1. Fusion: one bucket (plan ``single``) of the training job's 22 gradient arrays (373,002
   float64) reduced with copies into a flat buffer and back (``fusion="copy"``) against in
   place on one flat arena (:func:`bmlmpi.training.flat_arena`), interleaved, median of reps.
2. The thread level: mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE``; run this once with
   ``--thread-level single`` and once without to compare the native 8-byte allreduce latency
   (``MPI.Query_thread`` is printed).

    bmlmpi-run -n 4 python perf/buckets/overheads.py --out perf/buckets/overheads-multiple.json
    bmlmpi-run -n 4 python perf/buckets/overheads.py --thread-level single --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import mpi4py

SHAPES = [(64, 512), (512,), (512, 96), (96,), (96, 384), (384,), (384, 32), (32,),
          (32, 256), (256,), (256, 448), (448,), (448, 64), (64,), (64, 320), (320,),
          (320, 128), (128,), (128, 192), (192,), (192, 10), (10,)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--thread-level", default="multiple", choices=["single", "multiple"])
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    mpi4py.rc.thread_level = args.thread_level
    import numpy as np
    from mpi4py import MPI

    import bmlmpi
    from bmlmpi.training import flat_arena

    comm = MPI.COMM_WORLD
    granted = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
               MPI.THREAD_SERIALIZED: "serialized",
               MPI.THREAD_MULTIPLE: "multiple"}[MPI.Query_thread()]
    # native latency, 8 bytes
    x, y = np.ones(1), np.empty(1)
    for _ in range(50):
        comm.Allreduce(x, y)
    lat = []
    for _ in range(400):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y)
        lat.append(time.perf_counter() - t)
    result = {"ranks": comm.size, "thread_level_asked": args.thread_level,
              "thread_level_granted": granted, "native_8B_allreduce_median_us":
              float(np.median(lat) * 1e6), "host": platform.node(),
              "load_average": os.getloadavg(),
              "mpi": MPI.Get_library_version().replace("\0", "").splitlines()[0]}
    if granted == "multiple":
        c = bmlmpi.Communicator(comm)
        copies = [np.zeros(s) for s in SHAPES]
        _, arena = flat_arena(SHAPES)
        timings: dict[str, list[float]] = {"copy": [], "arena": []}
        bs = {"copy": bmlmpi.GradientBuckets(copies, comm=c, plan="single", fusion="copy"),
              "arena": bmlmpi.GradientBuckets(arena, comm=c, plan="single")}
        assert all(g.in_place for b in bs["arena"]._buckets for g in b.groups)
        for rep in range(args.reps + 3):
            for name in ("copy", "arena"):     # interleaved: both see the same load
                b = bs[name]
                grads = copies if name == "copy" else arena
                comm.Barrier()
                t = time.perf_counter()
                for i in reversed(range(len(grads))):
                    b.mark_ready(i)
                b.wait()
                if rep >= 3:
                    timings[name].append(time.perf_counter() - t)
        for b in bs.values():
            b.close()
        result["fusion_single_bucket_median_ms"] = {k: float(np.median(v) * 1e3)
                                                    for k, v in timings.items()}
    if comm.rank == 0:
        print(json.dumps(result, indent=1), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
