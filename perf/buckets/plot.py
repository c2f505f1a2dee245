"""Plots and a table from perf/buckets/run.sh's results: the per-iteration time of each plan
and one iteration's timeline per rank (compute and allreduce intervals, overlap fraction).

    python perf/buckets/plot.py perf/buckets/results 4
    python perf/buckets/plot.py perf/buckets/results 4 testbed-bcube2x2   # another run's name

Reads ``interleaved-n<N>.json`` (perf/buckets/interleaved.py: every plan in one run; or
``interleaved-<NAME>.json``, and then writes ``*-<NAME>.*``). Writes ``iteration-n<N>.png``,
``timeline-n<N>.png`` and ``summary-n<N>.json`` (per plan: median step seconds, buckets, overlap
fraction per rank) into the results folder. The overlap fraction is the part of the allreduce
time (union of the intervals) during which this rank computed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total = 0.0
    for s1, e1 in a:
        for s2, e2 in b:
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def overlap_fraction(rank: dict) -> float:
    comm = union([(c[2], c[3]) for c in rank["comm"]])
    compute = union([(c[2], c[3]) for c in rank["compute"]])
    return intersect(comm, compute) / length(comm) if comm else 0.0


def load(folder: Path, name: str) -> tuple[dict, list[dict]]:
    d = json.loads((folder / f"interleaved-{name}.json").read_text())
    return d, [{"label": r["plan"], "run": r, "timeline": {"ranks": r["timeline"]}}
            for r in d["plans"]]


def main() -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder, n = Path(sys.argv[1]), int(sys.argv[2])
    name = sys.argv[3] if len(sys.argv) > 3 else f"n{n}"
    meta, runs = load(folder, name)
    summary = []
    for r in runs:
        ranks = r["timeline"]["ranks"]
        summary.append({"plan": r["label"], "step_ms_median": r["run"]["step_seconds_median"] * 1e3,
                        "step_ms_mean": r["run"]["step_seconds_mean"] * 1e3,
                        "step_ms_quartiles": [q * 1e3 for q in
                                              r["run"].get("step_seconds_quartiles", [])],
                        "buckets": len(r["run"]["buckets"]),
                        "timeline_iteration_ms": [(x["end"] - x["t0"]) * 1e3 for x in ranks],
                        "overlap_fraction": [round(overlap_fraction(x), 3) for x in ranks]})
    (folder / f"summary-{name}.json").write_text(json.dumps(summary, indent=1))
    for s in summary:
        print(f"{s['plan']:>22}: median step {s['step_ms_median']:8.2f} ms, "
              f"{s['buckets']:2d} buckets, overlap {s['overlap_fraction']}")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([s["plan"] for s in summary], [s["step_ms_median"] for s in summary])
    ax.set_ylabel("median iteration (ms)")
    where = meta.get("note") or "2 shared cores (oversubscribed, loaded)"
    ax.set_title(f"train_buckets.py model, {n} ranks, batch {meta.get('batch_per_rank', 32)} "
                 f"per rank, {where}", fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(folder / f"iteration-{name}.png", dpi=110)

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.0 * len(runs)), squeeze=False)
    colours = {"forward": "tab:blue", "backward": "tab:green", "comm": "tab:orange"}
    for ax, r, s in zip(axes[:, 0], runs, summary, strict=True):
        for k, x in enumerate(r["timeline"]["ranks"]):
            t0 = x["t0"]
            for kind, _, a, b in x["compute"]:
                ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3)], (k - 0.4, 0.4),
                               color=colours[kind])
            for _, _, a, b in x["comm"]:
                ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3)], (k, 0.4),
                               color=colours["comm"], alpha=0.6, edgecolor="k", linewidth=0.3)
        ax.set_yticks(range(len(r["timeline"]["ranks"])))
        ax.set_ylabel("rank")
        ax.set_title(f"{r['label']}: overlap {s['overlap_fraction']}", fontsize=9)
    axes[-1, 0].set_xlabel("ms from the start of the backward pass (backward, allreduces, "
                           "next forward)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    fig.legend(handles, list(colours), loc="upper right")
    fig.tight_layout()
    fig.savefig(folder / f"timeline-{name}.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
