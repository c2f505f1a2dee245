"""Plots an experiment's JSON: median allreduce time per rate, topology and algorithm.

    python -m perf.testbed.plot perf/testbed/results/bcube_vs_fattree.json out.png

Bars are medians with min–max whiskers; black ticks mark the bandwidth-only theory where one
exists. Needs matplotlib (``python -m perf.testbed setup`` installs it in the MPICH venv).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(results: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if "median_s" in r]
    # one group of bars per (rate, size); older results have one size for all rows
    groups = sorted({(r["rate_bps"], r["bytes"], r["rate"]) for r in rows})
    series = sorted({(r["topology"], r["shape"], r["algorithm"]) for r in rows})
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups)), 4.5))
    for i, (topo, shape, alg) in enumerate(series):
        for j, (_, nbytes, rate) in enumerate(groups):
            r = next((x for x in rows if x["rate"] == rate and x["bytes"] == nbytes
                      and x["topology"] == topo and x["algorithm"] == alg), None)
            if r is None:
                continue
            x = j + (i - (len(series) - 1) / 2) * width
            ax.bar(x, r["median_s"], width, color=f"C{i}",
                   label=f"{alg} on {topo} {shape}" if j == 0 else None,
                   yerr=[[r["median_s"] - r["min_s"]], [r["max_s"] - r["median_s"]]],
                   capsize=3)
            if r.get("theory_s"):
                ax.hlines(r["theory_s"], x - width / 2, x + width / 2, colors="black")
    ax.set_xticks(range(len(groups)), [f"{rate}\n{nbytes / 2**20:g} MiB"
                                        for _, nbytes, rate in groups])
    ax.set_xlabel("link rate (each direction) and allreduce size")
    ax.set_ylabel("allreduce time, s (median of reps)")
    ax.set_yscale("log")
    ax.set_title("allreduce on the emulated BCube vs its one-NIC Fat-Tree twin "
                 "(black: bandwidth theory)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m perf.testbed.plot RESULTS.json OUT.png", file=sys.stderr)
        return 2
    plot(json.loads(Path(args[0]).read_text()), Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
