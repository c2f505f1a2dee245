"""What one small GPU operation costs when several MPI ranks share one GPU.

    bmlmpi-run -n 1 python perf/gpu/sharing_probe.py
    bmlmpi-run -n 4 python perf/gpu/sharing_probe.py

Every rank times, on its own cupy stream's device, each operation followed by a stream
synchronisation (the mean of 300, after a barrier): a device-to-host copy into pinned memory,
a host-to-device copy from it, and a tiny kernel (``fill``). Rank 0 prints microseconds per
operation. Run with 1 rank and with several to see what sharing the device costs; the result
measured on an H100 is in perf/README.md.
"""

from __future__ import annotations

import time

import cupy
import cupyx
import numpy as np
from mpi4py import MPI


def per_call_us(fn, comm: MPI.Comm, n: int = 300) -> float:
    fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    comm = MPI.COMM_WORLD
    stream = cupy.cuda.get_current_stream()
    for nbytes in (4, 16384, 32768, 1 << 20):
        n = max(1, nbytes // 4)
        dev = cupy.ones(n, cupy.float32)
        host = cupyx.empty_pinned(n, np.float32)
        ops = {
            "d2h": lambda d=dev, h=host: (d.get(out=h, stream=stream), stream.synchronize()),
            "h2d": lambda d=dev, h=host: (d.set(h, stream=stream), stream.synchronize()),
            "kernel": lambda d=dev: (d.fill(1), stream.synchronize()),
        }
        res = {k: round(per_call_us(f, comm), 1) for k, f in ops.items()}
        if comm.rank == 0:
            print(f"ranks={comm.size} bytes={nbytes} us per op: {res}", flush=True)


if __name__ == "__main__":
    main()
