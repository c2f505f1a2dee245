"""Where one bmlmpi allreduce spends its time: the drop-in's call path and the executor's steps.

    bmlmpi-run -n 2 python perf/profile/call_path.py --write perf/profile

Only public calls are timed (``bmlmpi.Allreduce``, ``Communicator.Allreduce``, mpi4py's
``comm.Allreduce``); nothing inside bmlmpi is patched. Three measurements, all on every rank
at once, rank 0 reporting:

1. **Wall time per call** (``time.perf_counter``, no profiler): the median over blocks of
   calls of mpi4py's ``comm.Allreduce``, ``bmlmpi.Allreduce(algorithm=...)`` and
   ``Communicator.Allreduce`` at 8 B, and of each schedule at 64 KiB, 1 MiB and 4 MiB.
2. **cProfile of the same calls**, each function's own CPU time (``tottime`` with
   ``time.process_time`` as the profiler's clock, so that time slices lost to other processes
   on a loaded machine are not charged to the function running when they came) per call, grouped
   into the phases of a call: entry, buffer resolution, signature check, plan lookup
   (auto's choice, the plan cache), post (MPI's I-calls, the Run's set-up), wait/progress
   (Test/Testall, the poll loop, yields), reduction (the kernels), finish, the copy of
   sendbuf into recvbuf, and everything else ("Python between"). cProfile adds ~0.5–1 µs
   per Python function call, so its totals exceed the wall time; the ranking is what it is
   for.
3. **Step timeline** (64 KiB, 1 MiB, 4 MiB; bml and ring): ``Request.Test()`` polled in a
   loop, stamping the moment the request first reports done; with the number of polls that
   took, and the same for one mpi4py ``Iallreduce``.

``--write DIR`` saves ``call_path.json`` and ``call_path.md`` there.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import bmlmpi

PHASES = ("entry", "buffer resolution", "signature check", "plan lookup", "post",
          "wait/progress", "reduction", "finish", "copy in", "Python between")
_BY_NAME = {
    "Allreduce": "entry", "_start": "entry", "communicator_for": "entry",
    "check_algorithm": "entry", "Iallreduce": "entry",
    "prepare_allreduce": "buffer resolution", "resolve": "buffer resolution",
    "is_device_array": "buffer resolution", "_as_ndarray": "buffer resolution",
    "op_name": "buffer resolution", "check_dtype_op": "buffer resolution",
    "validate": "signature check", "signature_hash": "signature check",
    "auto": "plan lookup", "auto_for": "plan lookup", "plan": "plan lookup",
    "choose": "plan lookup",
    "launch": "post", "start_native": "post", "_register": "post", "_post": "post",
    "mpi_op": "post", "kernel_op": "post",
    "Wait": "wait/progress", "Test": "wait/progress", "progress": "wait/progress",
    "_poll": "wait/progress", "test": "wait/progress", "wait_for": "wait/progress",
    "progress_mark": "wait/progress", "spin_seconds": "wait/progress",
    "finish": "finish", "_finalise": "finish", "scale_avg": "finish",
    "give_scratch": "finish", "take_scratch": "post",
    "reduce_into": "reduction", "reduce_many_into": "reduction",
    "_complete_step": "reduction",
}
_BUILTIN = {  # substrings of cProfile's names for C functions
    "'Iallreduce'": "post", "'Isend'": "post", "'Irecv'": "post",
    "'Test'": "wait/progress", "'Testall'": "wait/progress", "sched_yield": "wait/progress",
    "sleep": "wait/progress", "monotonic": "wait/progress", "'Wait'": "wait/progress",
    "copyto": "copy in", "may_share_memory": "buffer resolution",
}


def phase_of(key: tuple[str, int, str]) -> str:
    path, _, name = key
    if path == "~":
        for needle, phase in _BUILTIN.items():
            if needle in name:
                return phase
        return "Python between"
    if "/kernels/" in path or "numba" in path:
        return "reduction"
    if "bmlmpi" in path and name in _BY_NAME:
        if name == "__init__":
            return "post"
        return _BY_NAME[name]
    if "bmlmpi" in path and name == "__init__":
        return "post"  # Run / Request / _NativeRun set-up
    if "bmlmpi" in path and name == "<lambda>":
        return "wait/progress" if "api.py" in path else "Python between"
    return "Python between"


def blocked_median(call, comm: MPI.Comm, calls: int, blocks: int = 5) -> float:
    """Seconds per call: median over ``blocks`` of the mean of ``calls`` back-to-back calls."""
    for _ in range(max(calls // 10, 2)):
        call()
    means = []
    for _ in range(blocks):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - t0) / calls)
    worst = comm.allreduce(float(np.median(means)), op=MPI.MAX)
    return worst


def cpu_per_call(call, calls: int, blocks: int = 5) -> tuple[float, float]:
    """(wall, CPU) seconds per call, medians over ``blocks`` blocks, this rank alone."""
    for _ in range(max(calls // 10, 2)):
        call()
    wall, cpu = [], []
    for _ in range(blocks):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        wall.append((time.perf_counter() - t0) / calls)
        cpu.append((time.process_time() - c0) / calls)
    return float(np.median(wall)), float(np.median(cpu))


def profile(call, comm: MPI.Comm, calls: int) -> dict:
    """Per call µs of each phase and of the 12 costliest functions (own time), under cProfile."""
    for _ in range(max(calls // 10, 2)):
        call()
    comm.Barrier()
    # CPU time, not wall time: on a loaded machine a function preempted mid-way would be
    # charged for the other processes' time slices.
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    stats = pstats.Stats(prof).stats  # key -> (cc, nc, tt, ct, callers)
    phases = dict.fromkeys(PHASES, 0.0)
    funcs = []
    for key, (_, nc, tt, _, _) in stats.items():
        if key[2] == "disable" or "Profile" in key[2]:
            continue
        phases[phase_of(key)] += tt
        where = "builtin" if key[0] == "~" else f"{Path(key[0]).name}:{key[1]}"
        funcs.append((tt, f"{key[2]} ({where})", nc / calls, phase_of(key)))
    funcs.sort(reverse=True)
    return {"phases_us": {p: round(t / calls * 1e6, 3) for p, t in phases.items()},
            "total_us": round(sum(phases.values()) / calls * 1e6, 3),
            "top": [{"function": f, "us_per_call": round(t / calls * 1e6, 3),
                     "calls_per_call": round(n, 2), "phase": ph}
                    for t, f, n, ph in funcs[:12]]}


def timeline(ctx: bmlmpi.Communicator, comm: MPI.Comm, algorithm: str, nbytes: int,
             reps: int) -> dict:
    """Median µs until a request reports done, and polls it took, over ``reps`` calls."""
    n = nbytes // 4
    send = np.arange(n, dtype=np.float32)
    recv = np.empty_like(send)
    done_at, polls = [], []
    for i in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if algorithm == "mpi4py Iallreduce":
            req = comm.Iallreduce(send, recv, MPI.SUM)
        else:
            req = ctx.Iallreduce(send, recv, MPI.SUM) if algorithm == ctx.algorithm else \
                bmlmpi.Iallreduce(send, recv, MPI.SUM, comm=comm, algorithm=algorithm)
        posted = time.perf_counter() - t0
        k = 0
        while not req.Test():
            k += 1
            if time.perf_counter() - t0 > 60:
                raise TimeoutError(f"{algorithm} {nbytes} B did not finish in 60 s")
        if i:
            done_at.append((posted, time.perf_counter() - t0))
            polls.append(k)
    return {"start_us": round(float(np.median([d[0] for d in done_at])) * 1e6, 2),
            "done_us": round(float(np.median([d[1] for d in done_at])) * 1e6, 2),
            "polls": int(np.median(polls))}


def measure(args: argparse.Namespace) -> dict:
    comm = MPI.COMM_WORLD
    ctx = bmlmpi.Communicator(comm)  # algorithm auto
    small_s, small_r = np.ones(2, np.float32), np.empty(2, np.float32)  # 8 B
    paths = {
        "mpi4py comm.Allreduce": lambda: comm.Allreduce(small_s, small_r, MPI.SUM),
        "bmlmpi.Allreduce auto": lambda: bmlmpi.Allreduce(small_s, small_r, MPI.SUM, comm=comm),
        "Communicator.Allreduce auto": lambda: ctx.Allreduce(small_s, small_r, MPI.SUM),
        "bmlmpi.Allreduce native (pass-through)": lambda: bmlmpi.Allreduce(
            small_s, small_r, MPI.SUM, comm=comm, algorithm="native"),
        "bmlmpi.Allreduce bml": lambda: bmlmpi.Allreduce(small_s, small_r, MPI.SUM, comm=comm,
                                                         algorithm="bml"),
    }
    out: dict = {"self_8B": {}, "call_path_8B": {}, "executor": {}, "timeline": {}}
    # The same calls on COMM_SELF: no peer to wait for, so what remains is the call's own
    # cost (Python, plus MPI's self-copy), which a loaded machine disturbs far less.
    me = MPI.COMM_SELF
    me_ctx = bmlmpi.Communicator(me)
    me_quiet = bmlmpi.Communicator(me, algorithm="native", validate=False)
    selfs = {
        "mpi4py comm.Allreduce": lambda: me.Allreduce(small_s, small_r, MPI.SUM),
        "mpi4py comm.Iallreduce + Wait": lambda: me.Iallreduce(small_s, small_r,
                                                               MPI.SUM).Wait(),
        "bmlmpi.Allreduce native (pass-through)": lambda: bmlmpi.Allreduce(
            small_s, small_r, MPI.SUM, comm=me, algorithm="native"),
        "Communicator(algorithm='native').Allreduce": lambda: me_quiet.Allreduce(
            small_s, small_r, MPI.SUM),
        "Communicator.Allreduce auto (1 rank: no steps)": lambda: me_ctx.Allreduce(
            small_s, small_r, MPI.SUM),
    }
    for name, call in selfs.items():
        wall, cpu = cpu_per_call(call, args.calls * 5)
        out["self_8B"][name] = {"wall_us": round(wall * 1e6, 3), "cpu_us": round(cpu * 1e6, 3),
                                **profile(call, me, args.calls)}
    me_ctx.Free()
    me_quiet.Free()
    for name, call in paths.items():
        wall = blocked_median(call, comm, args.calls)
        prof = profile(call, comm, args.calls)
        out["call_path_8B"][name] = {"wall_us": round(wall * 1e6, 3), **prof}
    for nbytes in args.sizes:
        n = nbytes // 4
        send, recv = np.arange(n, dtype=np.float32), np.empty(n, np.float32)
        calls = max(5, min(200, (8 << 20) // max(nbytes, 1)))
        for algorithm in ("mpi4py", "bml", "ring"):
            if algorithm == "mpi4py":
                def call(s=send, r=recv):
                    comm.Allreduce(s, r, MPI.SUM)
            else:
                def call(s=send, r=recv, a=algorithm):
                    bmlmpi.Allreduce(s, r, MPI.SUM, comm=comm, algorithm=a)
            wall = blocked_median(call, comm, calls)
            prof = profile(call, comm, calls)
            out["executor"][f"{algorithm} {nbytes}"] = {"wall_us": round(wall * 1e6, 2),
                                                        "calls": calls, **prof}
        for algorithm in ("mpi4py Iallreduce", "bml", "ring"):
            out["timeline"][f"{algorithm} {nbytes}"] = timeline(ctx, comm, algorithm, nbytes,
                                                                max(5, calls // 4))
    out["machine"] = {"host": platform.node(), "cores": os.cpu_count(),
                      "ranks": comm.Get_size(), "python": platform.python_version(),
                      "mpi": MPI.Get_library_version().splitlines()[0],
                      "auto chose 8 B": ctx.plans.auto(2, 4),
                      "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "loadavg_start": args.load_start,
                      "loadavg_end": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    ctx.Free()
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = ["# Profile of one call (perf/profile/call_path.py)", "",
             f"{m['ranks']} ranks on {m['cores']} cores ({m['host']}), Python {m['python']}, "
             f"{m['mpi']}; {m['date']}; load average {m['loadavg_start']} at the start, "
             f"{m['loadavg_end']} at the end (a shared, loaded machine). `auto` chose "
             f"`{m['auto chose 8 B']}` at 8 B.", "",
             "## One call's own cost at 8 B, on COMM_SELF (no peer to wait for), µs", "",
             "Wall and CPU time per call (medians of blocks, no profiler), then cProfile's "
             "own CPU time per phase (the profiler's clock costs ~0.5 µs per function call, "
             "so the phases add up to more than the call: rank them, do not add them).", "",
             "| call | wall | CPU | profiled | " + " | ".join(PHASES) + " |",
             "|---|" + "---:|" * (3 + len(PHASES))]
    for name, r in res["self_8B"].items():
        lines.append(f"| {name} | {r['wall_us']:.2f} | {r['cpu_us']:.2f} | "
                     f"{r['total_us']:.1f} | " +
                     " | ".join(f"{r['phases_us'][p]:.2f}" for p in PHASES) + " |")
    for name in ("Communicator(algorithm='native').Allreduce",
                 "bmlmpi.Allreduce native (pass-through)"):
        lines += ["", f"Costliest functions of `{name}` on COMM_SELF (own CPU µs per call, "
                      f"calls per call, phase):", ""]
        lines += [f"- {f['function']}: {f['us_per_call']:.2f} µs, ×{f['calls_per_call']:g}, "
                  f"{f['phase']}" for f in res["self_8B"][name]["top"][:10]]
    lines += ["", "## The drop-in at 8 B between ranks: wall time and cProfile own CPU time "
              "per call (µs)", "",
              "| call | wall | profiled total | " + " | ".join(PHASES) + " |",
              "|---|" + "---:|" * (2 + len(PHASES))]
    for name, r in res["call_path_8B"].items():
        lines.append(f"| {name} | {r['wall_us']:.2f} | {r['total_us']:.1f} | " +
                     " | ".join(f"{r['phases_us'][p]:.2f}" for p in PHASES) + " |")
    for name in ("bmlmpi.Allreduce auto", "bmlmpi.Allreduce native (pass-through)"):
        lines += ["", f"Costliest functions of `{name}` (own time, µs per call, calls per "
                      f"call, phase):", ""]
        lines += [f"- {f['function']}: {f['us_per_call']:.2f} µs, ×{f['calls_per_call']:g}, "
                  f"{f['phase']}" for f in res["call_path_8B"][name]["top"][:10]]
    lines += ["", "## The executor: per call µs by phase (cProfile own CPU time)", "",
              "| call | wall | profiled total | " + " | ".join(PHASES) + " |",
              "|---|" + "---:|" * (2 + len(PHASES))]
    for name, r in res["executor"].items():
        lines.append(f"| {name} B | {r['wall_us']:.1f} | {r['total_us']:.1f} | " +
                     " | ".join(f"{r['phases_us'][p]:.1f}" for p in PHASES) + " |")
    lines += ["", "## Timeline: Iallreduce posted, then Test() polled until done (µs)", "",
              "| call | posted after | done after | polls |", "|---|---:|---:|---:|"]
    for name, r in res["timeline"].items():
        lines.append(f"| {name} B | {r['start_us']:.1f} | {r['done_us']:.1f} | {r['polls']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per 8 B measurement")
    p.add_argument("--sizes", default="65536,1048576,4194304")
    p.add_argument("--write", help="directory for call_path.json and call_path.md")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    res = measure(args)
    if MPI.COMM_WORLD.Get_rank() == 0:
        text = markdown(res)
        print(text)
        if args.write:
            d = Path(args.write)
            d.mkdir(parents=True, exist_ok=True)
            (d / "call_path.json").write_text(json.dumps(res, indent=1))
            (d / "call_path.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
