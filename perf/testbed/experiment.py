"""BML on an emulated BCube against the best algorithm on its one-NIC Fat-Tree twin.

    python -m perf.testbed experiment --rates 100mbit,200mbit --bytes 32M,64M --reps 5

For each link rate and each topology (default BCube 3x3 and the 9-server Fat-Tree), the testbed is
built, ``perf.testbed.ranks bench`` times every algorithm at every size (warm-up calls, then
``--reps`` timed calls, each the slowest rank's time after a barrier), every rank reads its NIC
counters around the timed calls, and the testbed is torn down (also on error or Ctrl-C). Saved
in ``--out`` (default perf/testbed/results/): ``<name>.json`` (everything, with machine and library
versions), ``<name>.csv`` (one row per rate, topology and algorithm) and ``<name>.png``.

Judged (printed, and saved under "targets"), per rate and size: the median time of bml on BCube
against the fastest median on the Fat-Tree (target ≤ 0.6; theory 0.5), against its theory
2(N-1)/(kN)·P/R (target ≤ 1.25), how evenly each server's NICs carried bml's bytes (≤ 1.10),
and whether every byte stayed on the testbed's links.

``--collective reduce_scatter`` or ``allgather`` times BML's halves instead
(MPI_Reduce_scatter_block of a ``--bytes`` vector, MPI_Allgather of a ``--bytes`` result, and
bmlmpi's own calls): each sends half the allreduce's bytes, so every theory is halved and the
ratio's theory stays 1/k.

``--collective alltoall`` times the all-to-all instead (MPI_Alltoall and bmlmpi's, each rank
sending ``--bytes`` in all, a block of 1/N to every rank): the judged algorithm on BCube is
``bcube`` (the digit by digit exchange), every row's theory is its topology's bandwidth bound
(:mod:`.theory`: (N−1)/N · P/R on the Fat-Tree, max_l (n_l−1)/n_l · P/R on BCube) and the
ratio's theory is their quotient (3/4 on BCube(3,2)); the issue sets no target for it, so
nothing is marked ok or missed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import counters, mpi, netns
from .check import parse_result
from .theory import (
    alltoall_nic_shares,
    alltoall_seconds,
    bml_nic_shares,
    one_nic_seconds,
    predicted_seconds,
)
from .topology import build

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_RATIO = 0.6
TARGET_THEORY = 1.25
TARGET_SPREAD = 1.10


def machine_info() -> dict:
    info = {"machine": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "loadavg_start": os.getloadavg()}
    try:
        info["mpi"] = mpi.check()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        info["mpi"] = f"unknown: {exc}"
    probe = ("import numpy, mpi4py; print(numpy.__version__, mpi4py.__version__); "
             "import bmlmpi; print(bmlmpi.__version__)")
    out = subprocess.run([str(mpi.venv_python()), "-c", probe], capture_output=True, text=True,
                         timeout=60, env=mpi.environment(), cwd=mpi.REPO)
    lines = out.stdout.split("\n")
    info["numpy_mpi4py"] = lines[0] if lines else ""
    info["bmlmpi"] = lines[1] if len(lines) > 1 and lines[1] else f"not importable: " \
                                                                   f"{out.stderr[-300:]}"
    return info


# MPICH's control variable that forces each collective's algorithm (read at MPI_Init).
ALGORITHM_CVARS = {"allreduce": "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
                   "reduce_scatter": "MPIR_CVAR_REDUCE_SCATTER_BLOCK_INTRA_ALGORITHM",
                   "allgather": "MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM",
                   "alltoall": "MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM"}


def jobs(algorithms: str, collective: str = "allreduce") -> list[tuple[str, str, dict[str, str]]]:
    """(label, the rank program's algorithm list, environment) per mpiexec job.

    ``native-<name>`` is MPI's own call with MPICH's algorithm ``<name>`` for that collective
    forced through its control variable (read at MPI_Init, hence a job of its own), e.g.
    ``native-ring``: MPICH's ring allreduce or allgather, the strongest one-NIC baselines we
    have (reduce-scatter's are ``native-pairwise``, ``native-recursive_halving``).
    """
    names = [a for a in algorithms.split(",") if a]
    plain = [a for a in names if not a.startswith("native-")]
    out = [(",".join(plain), ",".join(plain), {})] if plain else []
    for a in names:
        if a.startswith("native-"):
            out.append((a, "native", {ALGORITHM_CVARS[collective]: a[len("native-"):]}))
    return out


def parse_sizes(text: str) -> list[int]:
    """``32M,64M`` or byte counts: the allreduce sizes, each a multiple of 4 (float32)."""
    from bmlmpi.kernels.bench import parse_size

    sizes = [parse_size(item) for item in text.split(",")]
    for size in sizes:
        if size < 4 or size % 4:
            raise argparse.ArgumentTypeError(f"size {size} must be a positive multiple of 4")
    return sizes


def run_topology(kind: str, shape: str, rate: str, args: argparse.Namespace) -> dict:
    net = build(kind, shape)
    rate_bps = netns.parse_rate(rate)
    rows, runs = [], []
    with netns.testbed(kind, shape, rate, cc=args.cc, mtu=args.mtu):
        for nbytes in args.bytes:
            worst = one_nic_seconds(nbytes, rate_bps, net.servers)
            for label, algs, env in jobs(args.algorithms, args.collective):
                timeout = 120 + (args.reps + args.warmup) * len(algs.split(",")) * 6 * worst
                runs.append(_bench(net, kind, rate, nbytes, label, algs, env, timeout, args))
                for res in runs[-1].pop("results"):
                    name = label if env else res["algorithm"]
                    rows.append(_row(net, kind, rate, rate_bps, nbytes, name, res, args))
    return {"rows": rows, "runs": runs}


def _bench(net, kind: str, rate: str, nbytes: int, label: str, algs: str, env: dict,
           timeout: float, args: argparse.Namespace) -> dict:
    before = counters.settled_snapshot()
    t0 = time.monotonic()
    proc = mpi.run(net, ["python", "-m", "perf.testbed.ranks", "bench", "--kind", kind,
                         "--shape", net.shape, "--bytes", str(nbytes),
                         "--collective", args.collective,
                         "--reps", str(args.reps), "--warmup", str(args.warmup),
                         "--algorithms", algs], timeout=timeout, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {net.shape} at {rate}, {nbytes} bytes ({label}): mpiexec "
                           f"exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    job = counters.delta(before, counters.settled_snapshot())
    return {"kind": kind, "shape": net.shape, "rate": rate, "bytes": nbytes,
            "collective": args.collective, "cc": args.cc,
            "mtu": args.mtu, "job": label, "env": env, "wall_s": wall,
            "conservation": counters.conservation(net, job),
            "isolation": counters.isolation(net),
            "results": parse_result(proc.stdout)["results"]}


def model_seconds(kind: str, name: str, nbytes: int, rate_bps: float,
                  radices: tuple[int, ...]) -> float | None:
    """The cost model's price of the very schedule the ranks ran (bandwidth only: the links
    have no added delay), or None for an algorithm without a bmlmpi schedule (native)."""
    from bmlmpi.model import price_symmetric
    from bmlmpi.model.network import BCubeNetwork, FatTree
    from bmlmpi.schedules.bml import bml_schedule
    from bmlmpi.schedules.ring import ring_schedule

    n = math.prod(radices)
    count = nbytes // 4  # float32, as the ranks send
    if name == "bml":
        sched = bml_schedule(0, n, count, tuple(radices))
    elif name == "ring":
        sched = ring_schedule(0, n, count)
    else:
        return None
    network = BCubeNetwork(radices) if kind == "bcube" else FatTree(n)
    return price_symmetric(sched, network).seconds(4, 0.0, 8.0 / rate_bps)


def _row(net, kind: str, rate: str, rate_bps: float, nbytes: int, name: str, res: dict,
         args: argparse.Namespace) -> dict:
    row = {"collective": args.collective, "rate": rate, "rate_bps": rate_bps, "topology": kind,
           "shape": net.shape,
           "servers": net.servers, "nics": net.nics, "algorithm": name, "bytes": nbytes,
           "cc": args.cc, "mtu": args.mtu}
    if "skipped" in res:
        return {**row, "skipped": res["skipped"]}
    times = res["seconds"]
    theory = predicted_seconds(kind, name, nbytes, rate_bps, net.radices, args.collective)
    model = model_seconds(kind, name, nbytes, rate_bps, tuple(net.radices))
    if args.collective == "alltoall":
        model = None  # model_seconds prices the allreduce's schedules
    elif args.collective != "allreduce":
        # One half of the allreduce: every closed form and price is half the allreduce's.
        theory = theory / 2 if theory else theory
        model = None
    median = statistics.median(times)
    return {**row, "reps": len(times), "seconds": times, "median_s": median,
            "min_s": min(times), "max_s": max(times), "theory_s": theory,
            "model_s": model,
            "vs_theory": median / theory if theory else None, "correct": res["correct"],
            # user+system CPU of all ranks per call (kernel softirq work on the links excluded):
            # next to 2 cores × the call's time it shows how close the CPU is to the limit.
            "rank_cpu_s_per_call": res.get("rank_cpu_s_per_call"),
            **_per_nic(net, name, res["nics"], args.reps, args.collective)}


def judged(collective: str) -> str:
    """The algorithm the BCube side is judged by: BML, or the all-to-all's ``bcube``."""
    return "bcube" if collective == "alltoall" else "bml"


def _per_nic(net, name: str, nics_by_rank: list[dict], reps: int,
             collective: str = "allreduce") -> dict:
    """Bytes each NIC sent per call, averaged over servers, and for the judged algorithm on
    BCube the worst spread of a server's NICs relative to their theoretical shares (equal
    radices: equal shares)."""
    levels = sorted(nics_by_rank[0])
    per_call = {nic: statistics.mean(r[nic]["tx_bytes"] for r in nics_by_rank) / reps
                for nic in levels}
    spread = None
    if net.kind == "bcube" and name == judged(collective):
        shares = (alltoall_nic_shares if collective == "alltoall"
                  else bml_nic_shares)(net.radices)
        spreads = []
        for r in nics_by_rank:
            for key in ("tx_bytes", "rx_bytes"):
                norm = [r[f"eth{lv}"][key] / s for lv, s in enumerate(shares)]
                spreads.append(max(norm) / max(min(norm), 1e-9))
        spread = max(spreads)
    return {"nic_tx_bytes_per_call": per_call, "nic_spread": spread}


def judge(rows: list[dict], radices: tuple[int, ...], collective: str = "allreduce"
          ) -> list[dict]:
    out = []
    points = sorted({(netns.parse_rate(r["rate"]), r["bytes"], r["rate"]) for r in rows})
    name = judged(collective)
    for rate_bps, nbytes, rate in points:
        done = [r for r in rows if r["rate"] == rate and r["bytes"] == nbytes and "median_s" in r]
        bml = next((r for r in done if r["topology"] == "bcube" and r["algorithm"] == name),
                   None)
        fat = [r for r in done if r["topology"] == "fattree"]
        if bml is None or not fat:
            continue
        best = min(fat, key=lambda r: r["median_s"])
        ratio = bml["median_s"] / best["median_s"]
        k, n = len(radices), math.prod(radices)
        row = {"rate": rate, "bytes": nbytes, "bcube_algorithm": name,
               "bml_bcube_s": bml["median_s"], "best_fattree": best["algorithm"],
               "best_fattree_s": best["median_s"], "ratio": ratio, "ratio_theory": 1 / k,
               "ratio_ok": ratio <= TARGET_RATIO, "bml_vs_theory": bml["vs_theory"],
               "theory_ok": bml["vs_theory"] <= TARGET_THEORY,
               "nic_spread": bml["nic_spread"],
               "spread_ok": bml["nic_spread"] <= TARGET_SPREAD, "servers": n}
        if collective == "alltoall":  # the bounds' quotient; the issue sets no target
            row.update(ratio_theory=alltoall_seconds("bcube", nbytes, rate_bps, radices)
                       / alltoall_seconds("fattree", nbytes, rate_bps, radices),
                       ratio_ok=None, theory_ok=None, spread_ok=None,
                       bcube_bound_s=alltoall_seconds("bcube", nbytes, rate_bps, radices),
                       fattree_bound_s=alltoall_seconds("fattree", nbytes, rate_bps, radices))
        out.append(row)
    return out


def _verdict(ok: bool | None) -> str:
    return "—" if ok is None else "ok" if ok else "MISSED"


def write(results: dict, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.csv"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    fields = ["rate", "topology", "shape", "algorithm", "bytes", "reps", "median_s", "min_s",
              "max_s", "theory_s", "vs_theory", "nic_spread", "rank_cpu_s_per_call", "correct",
              "skipped"]
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + ["nic_tx_bytes_per_call"],
                           extrasaction="ignore")
        w.writeheader()
        for row in results["rows"]:
            w.writerow({**row, "nic_tx_bytes_per_call": json.dumps(
                row.get("nic_tx_bytes_per_call", {}))})
    png = out / f"{name}.png"
    plot = subprocess.run([str(mpi.venv_python()), "-m", "perf.testbed.plot", str(paths[0]),
                           str(png)], capture_output=True, text=True, timeout=120,
                          env=mpi.environment(), cwd=mpi.REPO)
    if plot.returncode == 0:
        paths.append(png)
    else:
        print(f"note: no plot ({plot.stderr.strip().splitlines()[-1:] or plot.stdout})",
              file=sys.stderr)
    return paths


