"""Where a scheduled allreduce's time goes, step by step: post, wait, reduction, Python between.

    bmlmpi-run -n 2 python perf/profile/timeline.py --write perf/profile --tag after

An :class:`bmlmpi.execute.RunObserver` (installed with ``execute.observing``; nothing in
bmlmpi is patched) stamps ``time.perf_counter_ns`` at each hook of every lane step: ``post``
(before the step's Irecv/Isend), ``posted`` (they returned), ``received`` (every transfer of
the step completed; on the blocking path of a one-lane plan: every receive), ``complete``
(its reductions applied). One blocking ``Communicator.Allreduce`` call is cut into:

- **entry**: from the call to the first step's post (argument checks, plan lookup, the Run,
  the copy of sendbuf into recvbuf);
- **post**: post → posted, summed over steps;
- **wait**: posted → received, summed (MPI moving the data, and the polling around it);
- **reduction**: received → complete, summed (the kernels);
- **between**: complete → the next step's post, summed (the executor's own bookkeeping; on
  the blocking path of a one-lane plan also the wait for the step's sends, which complete
  after its reductions);
- **exit**: the last complete to the call's return (finish, Wait's bookkeeping).

With several lanes in flight the per-lane intervals overlap; the table then says so, and the
sum of phases exceeds the call. Medians over ``--calls`` calls per (algorithm, size), rank 0's
view, beside mpi4py's blocking ``comm.Allreduce`` of the same size. ``--write DIR`` writes
``timeline-TAG.json`` and ``timeline-TAG.md``.
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
from bmlmpi import execute

PHASES = ("entry", "post", "wait", "reduction", "between", "exit")


class Stamps(execute.RunObserver):
    """Records (kind, lane, ns) for every hook of every observed Run."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.lanes = 0

    def _at(self, kind: str, run: execute.Run, lane: int) -> None:
        self.events.append((kind, lane, time.perf_counter_ns()))
        self.lanes = max(self.lanes, len(run.plan.lanes))

    def post(self, run, lane):
        self._at("post", run, lane)

    def posted(self, run, lane):
        self._at("posted", run, lane)

    def received(self, run, lane):
        self._at("received", run, lane)

    def complete(self, run, lane):
        self._at("complete", run, lane)


def split(events: list[tuple[str, int, int]], start: int, end: int) -> dict[str, float]:
    """One call's events cut into the phases (µs)."""
    out = dict.fromkeys(PHASES, 0.0)
    if not events:
        out["exit"] = (end - start) / 1e3
        return out
    last: dict[int, tuple[str, int]] = {}
    for kind, lane, t in events:
        prev = last.get(lane)
        if kind == "post" and prev is not None and prev[0] == "complete":
            out["between"] += (t - prev[1]) / 1e3
        elif kind == "posted" and prev is not None:
            out["post"] += (t - prev[1]) / 1e3
        elif kind == "received" and prev is not None:
            out["wait"] += (t - prev[1]) / 1e3
        elif kind == "complete" and prev is not None:
            out["reduction"] += (t - prev[1]) / 1e3
        last[lane] = (kind, t)
    out["entry"] = (events[0][2] - start) / 1e3
    out["exit"] = (end - max(t for _, _, t in events)) / 1e3
    return out


def measure(comm: MPI.Comm, algorithms: list[str], sizes: list[int], calls: int) -> list[dict]:
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        send = (np.arange(n, dtype=np.float32) % 7) + comm.rank
        recv = np.empty_like(send)
        for _ in range(3):
            comm.Allreduce(send, recv, MPI.SUM)
        times = []
        for _ in range(calls):
            comm.Barrier()
            t = time.perf_counter_ns()
            comm.Allreduce(send, recv, MPI.SUM)
            times.append((time.perf_counter_ns() - t) / 1e3)
        rows.append({"algorithm": "mpi4py", "bytes": nbytes, "total": float(np.median(times)),
                     **dict.fromkeys(PHASES, None), "steps": None, "lanes": None})
        for algorithm in algorithms:
            ctx = bmlmpi.Communicator(comm, algorithm=algorithm)
            for _ in range(3):  # plan, kernels, the first-call check
                ctx.Allreduce(send, recv, MPI.SUM)
            per_call, totals, stamps = [], [], Stamps()
            with execute.observing(stamps):
                for _ in range(calls):
                    stamps.events = []
                    comm.Barrier()
                    t = time.perf_counter_ns()
                    ctx.Allreduce(send, recv, MPI.SUM)
                    end = time.perf_counter_ns()
                    totals.append((end - t) / 1e3)
                    per_call.append((split(stamps.events, t, end),
                                     sum(1 for e in stamps.events if e[0] == "post")))
            expect = comm.size * (np.arange(n, dtype=np.float32) % 7) + sum(range(comm.size))
            assert np.array_equal(recv, expect), f"{algorithm} {nbytes}: wrong result"
            rows.append({"algorithm": algorithm, "bytes": nbytes,
                         "total": float(np.median(totals)),
                         **{ph: float(np.median([c[ph] for c, _ in per_call])) for ph in PHASES},
                         "steps": int(np.median([s for _, s in per_call])),
                         "lanes": stamps.lanes})
            ctx.Free()
    return rows


def markdown(res: dict) -> str:
    lines = [f"# Executor timeline ({res['tag']}): µs per blocking call, median of "
             f"{res['calls']} calls, rank 0", "",
             f"{res['ranks']} ranks, {res['machine']}; {res['time']}; load average "
             f"{res['load_before']} before, {res['load_after']} after (a shared machine).", "",
             "| algorithm | size | total | entry | post | wait | reduction | between | exit | "
             "lane steps | lanes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        cells = ["–" if r[ph] is None else f"{r[ph]:.1f}" for ph in PHASES]
        lines.append(f"| {r['algorithm']} | {r['bytes'] >> 10} KiB | {r['total']:.1f} | "
                     + " | ".join(cells) + f" | {r['steps'] or '–'} | {r['lanes'] or '–'} |")
    lines += ["", "With more than one lane the lanes' intervals overlap, so phases may add up "
              "to more than the call."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default="bml,ring")
    p.add_argument("--sizes", default="65536,1048576,4194304")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--tag", default="now")
    p.add_argument("--write", help="directory for timeline-TAG.json and timeline-TAG.md")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = measure(comm, args.algorithms.split(","), [int(s) for s in args.sizes.split(",")],
                   args.calls)
    if comm.rank != 0:
        return 0
    res = {"tag": args.tag, "calls": args.calls, "ranks": comm.size,
           "machine": f"{platform.node()}, {os.cpu_count()} CPUs, "
                      f"{MPI.Get_library_version().splitlines()[0]}",
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_before": load_before,
           "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()), "rows": rows}
    text = markdown(res)
    print(text)
    if args.write:
        out = Path(args.write)
        (out / f"timeline-{args.tag}.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / f"timeline-{args.tag}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
