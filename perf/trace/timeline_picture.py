"""One picture made with ``BMLMPI_TIMELINE``: a 1 MiB BML allreduce at N = 4.

    BMLMPI_TIMELINE=/tmp/tl bmlmpi-run -n 4 python perf/trace/timeline_picture.py run
    bmlmpi-trace --timeline /tmp/tl -o perf/trace/bml-1MiB-n4.json
    python perf/trace/timeline_picture.py render perf/trace/bml-1MiB-n4.json \\
        perf/trace/bml-1MiB-n4.png

``run``: every rank makes ``--calls`` blocking BML allreduces of 262144 float32 (1 MiB; the
first is the signature's checked call, with its plan and kernels made), checks the result
against ``comm.Allreduce`` and exits, which writes its timeline. ``render``: draws the last
call of the merged trace, one row per rank and lane, its steps cut into post, wait, reduce and
copy (matplotlib), the times relative to the call's earliest start on any rank.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLOURS = {"post": "#4c72b0", "wait": "#dddddd", "reduce": "#c44e52", "copy": "#55a868"}


def run(calls: int) -> int:
    import numpy as np
    from mpi4py import MPI

    import bmlmpi

    world = MPI.COMM_WORLD
    comm = bmlmpi.Communicator(world, algorithm="bml")
    n = (1 << 20) // 4
    send = ((np.arange(n) * 7 + world.rank * 3) % 11).astype(np.float32)
    recv = np.empty_like(send)
    ref = np.empty_like(send)
    world.Allreduce(send, ref)
    for _ in range(calls):
        world.Barrier()
        comm.Allreduce(send, recv)
        assert np.array_equal(recv, ref)
    return 0


def render(trace: Path, out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    calls = [e for e in events if e["name"].startswith("allreduce")]
    last_seq = max(e["args"]["seq"] for e in calls)
    mine = [e for e in calls if e["args"]["seq"] == last_seq]
    t0 = min(e["ts"] for e in mine)
    t1 = max(e["ts"] + e["dur"] for e in mine)
    ranks = sorted({e["pid"] for e in mine})
    inside = [e for e in events if e["name"] in COLOURS
              and any(c["pid"] == e["pid"] and c["ts"] <= e["ts"] <= c["ts"] + c["dur"]
                      for c in mine)]
    rows = sorted({(e["pid"], e["tid"]) for e in inside} | {(r, 0) for r in ranks})
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.6))
    for y, (rank, lane) in enumerate(rows):
        for c in mine:
            if c["pid"] == rank and lane == 0:
                ax.barh(y, c["dur"], left=c["ts"] - t0, height=0.9, color="none",
                        edgecolor="black", linewidth=0.8)
        for e in inside:
            if (e["pid"], e["tid"]) == (rank, lane):
                ax.barh(y, max(e["dur"], 0.5), left=e["ts"] - t0, height=0.6,
                        color=COLOURS[e["name"]])
                if e["name"] == "wait" and e["dur"] > 0.06 * (t1 - t0):
                    ax.text(e["ts"] - t0 + e["dur"] / 2, y, f"s{e['args']['step']}",
                            ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"rank {r}" + (f" lane {ln}" if ln else "")
                                     for r, ln in rows])
    ax.invert_yaxis()
    ax.set_xlabel("µs from the call's first start (wall clock, all ranks on one node)")
    sig = mine[0]["args"]
    ax.set_title(f"bmlmpi {sig['algorithm']} allreduce, {sig['count'] * 4 >> 10} KiB "
                 f"{sig['dtype']}, N = {len(ranks)} (call {last_seq + 1}; BMLMPI_TIMELINE)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="lower right", fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--calls", type=int, default=5)
    d = sub.add_parser("render")
    d.add_argument("trace", type=Path)
    d.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.what == "run":
        return run(args.calls)
    return render(args.trace, args.out)


if __name__ == "__main__":
    sys.exit(main())