def table(results: dict) -> str:
    lines = ["| rate | MiB | topology | algorithm | median s | min–max s | theory s | ×theory | "
             "NIC tx MB/call | NIC spread | rank CPU s/call |", "|" + "---|" * 11]
    for r in results["rows"]:
        mib = f"{r['bytes'] / 2**20:g}"
        if "skipped" in r:
            lines.append(f"| {r['rate']} | {mib} | {r['topology']} {r['shape']} | "
                         f"{r['algorithm']} | skipped | | | | | | |")
            continue
        theory = f"{r['theory_s']:.2f}" if r["theory_s"] else "—"
        vs = f"{r['vs_theory']:.2f}" if r["vs_theory"] else "—"
        nics = " / ".join(f"{v / 1e6:.1f}" for v in r["nic_tx_bytes_per_call"].values())
        spread = f"{r['nic_spread']:.3f}" if r["nic_spread"] else "—"
        cpu = r.get("rank_cpu_s_per_call")
        cpu = f"{cpu:.2f}" if cpu is not None else "—"
        lines.append(f"| {r['rate']} | {mib} | {r['topology']} {r['shape']} | "
                     f"{r['algorithm']} | {r['median_s']:.2f} | "
                     f"{r['min_s']:.2f}–{r['max_s']:.2f} | {theory} | "
                     f"{vs} | {nics} | {spread} | {cpu} |")
    name = results["targets"][0].get("bcube_algorithm", "bml") if results["targets"] else "bml"
    lines += ["", f"| rate | MiB | {name} BCube s | best Fat-Tree | ratio (theory "
              f"{results['targets'][0]['ratio_theory']:.3g}; target ≤ 0.6 for bml) | "
              f"{name} ×theory (≤ 1.25 for bml) | NIC spread (≤ 1.10 for bml) |"
              if results["targets"] else "", "|" + "---|" * 7]
    for t in results["targets"]:
        lines.append(f"| {t['rate']} | {t['bytes'] / 2**20:g} | {t['bml_bcube_s']:.2f} | "
                     f"{t['best_fattree']} "
                     f"{t['best_fattree_s']:.2f} s | {t['ratio']:.3f} "
                     f"{_verdict(t['ratio_ok'])} | {t['bml_vs_theory']:.3f} "
                     f"{_verdict(t['theory_ok'])} | {t['nic_spread']:.3f} "
                     f"{_verdict(t['spread_ok'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.testbed experiment",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="100mbit,200mbit")
    p.add_argument("--shape", default="3x3", help="the BCube; its twin has as many servers")
    p.add_argument("--bytes", type=parse_sizes, default=[32 << 20, 64 << 20],
                   help="allreduce sizes, comma list (default 32M,64M: the sweep's large "
                        "sizes)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--algorithms", default="bml,ring,native,native-ring",
                   help="bmlmpi algorithms, native, native-<MPICH algorithm of the collective>")
    p.add_argument("--collective", choices=("allreduce", "reduce_scatter", "allgather",
                                            "alltoall"),
                   default="allreduce")
    netns.link_options(p)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="bcube_vs_fattree")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("need --reps >= 1")
    mpi.check()
    bcube = build("bcube", args.shape)
    results = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
               "command": " ".join(["python -m perf.testbed experiment",
                                    *(argv if argv is not None else sys.argv[1:])]),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": [], "runs": []}
    # one rank a server: more ranks than cores share the cores (every time says so)
    results["machine"]["oversubscribed"] = bcube.servers > (os.cpu_count() or 1)
    for rate in args.rates.split(","):
        for kind, shape in (("bcube", bcube.shape), ("fattree", str(bcube.servers))):
            print(f"[{time.strftime('%H:%M:%S')}] {kind} {shape} at {rate} ...", flush=True)
            run = run_topology(kind, shape, rate, args)
            results["rows"] += run["rows"]
            results["runs"] += run["runs"]
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["targets"] = judge(results["rows"], bcube.radices, args.collective)
    results["closed"] = all(r["isolation"]["ok"] and r["conservation"]["balanced"]
                            for r in results["runs"])
    for path in write(results, args.out, args.name):
        print(f"wrote {path}")
    print(table(results))
    print(f"every byte on the testbed's own links: {results['closed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
