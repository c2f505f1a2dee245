"""What the flight recorder costs a call (a benchmark, not a test).

    python perf/trace/recorder_cost.py --micro                    # one process
    bmlmpi-run -n 2 python perf/trace/recorder_cost.py --write perf/trace

``--micro``: the recorder's own work in isolation (and the drop-in on ``COMM_SELF``,
below), the begin and done the blocking fast path inlines (``bmlmpi/api.py``: four stores and
a clock read at the start, one store and a clock read at the end, and the test of whether a
timeline is on) against the same function without them, and the methods ``begin``/``done``
the checked path calls; ``timeit``, the three interleaved in 7 rounds, the best round of
each.

One rank (in both modes): the drop-in's own Python work with no partner to wait for, 8 B on
``MPI.COMM_SELF``: mpi4py's call against the native ``Communicator`` with the recorder on and
off, interleaved.

Under MPI (two ranks): the blocking drop-in end to end at 8 B, interleaved in blocks: mpi4py's
``comm.Allreduce``, ``bmlmpi.Communicator(comm, "native")`` with the recorder on (the default,
256 calls) and off (``BMLMPI_TRACE_CALLS=0``), and a scheduled signature (``ring``) on and
off. Each block runs every row's ``--iterations`` calls back to back after a barrier, rows in
turn; a row's number is the median over blocks of the block's mean per call (rank 0's clock).
The load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import timeit
from pathlib import Path

import numpy as np

from bmlmpi.recorder import FlightRecorder, Signature
from bmlmpi.recorder import now as _now


def micro() -> dict[str, float]:
    rec = FlightRecorder(256, 0, 2)
    sig = Signature("allreduce", 2, "float32", "sum", None, "auto", "native")

    class Entry:
        __slots__ = ("sig",)

    entry = Entry()
    entry.sig = sig

    def without() -> None:
        r = None
        if r is not None:
            pass
        if r is not None:
            pass

    def inline() -> None:   # the fast path's code (bmlmpi/fast_path.py, FastPath.allreduce)
        r = rec
        if r is not None:
            n = r.next
            r.next = n + 1
            s = r.slots[n % r.capacity]
            s.seq = n
            s.sig = entry.sig
            s.t1 = 0.0
            s.t0 = _now()
        if r is not None:
            s.t1 = _now()
            if r.timeline is not None:
                r.timeline.call(r, s)

    def methods() -> None:  # the checked path's
        rec.done(rec.begin(sig))

    # interleaved: each of the 7 rounds times every function in turn, so that a change in the
    # machine's load hits all three alike; the best round of each
    number = 200_000
    fns = {"without": without, "inline": inline, "methods": methods}
    best = {name: float("inf") for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number))
    out = {name: t / number * 1e6 for name, t in best.items()}
    out["inline_cost"] = out["inline"] - out["without"]
    out["methods_cost"] = out["methods"] - out["without"]
    return out


def one_rank() -> dict[str, float]:
    """The drop-in's own Python work, with no partner to wait for: 8 B allreduces on
    ``MPI.COMM_SELF`` (MPI's call a local copy), mpi4py's ``comm.Allreduce`` against
    ``Communicator(COMM_SELF, "native")`` with the recorder on and off; ``timeit``, the three
    interleaved in 9 rounds, the best round of each (µs a call)."""
    from mpi4py import MPI

    import bmlmpi

    comm = MPI.COMM_SELF
    before = os.environ.get("BMLMPI_TRACE_CALLS")
    ctxs = {}
    for name, calls in (("recorder on", "256"), ("recorder off", "0")):
        os.environ["BMLMPI_TRACE_CALLS"] = calls
        ctxs[name] = bmlmpi.Communicator(comm, algorithm="native")
    if before is None:
        os.environ.pop("BMLMPI_TRACE_CALLS")
    else:
        os.environ["BMLMPI_TRACE_CALLS"] = before
    send = np.full(2, 1.0, dtype=np.float32)
    recv = np.empty_like(send)
    fns = {"mpi4py": lambda: comm.Allreduce(send, recv)}
    fns.update({name: (lambda c=c: c.Allreduce(send, recv)) for name, c in ctxs.items()})
    for fn in fns.values():
        for _ in range(1000):
            fn()
    number = 50_000
    best = {name: float("inf") for name in fns}
    for _ in range(9):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number))
    for c in ctxs.values():
        c.Free()
    out = {name: t / number * 1e6 for name, t in best.items()}
    out["on - off"] = out["recorder on"] - out["recorder off"]
    out["on - mpi4py"] = out["recorder on"] - out["mpi4py"]
    return out


def end_to_end(iterations: int, blocks: int) -> dict:
    from mpi4py import MPI

    import bmlmpi

    comm = MPI.COMM_WORLD
    ctxs = {}
    for name, alg, calls in (("native, recorder on", "native", "256"),
                             ("native, recorder off", "native", "0"),
                             ("ring, recorder on", "ring", "256"),
                             ("ring, recorder off", "ring", "0")):
        os.environ["BMLMPI_TRACE_CALLS"] = calls
        ctxs[name] = bmlmpi.Communicator(comm, algorithm=alg)
        assert (ctxs[name].recorder is None) == (calls == "0")
    os.environ.pop("BMLMPI_TRACE_CALLS")
    send = np.full(2, comm.rank + 1, dtype=np.float32)   # 8 B
    recv = np.empty_like(send)
    calls = {"mpi4py": lambda: comm.Allreduce(send, recv, MPI.SUM)}
    calls.update({name: (lambda c=c: c.Allreduce(send, recv)) for name, c in ctxs.items()})
    for fn in calls.values():
        for _ in range(100):
            fn()
        assert recv[0] == comm.size * (comm.size + 1) / 2
    per_block: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, fn in calls.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iterations):
                fn()
            per_block[name].append((time.perf_counter() - t0) / iterations * 1e6)
    med = {name: float(np.median(v)) for name, v in per_block.items()}
    return {"median_us": med, "blocks_us": per_block, "ranks": comm.size,
            "iterations": iterations, "blocks": blocks,
            "mpi": MPI.Get_library_version().splitlines()[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    if args.micro:
        res = {"micro_us": micro(), "one_rank_us": one_rank()}
        rank = 0
    else:
        res = end_to_end(args.iterations, args.blocks)
        res["micro_us"] = micro()
        res["one_rank_us"] = one_rank()
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.rank
    res["loadavg_before"] = load_before
    res["loadavg_after"] = os.getloadavg()
    # whether the machine was shared is for the person running it to say (the load is here)
    res["machine"] = {"host": platform.node(), "python": platform.python_version(),
                      "cpus": os.cpu_count()}
    if rank != 0:
        return 0
    print(json.dumps(res, indent=1))
    if args.write is not None:
        args.write.mkdir(parents=True, exist_ok=True)
        (args.write / "recorder_cost.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
