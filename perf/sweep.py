"""Measure every algorithm against native MPI_Allreduce at several rank counts.

    python perf/sweep.py --ranks 2,4,9 --max 67108864

writes into a new folder ``bmlmpi-results/perf-sweep-<UTC date and time>`` of the current
directory (git ignores ``bmlmpi-results/``); the committed results in ``perf/results/`` were
made with ``--out perf/results``, which replaces them.

``native`` is the MPI library's ``MPI_Allreduce`` as user code calls it (mpi4py's blocking
``comm.Allreduce``); ``passthrough`` is bmlmpi's algorithm ``native`` (see bmlmpi/cli/bench.py).
``python -m perf.baseline`` adds the C loop and the memory floor to the same comparison.

Runs ``bmlmpi-run -n N python -m bmlmpi.cli.bench`` per rank count, small sizes (≤ 8 KiB) with
OSU's default iterations and larger ones with fewer (``--large-iters``), saves the JSON of
each run (rows + machine, MPI, versions, oversubscription) and writes ``summary.md`` with the
latency and busbw ratios to native measured in the same run. Each run has a timeout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(n: int, lo: int, hi: int, algos: str, out: Path, extra: list[str],
          timeout: int, blocks: int = 5) -> dict:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable, "-m",
           "bmlmpi.cli.bench", "-m", f"{lo}:{hi}", "-f", "-c", "--busbw", "--algorithms", algos,
           "--blocks", str(blocks), "--json", str(out), "--no-progress", *extra]
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=timeout)
    print(res.stdout[-3000:], res.stderr[-2000:], sep="\n", flush=True)
    if res.returncode != 0:
        raise SystemExit(f"bench failed at {n} ranks (exit {res.returncode})")
    return json.loads(out.read_text())


def summarise(runs: dict[int, list[dict]], machines: dict[int, dict], algos: list[str]) -> str:
    others = [a for a in algos if a != "native"]
    lines = ["# Sweep summary", ""]
    for n, rows in sorted(runs.items()):
        m = machines[n]
        lines += [f"## {n} ranks", "",
                  f"Machine: {m['cpu']}, {m['cores']} cores; {n} ranks"
                  f"{' (oversubscribed)' if m['oversubscribed'] else ''}; {m['mpi_library']}; "
                  f"mpi4py {m['mpi4py']}, numpy {m['numpy']}, numba {m['numba']}, "
                  f"Python {m['python']}, bmlmpi {m['bmlmpi']}; {m['date']}.", "",
                  "| size (B) | native avg (us) | " + " | ".join(
                      f"{a} avg (us) | {a}/native latency | {a}/native busbw" for a in others)
                  + " |",
                  "|" + "---|" * (2 + 3 * len(others))]
        by = {(r["algorithm"], r["size"]): r for r in rows}
        for size in sorted({r["size"] for r in rows}):
            nat = by[("native", size)]
            cells = [str(size), f"{nat['avg_us']:.1f}"]
            for a in others:
                r = by[(a, size)]
                lat = r["avg_us"] / nat["avg_us"] if nat["avg_us"] else float("nan")
                bw = (r["busbw_GBps"] / nat["busbw_GBps"]) if nat["busbw_GBps"] else float("nan")
                cells += [f"{r['avg_us']:.1f}", f"{lat:.2f}", f"{bw:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if "auto" in algos:
            lines += [f"auto against the best single algorithm at {n} ranks (same run, "
                      f"algorithms interleaved in blocks; target: auto ≤ 1.10 × best). "
                      f"'mean' is OSU's average over all iterations, 'median' the median of "
                      f"the per-block means:", "",
                      "| size (B) | auto chose | best (mean) | auto / best (mean) "
                      "| best (median) | auto / best (median) |",
                      "|---|---|---|---|---|---|"]
            worst = {"avg_us": 0.0, "median_block_us": 0.0}
            for size in sorted({r["size"] for r in rows}):
                cells = [str(size), by[("auto", size)].get("chose", "?")]
                for key in ("avg_us", "median_block_us"):
                    singles = {a: by[(a, size)].get(key, by[(a, size)]["avg_us"])
                               for a in algos if a != "auto"}
                    best = min(singles, key=singles.get)
                    ratio = by[("auto", size)].get(key, by[("auto", size)]["avg_us"]) \
                        / singles[best]
                    worst[key] = max(worst[key], ratio)
                    cells += [best, f"{ratio:.2f}"]
                lines.append("| " + " | ".join(cells) + " |")
            lines += ["", f"Worst auto / best at {n} ranks: {worst['avg_us']:.2f} (mean), "
                      f"{worst['median_block_us']:.2f} (median of blocks).", ""]
    return "\n".join(lines)


def plot(runs: dict[int, list[dict]], algos: list[str], out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[plot]'); no plots", flush=True)
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), squeeze=False)
    for ax, (n, rows) in zip(axes[0], sorted(runs.items()), strict=True):
        by = {(r["algorithm"], r["size"]): r for r in rows}
        sizes = sorted({r["size"] for r in rows})
        for a in algos:
            if a == "native":
                continue
            ax.plot(sizes, [by[(a, s)]["avg_us"] / by[("native", s)]["avg_us"] for s in sizes],
                    marker="o", label=a)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} ranks: latency / native")
        ax.set_xlabel("bytes")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def default_out() -> Path:
    """A folder of its own for each run, outside the committed ``perf/results/``."""
    return Path("bmlmpi-results") / time.strftime("perf-sweep-%Y%m%d-%H%M%S", time.gmtime())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,9")
    p.add_argument("--algorithms", default="all")
    p.add_argument("--min", type=int, default=4)
    p.add_argument("--max", type=int, default=64 << 20)
    p.add_argument("--large-iters", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5,
                   help="interleave the algorithms in this many blocks per size")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the JSON, summary.md and the plot (default: a new "
                        "bmlmpi-results/perf-sweep-<UTC date and time> here; perf/results "
                        "holds the committed results and is replaced only when named)")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--summarise-only", action="store_true",
                   help="rebuild summary.md and the plot from the saved JSON")
    args = p.parse_args(argv)
    if args.out is None:
        if args.summarise_only:
            p.error("--summarise-only reads a finished run: name its folder with --out")
        args.out = default_out()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    runs, machines, algos = {}, {}, []
    for n in (int(x) for x in args.ranks.split(",")):
        if args.summarise_only:
            parts = [json.loads(f.read_text()) for f in
                     (out / f"sweep-n{n}-small.json", out / f"sweep-n{n}-large.json")
                     if f.exists()]
            runs[n] = [r for p_ in parts for r in p_["rows"]]
            machines[n] = parts[-1]["machine"]
            algos = list(dict.fromkeys(r["algorithm"] for r in runs[n]))
            continue
        small = bench(n, args.min, min(8192, args.max), args.algorithms,
                      out / f"sweep-n{n}-small.json", [], args.timeout, args.blocks) \
            if args.min <= 8192 else {"rows": []}
        large = bench(n, max(16384, args.min), args.max, args.algorithms,
                      out / f"sweep-n{n}-large.json",
                      ["-i", str(args.large_iters), "-x", "3"], args.timeout, args.blocks) \
            if args.max > 8192 else {"rows": []}
        runs[n] = small["rows"] + large["rows"]
        machines[n] = (large if large["rows"] else small)["machine"]
        algos = list(dict.fromkeys(r["algorithm"] for r in runs[n]))
    (out / "summary.md").write_text(summarise(runs, machines, algos))
    print(f"wrote {out / 'summary.md'}")
    plot(runs, algos, out / "ratios.png")


if __name__ == "__main__":
    main()
