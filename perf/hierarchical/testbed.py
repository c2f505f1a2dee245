"""Hierarchical allreduce on the emulated testbed with several ranks per server, against flat
BML on every BCube shape of all the ranks and the flat ring.

    sudo python -m perf.hierarchical.testbed --shape 2x2 --per-server 2 \
        --rates 100mbit,200mbit --bytes 32M --reps 5

For each rate the BCube of servers (``--shape``) is built (:mod:`perf.testbed.netns`), each
server's namespace runs ``--per-server`` consecutive ranks that share its NICs
(:func:`perf.testbed.mpi.mpmd_command`; ``BMLMPI_RANKS_PER_NODE`` tells hierarchical the
nodes), one ``perf.testbed.ranks bench`` job times ``hierarchical``, ``bml@<shape>`` for every
ordered factorisation of N = servers × per-server (the shapes flat BML can be given, the one
whose level 0 is the local rank among them) and ``ring``, and the testbed is torn down.

Two ranks of one server talk TCP to their own eth0 address, which the kernel delivers over the
namespace's loopback (MPICH's shared memory is off: ``MPIR_CVAR_NOLOCAL=1``). The check that
this is so: the loopback bytes each server counted per call against the bytes the schedule
sends between ranks of one server (``intra_bytes``), and the NIC bytes against what it sends
between servers (``inter_bytes``, counted once per hop).

Theory, per algorithm (:mod:`bmlmpi.schedules.hierarchical`'s docstring derives all three):
the cost model's price of the very schedules the ranks ran (``bmlmpi.model.price``, every
rank's schedule, link contention) on :class:`bmlmpi.model.TwoTierNetwork` with the BCube of
servers between nodes and intra-node ports taken as infinitely fast (loopback moves GB/s
against the NICs' 100–200 Mbit/s), in T_F = P/R for a P-byte buffer and R-bit/s links:
hierarchical 2(M−1)/(kM)·T_F for M = n^k servers (3/4·T_F on BCube(2,2)); flat BML on the
local-first shape (r, n, …, n) the docstring's T_flat with c_0 = 0, c_l = r (7/6·T_F on 2 ranks
× BCube(2,2)), on other shapes the model alone; flat ring 2(N−1)/N·T_F (7/4·T_F for N = 8).
The links have no added delay, so the α terms are left out.

The intra-node tier is not infinitely fast on this loaded machine: before each size a
``pairs`` job measures it (every rank swaps one local reduce-scatter step's bytes with its
partner, all servers at once) and gives b, the intra-node port as a multiple of a NIC, which
the docstring's formula takes: T_hier = 2(r−1)/(r·b)·T_F + G. Every algorithm is priced both
ways, at b = ∞ and at the measured b.

Judged (printed and saved under "targets"), per rate and size: hierarchical's median ≤ 1.2 ×
its theory, and faster than every flat algorithm by at least the model's margin (measured
speed-up ≥ predicted speed-up, per competitor), at the measured b and at b = ∞.
Saved in ``--out``: ``<name>.json`` (all, with machine and load) and ``<name>.md`` (the tables).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bmlmpi.model import TwoTierNetwork, price
from bmlmpi.schedules.bml import bml_schedules
from bmlmpi.schedules.hierarchical import hierarchical_schedules
from bmlmpi.schedules.ring import ring_schedules
from bmlmpi.topology.nodes import consecutive_nodes
from perf.testbed import counters, mpi, netns
from perf.testbed.check import parse_result
from perf.testbed.experiment import machine_info, parse_sizes
from perf.testbed.topology import build

OUT = Path(__file__).resolve().parent / "results"
TARGET_THEORY = 1.2
#: Intra-node ports in the theory: loopback is some 100× a 200 Mbit/s NIC; this stands for ∞.
LOOPBACK = 10**6


def ordered_factorisations(n: int) -> list[tuple[int, ...]]:
    """Every tuple of radices ≥ 2 whose product is ``n`` (every BCube shape of n ranks)."""
    if n == 1:
        return [()]
    return [(d, *rest) for d in range(2, n + 1) if n % d == 0
            for rest in ordered_factorisations(n // d)]


def schedules(label: str, n: int, count: int, per_server: int) -> list:
    if label == "hierarchical":
        return hierarchical_schedules(n, count, consecutive_nodes(n, per_server))
    if label == "ring":
        return ring_schedules(n, count)
    algorithm, _, shape = label.partition("@")
    if algorithm == "bml" and shape:
        return bml_schedules(n, count, tuple(int(x) for x in shape.split("x")))
    raise ValueError(f"no schedule for {label!r}")


def model(label: str, radices: tuple[int, ...], per_server: int, nbytes: int,
          intra: float | None = None) -> dict:
    """T_F of the schedule on the two-tier network (intra-node ports ``LOOPBACK``, and
    ``intra`` × a NIC as ``t_f_b`` when given), and the bytes it sends per call inside
    servers and over NICs (one count per hop, as the NIC counters see it)."""
    servers = math.prod(radices)
    n = servers * per_server
    count = nbytes // 4
    net = TwoTierNetwork([per_server] * servers, inter=radices, intra=LOOPBACK)
    scheds = schedules(label, n, count, per_server)
    intra_bytes = inter = 0
    for s in scheds:
        for step in s.steps:
            for t in step.sends:
                hops = net.route(s.rank, t.peer, t.level)
                nic_hops = sum(1 for link in hops if link[0] == "up")
                if nic_hops:
                    inter += 4 * t.n * nic_hops
                else:
                    intra_bytes += 4 * t.n
    cost = price(scheds, net)
    out = {"t_f": float(cost.t_f), "steps": cost.nsteps,
           "intra_bytes_per_server": intra_bytes / servers,
           "nic_bytes_per_server": inter / servers}
    if intra is not None:
        measured = TwoTierNetwork([per_server] * servers, inter=radices, intra=intra)
        out["t_f_b"] = float(price(scheds, measured).t_f)
    return out


def labels(n: int) -> list[str]:
    return ["hierarchical", *(f"bml@{'x'.join(map(str, s))}" for s in
                              ordered_factorisations(n)), "ring"]


def run_rate(args: argparse.Namespace, rate: str) -> dict:
    net = build("bcube", args.shape)
    n = net.servers * args.per_server
    algs = labels(n)
    rate_bps = netns.parse_rate(rate)
    rows, runs = [], []
    with netns.testbed("bcube", net.shape, rate, cc=args.cc, mtu=args.mtu):
        for nbytes in args.bytes:
            t_f = nbytes * 8 / rate_bps
            probe = intra_probe(net, args, nbytes // args.per_server, rate_bps)
            b = probe["ratio"] if probe else None
            models = {a: model(a, net.radices, args.per_server, nbytes, b) for a in algs}
            budget = 120 + (args.reps + args.warmup) * sum(m["t_f"] for m in models.values()) \
                * t_f * 3
            before = counters.settled_snapshot()
            t0 = time.monotonic()
            proc = mpi.run(net, ["python", "-m", "perf.testbed.ranks", "bench", "--kind",
                                 "bcube", "--shape", net.shape, "--bytes", str(nbytes),
                                 "--reps", str(args.reps), "--warmup", str(args.warmup),
                                 "--algorithms", ",".join(algs)],
                           timeout=budget, per_server=args.per_server)
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"bcube {net.shape} × {args.per_server} at {rate}: mpiexec "
                                   f"exited {proc.returncode}:\n{proc.stdout[-4000:]}")
            job = counters.delta(before, counters.settled_snapshot())
            runs.append({"rate": rate, "bytes": nbytes, "wall_s": wall, "intra_probe": probe,
                         "conservation": counters.conservation(net, job),
                         "isolation": counters.isolation(net)})
            for res in parse_result(proc.stdout)["results"]:
                rows.append(row(res, models[res["algorithm"]], rate, nbytes, t_f,
                                args.per_server, args.reps))
    return {"rows": rows, "runs": runs}


def intra_probe(net, args: argparse.Namespace, nbytes: int, rate_bps: float) -> dict | None:
    """The intra-node tier's bandwidth as a multiple of a NIC (``b`` of the docstrings):
    every rank swaps ``nbytes`` — what one local reduce-scatter step of hierarchical sends —
    with its partner on the same server, all at once (``perf.testbed.ranks pairs``). Only
    for two ranks a server; None otherwise."""
    if args.per_server != 2:
        return None
    proc = mpi.run(net, ["python", "-m", "perf.testbed.ranks", "pairs", "--kind", "bcube",
                         "--shape", net.shape, "--bytes", str(nbytes), "--reps",
                         str(max(args.reps, 3)), "--warmup", "1"],
                   timeout=300, per_server=2)
    if proc.returncode != 0:
        raise RuntimeError(f"pairs probe exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    res = parse_result(proc.stdout)
    if not res["correct"]:
        raise RuntimeError("pairs probe: a rank received the wrong data")
    median = statistics.median(res["seconds"])
    return {"bytes": nbytes, "seconds": res["seconds"], "bytes_per_s": nbytes / median,
            "ratio": nbytes / median / (rate_bps / 8)}


def row(res: dict, m: dict, rate: str, nbytes: int, t_f: float, per_server: int,
        reps: int) -> dict:
    out = {"rate": rate, "bytes": nbytes, "algorithm": res["algorithm"], **m,
           "theory_s": m["t_f"] * t_f,
           "theory_b_s": m["t_f_b"] * t_f if "t_f_b" in m else None}
    if "skipped" in res:
        return {**out, "skipped": res["skipped"]}
    median = statistics.median(res["seconds"])
    # every rank reports its namespace's counters: take each server once (its first rank)
    servers = range(0, len(res["nics"]), per_server)
    nic = statistics.mean(sum(v["tx_bytes"] for v in res["nics"][s].values()) for s in servers)
    lo = statistics.mean(res["loopback"][s]["tx_bytes"] for s in servers)
    return {**out, "seconds": res["seconds"], "median_s": median, "correct": res["correct"],
            "vs_theory": median / out["theory_s"],
            "vs_theory_b": median / out["theory_b_s"] if out["theory_b_s"] else None,
            "rank_cpu_s_per_call": res["rank_cpu_s_per_call"],
            "measured_nic_bytes_per_server": nic / reps,
            "measured_loopback_bytes_per_server": lo / reps}


def judge(rows: list[dict]) -> list[dict]:
    """Per rate, size and flat competitor: the measured speed-up of hierarchical against the
    model's, and hierarchical against its theory; both with intra-node ports at the measured
    b (``_b``, the targets) and infinitely fast (the NIC-bound limit)."""
    out = []
    for rate, nbytes in sorted({(r["rate"], r["bytes"]) for r in rows}):
        done = {r["algorithm"]: r for r in rows
                if r["rate"] == rate and r["bytes"] == nbytes and "median_s" in r}
        hier = done.get("hierarchical")
        if hier is None:
            continue
        for name, r in done.items():
            if name == "hierarchical":
                continue
            measured = r["median_s"] / hier["median_s"]
            t = {"rate": rate, "bytes": nbytes, "against": name, "measured_speedup": measured,
                 "predicted_speedup": r["t_f"] / hier["t_f"],
                 "hier_vs_theory": hier["vs_theory"]}
            t["margin_ok"] = measured >= t["predicted_speedup"]
            t["theory_ok"] = hier["vs_theory"] <= TARGET_THEORY
            if hier.get("t_f_b"):
                t["predicted_speedup_b"] = r["t_f_b"] / hier["t_f_b"]
                t["margin_ok_b"] = measured >= t["predicted_speedup_b"]
                t["hier_vs_theory_b"] = hier["vs_theory_b"]
                t["theory_ok_b"] = hier["vs_theory_b"] <= TARGET_THEORY
            out.append(t)
    return out


def _ok(flag: bool | None, yes: str = "ok", no: str = "MISSED") -> str:
    return "—" if flag is None else (yes if flag else no)


def markdown(results: dict) -> str:
    a = results["args"]
    lines = [f"BCube {a['shape']} of servers, {a['per_server']} ranks per server "
             f"(consecutive), float32 sum; median of {a['reps']} calls after {a['warmup']} "
             f"warm-up; load average {results['machine']['loadavg_start']} → "
             f"{results['machine']['loadavg_end']} (2 shared cores).", ""]
    for run in results["runs"]:
        p = run.get("intra_probe")
        if p:
            lines.append(f"* intra-node tier at {run['rate']}, {run['bytes'] >> 20} MiB calls: "
                         f"pairs swap {p['bytes'] >> 20} MiB in "
                         f"{statistics.median(p['seconds']):.3f} s = "
                         f"{p['bytes_per_s'] / 1e6:.0f} MB/s, b = {p['ratio']:.1f} × a NIC")
    lines += ["", "| rate | MiB | algorithm | median s | theory s (b=∞) | ×theory | theory s "
              "(measured b) | ×theory | model T_F (b=∞) | steps | NIC MB/server/call (model) | "
              "loopback MB/server/call (model intra) | correct |", "|" + "---|" * 13]
    for r in results["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['rate']} | {r['bytes'] >> 20} | {r['algorithm']} | skipped: "
                         f"{r['skipped']} |" + " |" * 9)
            continue
        tb = f"{r['theory_b_s']:.2f} | {r['vs_theory_b']:.2f}" if r["theory_b_s"] else "— | —"
        lines.append(
            f"| {r['rate']} | {r['bytes'] >> 20} | {r['algorithm']} | {r['median_s']:.2f} | "
            f"{r['theory_s']:.2f} | {r['vs_theory']:.2f} | {tb} | {r['t_f']:.3f} | "
            f"{r['steps']} | {r['measured_nic_bytes_per_server'] / 1e6:.1f} "
            f"({r['nic_bytes_per_server'] / 1e6:.1f}) | "
            f"{r['measured_loopback_bytes_per_server'] / 1e6:.1f} "
            f"({r['intra_bytes_per_server'] / 1e6:.1f}) | {r['correct']} |")
    lines += ["", "| rate | MiB | against | measured speed-up | model (measured b) | met | "
              f"model (b=∞) | met | hierarchical ×theory, measured b (≤ {TARGET_THEORY}) | "
              "×theory, b=∞ |", "|" + "---|" * 10]
    for t in results["targets"]:
        pb = t.get("predicted_speedup_b")
        cells = [t["rate"], t["bytes"] >> 20, t["against"], f"{t['measured_speedup']:.2f}",
                 "—" if pb is None else f"{pb:.2f}", _ok(t.get("margin_ok_b"), "yes", "NO"),
                 f"{t['predicted_speedup']:.2f}", _ok(t["margin_ok"], "yes", "NO"),
                 ("—" if pb is None else f"{t['hier_vs_theory_b']:.2f} ")
                 + _ok(t.get("theory_ok_b")),
                 f"{t['hier_vs_theory']:.2f} {_ok(t['theory_ok'])}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.hierarchical.testbed",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="2x2", help="the BCube of servers")
    p.add_argument("--per-server", type=int, default=2)
    p.add_argument("--rates", default="100mbit,200mbit")
    p.add_argument("--bytes", type=parse_sizes, default=[32 << 20])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    netns.link_options(p)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--name", default=None, help="default: bcube<shape>_x<per-server>")
    args = p.parse_args(argv)
    if args.reps < 1 or args.per_server < 1:
        p.error("need --reps >= 1 and --per-server >= 1")
    mpi.check()
    results = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": [], "runs": []}
    results["args"]["per_server"] = args.per_server
    for rate in args.rates.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] bcube {args.shape} × {args.per_server} at "
              f"{rate} ...", flush=True)
        got = run_rate(args, rate)
        results["rows"] += got["rows"]
        results["runs"] += got["runs"]
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["targets"] = judge(results["rows"])
    results["closed"] = all(r["isolation"]["ok"] and r["conservation"]["balanced"]
                            for r in results["runs"])
    name = args.name or f"bcube{args.shape}_x{args.per_server}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results) + f"\n\nevery byte on the testbed's own links: {results['closed']}\n"
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
