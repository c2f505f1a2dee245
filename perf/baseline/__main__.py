"""The same-run table: C ``MPI_Allreduce``, mpi4py ``comm.Allreduce`` and bmlmpi, one command.

    python -m perf.baseline                       # N = 2, 4, 9; 8 B - 64 MiB
    python -m perf.baseline --ranks 2 --max 1048576 --out /tmp/quick

For each rank count: the C loop (``allreduce_loop.c``, built with the MPI wheel's ``mpicc``;
skipped with its reason where none is found), then the sweep (``bmlmpi.cli.bench``) with the rows
``native`` (mpi4py's blocking ``comm.Allreduce`` on COMM_WORLD), ``passthrough`` (bmlmpi's
algorithm ``native``), ``auto`` and every schedule, interleaved in blocks at each size, then
the C loop again; at N = 2 also the memory floor of a 64 MiB allreduce (``memfloor.py``). Every
number in the table is a median of block means (the C loop, which cannot be interleaved with
the Python rows: the lower of its two runs' medians, one before and one after them; both are
in the CSV). Small sizes (<= 8 KiB) take OSU's 1000 iterations (100 warm-up;
``--small-iters``), larger ones ``--large-iters`` (3 warm-up). The load average is recorded
at the start and the end; ``auto`` calibrates afresh into a private cache.

``--collectives`` adds the rest of the family (``reduce_scatter,allgather,reduce,bcast``, or
``all``; default none): at each rank count, after the allreduce rows, one sweep per collective
(``bmlmpi.cli.bench --collective``) with its ``native`` row mpi4py's own blocking call
(``comm.Reduce_scatter_block``, ``comm.Allgather``, ``comm.Reduce``, ``comm.Bcast``), its
``passthrough``, ``auto`` and every algorithm the collective lists, interleaved likewise; a
table per collective and its targets follow the allreduce's.

Writes ``same-run.json`` (everything, machine and versions included), ``same-run.csv`` (one
row per rank count, size and row) and ``same-run.md`` (the tables and the issue's targets).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import cref

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ROWS = ["native", "passthrough", "auto", "bml", "ring", "tree", "multitree", "shm"]
SCHEDULES = ["bml", "ring", "tree", "multitree", "shm"]
SMALL_MAX = 8192


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


FAMILY = ("reduce_scatter", "allgather", "reduce", "bcast")


def bench(n: int, lo: int, hi: int, out: Path, extra: list[str], blocks: int, timeout: int,
          env: dict, rows: list[str] | None = None) -> dict:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable, "-m",
           "bmlmpi.cli.bench", "-m", f"{lo}:{hi}", "-f", "-c", "--algorithms",
           ",".join(rows or ROWS),
           "--blocks", str(blocks), "--json", str(out), "--no-progress",
           "--expect-size", str(n), *extra]
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=timeout,
                         env=env)
    (out.with_suffix(".txt")).write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"bench failed at {n} ranks (exit {res.returncode}):\n"
                         f"{(res.stdout + res.stderr)[-3000:]}")
    return json.loads(out.read_text())


def c_loop(binary: Path | None, n: int, args: argparse.Namespace, out: Path) -> list[dict]:
    if binary is None:
        return []
    text, rows = cref.run(binary, n, args.min, args.max, args.small_iters,
                          max(args.small_iters // 10, 1), args.large_iters, 3, args.blocks,
                          timeout=args.timeout)
    out.write_text(text)
    print(text, flush=True)
    return rows


def measure(args: argparse.Namespace, out: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cache = out / "calib-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env["BMLMPI_CACHE_DIR"] = str(cache)
    env.pop("BMLMPI_RECALIBRATE", None)
    data: dict = {"argv": sys.argv, "loadavg_start": loadavg(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": {}}
    try:
        binary: Path | None = cref.build(out / "bin")
        data["c_loop"] = f"built with {cref.find_mpicc()}"
    except cref.NoCompiler as exc:
        binary = None
        data["c_loop"] = f"skipped: {exc}"
        print(f"C loop {data['c_loop']}", flush=True)
    for n in args.ranks:
        run: dict = {"loadavg_start": loadavg()}
        run["c_before"] = c_loop(binary, n, args, out / f"c-n{n}-before.txt")
        rows, machine = [], None
        if args.min <= SMALL_MAX:
            got = bench(n, args.min, min(SMALL_MAX, args.max), out / f"bench-n{n}-small.json",
                        ["-i", str(args.small_iters), "-x", str(max(args.small_iters // 10, 1))],
                        args.blocks, args.timeout, env)
            rows += got["rows"]
            machine = got["machine"]
        if args.max > SMALL_MAX:
            got = bench(n, max(2 * SMALL_MAX, args.min), args.max,
                        out / f"bench-n{n}-large.json",
                        ["-i", str(args.large_iters), "-x", "3"], args.blocks, args.timeout, env)
            rows += got["rows"]
            machine = got["machine"]
        for coll in args.collectives:
            run.setdefault("family", {})[coll] = family_rows(n, coll, args, out, env)
        run["c_after"] = c_loop(binary, n, args, out / f"c-n{n}-after.txt")
        run["rows"], run["machine"] = rows, machine
        if n == 2 and args.max >= args.floor_bytes:
            cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", "2", sys.executable,
                   str(HERE / "memfloor.py"), "--bytes", str(args.floor_bytes), "--json",
                   str(out / "memfloor-n2.json")]
            res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True,
                                 timeout=args.timeout)
            print(res.stdout, res.stderr[-2000:], flush=True)
            if res.returncode == 0:
                data["memfloor"] = json.loads((out / "memfloor-n2.json").read_text())
        run["loadavg_end"] = loadavg()
        data["runs"][str(n)] = run
        # saved after every rank count, so an interrupted run keeps what it measured
        (out / "same-run.json").write_text(json.dumps({**data, "finished": "(running)",
                                                       "loadavg_end": loadavg()}, indent=1))
    data["loadavg_end"] = loadavg()
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return data


def family_rows(n: int, collective: str, args: argparse.Namespace, out: Path,
                env: dict) -> list[dict]:
    """The sweep of one collective of the family at ``n`` ranks (every algorithm it lists,
    ``passthrough`` and mpi4py's own call), small and large sizes as the allreduce's."""
    rows = []
    common = ["--collective", collective]
    if args.min <= SMALL_MAX:
        rows += bench(n, args.min, min(SMALL_MAX, args.max),
                      out / f"bench-n{n}-{collective}-small.json",
                      [*common, "-i", str(args.small_iters),
                       "-x", str(max(args.small_iters // 10, 1))],
                      args.blocks, args.timeout, env, ["all"])["rows"]
    if args.max > SMALL_MAX:
        rows += bench(n, max(2 * SMALL_MAX, args.min), args.max,
                      out / f"bench-n{n}-{collective}-large.json",
                      [*common, "-i", str(args.large_iters), "-x", "3"], args.blocks,
                      args.timeout, env, ["all"])["rows"]
    return rows


def family_markdown(data: dict) -> list[str]:
    """A table per collective of the family and rank count, then the issue's targets: for
    reduce-scatter and allgather the best schedule ≥ 1.0× native's speed from 1 MiB and
    ≥ 1.5× at 16–64 MiB; for every collective auto ≤ 1.05× the best of all from 64 KiB."""
    lines, checks = [], []
    for n_text, run in sorted(data["runs"].items(), key=lambda kv: int(kv[0])):
        for coll, rows in run.get("family", {}).items():
            cells: dict[int, dict[str, float]] = {}
            for r in rows:
                cells.setdefault(r["size"], {})[r["algorithm"]] = r["median_block_us"]
            names = list(dict.fromkeys(r["algorithm"] for r in rows))
            scheds = [a for a in names if a not in ("native", "passthrough", "auto")]
            lines += [f"## {coll}, N = {n_text}", "",
                      "| size | " + " | ".join(names) + " | native / best schedule | "
                      "auto / best of all |",
                      "|---:|" + "---:|" * (len(names) + 2)]
            for size in sorted(cells):
                c = cells[size]
                best_sched = min((c[a] for a in scheds if a in c), default=None)
                best_all = min(c[a] for a in ("native", *scheds) if a in c)
                lines.append(f"| {_size(size)} | " + " | ".join(_us(c.get(a)) for a in names)
                             + f" | {c['native'] / best_sched if best_sched else float('nan'):.2f}"
                             f" | {c['auto'] / best_all:.2f} |")
                if size >= 64 << 10:
                    ok = c["auto"] <= 1.05 * best_all
                    checks.append(f"- {coll}, N = {n_text}, {_size(size)}: auto / best of all "
                                  f"{c['auto'] / best_all:.2f} — "
                                  f"{'met' if ok else '**missed**'} (≤ 1.05).")
                if coll in ("reduce_scatter", "allgather") and size >= 1 << 20:
                    need = 1.5 if 16 << 20 <= size <= 64 << 20 else 1.0
                    speed = c["native"] / best_sched if best_sched else 0.0
                    checks.append(f"- {coll}, N = {n_text}, {_size(size)}: best schedule at "
                                  f"{speed:.2f}× native's speed (target ≥ {need}) — "
                                  f"{'met' if speed >= need else '**missed**'}.")
            lines.append("")
    if checks:
        lines += ["## The family's targets in this run", "", *checks, ""]
    return lines


def assemble(out: Path, ranks: list[int]) -> dict:
    """The run's data rebuilt from the files each step saved (``bench-n*-*.json``,
    ``c-n*-*.txt``, ``memfloor-n2.json``, the family's ``bench-n*-COLLECTIVE-*.json``): for a
    run that was interrupted before it wrote
    ``same-run.json``. Load averages come from the sweep's own machine records."""
    data: dict = {"argv": ["(assembled from saved files)"], "runs": {}}
    for n in ranks:
        parts = [json.loads(f.read_text()) for f in
                 (out / f"bench-n{n}-small.json", out / f"bench-n{n}-large.json") if f.exists()]
        if not parts:
            continue
        run = {"rows": [r for p_ in parts for r in p_["rows"]], "machine": parts[-1]["machine"],
               "loadavg_start": parts[0]["machine"].get("loadavg_start", "?"),
               "loadavg_end": parts[-1]["machine"].get("loadavg_end", "?")}
        for coll in FAMILY:
            saved = [json.loads(f.read_text()) for f in (out / f"bench-n{n}-{coll}-small.json",
                                                         out / f"bench-n{n}-{coll}-large.json")
                     if f.exists()]
            if saved:
                run.setdefault("family", {})[coll] = [r for p_ in saved for r in p_["rows"]]
        for when in ("before", "after"):
            f = out / f"c-n{n}-{when}.txt"
            run[f"c_{when}"] = cref.parse(f.read_text()) if f.exists() else []
        data["runs"][str(n)] = run
    first, last = data["runs"][str(min(map(int, data["runs"])))], \
        data["runs"][str(max(map(int, data["runs"])))]
    data.update(started=first["machine"]["date"], finished=last["machine"]["date"],
                loadavg_start=first["loadavg_start"], loadavg_end=last["loadavg_end"],
                c_loop="built with the MPI wheel's mpicc" if first["c_before"] else "skipped")
    if (out / "memfloor-n2.json").exists():
        data["memfloor"] = json.loads((out / "memfloor-n2.json").read_text())
    return data


def table(data: dict) -> tuple[list[dict], dict[int, dict[int, dict[str, float]]]]:
    """(CSV rows, {N: {size: {row: median µs}}}), with ``C`` for the C loop."""
    flat, grid = [], {}
    for n_text, run in data["runs"].items():
        n = int(n_text)
        cells: dict[int, dict[str, float]] = {}
        for r in run["rows"]:
            cells.setdefault(r["size"], {})[r["algorithm"]] = r["median_block_us"]
            if r["algorithm"] == "auto":
                cells[r["size"]]["auto chose"] = r.get("chose", "?")
            flat.append({"ranks": n, "size": r["size"], "row": r["algorithm"],
                         "call": r.get("call", ""), "median_us": r["median_block_us"],
                         "avg_us": r["avg_us"], "chose": r.get("chose", "")})
        c_runs = {k: {c["size"]: c for c in run.get(k, [])} for k in ("c_before", "c_after")}
        for size in cells:
            got = [c[size]["median_block_us"] for c in c_runs.values() if size in c]
            if got:
                # the less disturbed of the two runs: load only ever adds time
                cells[size]["C"] = min(got)
            for k, c in c_runs.items():
                if size in c:
                    flat.append({"ranks": n, "size": size, "row": f"C loop ({k[2:]})",
                                 "call": "C MPI_Allreduce (perf/baseline/allreduce_loop.c)",
                                 "median_us": c[size]["median_block_us"],
                                 "avg_us": c[size]["avg_us"], "chose": ""})
        grid[n] = cells
    return flat, grid


def _size(b: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b // div} {unit}"
    return f"{b} B"


def _us(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def markdown(data: dict) -> str:
    _, grid = table(data)
    first = next(iter(data["runs"].values()))["machine"] or {}
    lines = ["# Same-run table: C MPI_Allreduce, mpi4py comm.Allreduce, bmlmpi", "",
             "Generated by `python -m perf.baseline` (perf/baseline/README.md). Times in µs, "
             "median of block means; `native` is mpi4py's blocking `comm.Allreduce` on the "
             "user's communicator, `passthrough` is bmlmpi's algorithm `native` (its "
             "`MPI_Iallreduce` on its duplicate, polled), C is `allreduce_loop.c` "
             f"({data.get('c_loop', '')}).", "",
             f"Machine: {first.get('host', '?')}, {first.get('cpu', '?')}, "
             f"{first.get('cores', '?')} cores; {first.get('mpi_library', '?')}; mpi4py "
             f"{first.get('mpi4py', '?')}, numpy {first.get('numpy', '?')}, numba "
             f"{first.get('numba', '?')}, Python {first.get('python', '?')}, bmlmpi "
             f"{first.get('bmlmpi', '?')}. Run {data['started']} – {data['finished']}; load "
             f"average (1, 5, 15 min) {data['loadavg_start']} at the start, "
             f"{data['loadavg_end']} at the end.", ""]
    for n, cells in sorted(grid.items()):
        run = data["runs"][str(n)]
        m = run["machine"] or {}
        over = m.get("oversubscribed")
        lines += [f"## N = {n}" + (" (oversubscribed)" if over else " (not oversubscribed)"),
                  "", f"{n} ranks on {m.get('cores', '?')} cores; load average "
                  f"{run['loadavg_start']} before, {run['loadavg_end']} after.", "",
                  "| size | C loop | native (mpi4py) | passthrough | auto | auto chose | "
                  "bml | ring | tree | multitree | shm | native / best schedule | "
                  "auto / best of all |",
                  "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for size in sorted(cells):
            c = cells[size]
            best_sched = min(c[s] for s in SCHEDULES if s in c)
            best_all = min(c[k] for k in ("native", *SCHEDULES) if k in c)
            lines.append("| " + " | ".join([
                _size(size), _us(c.get("C")), _us(c.get("native")), _us(c.get("passthrough")),
                _us(c.get("auto")), str(c.get("auto chose", "")),
                *(_us(c.get(s)) for s in SCHEDULES),
                f"{c['native'] / best_sched:.2f}", f"{c['auto'] / best_all:.2f}"]) + " |")
        lines.append("")
    lines += targets(data, grid)
    lines += ["", *family_markdown(data)]
    return "\n".join(lines) + "\n"


def targets(data: dict, grid: dict[int, dict[int, dict[str, float]]]) -> list[str]:
    """The issue's benchmark targets, each checked against this run."""
    out = ["## The issue's targets in this run", ""]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    for n, cells in sorted(grid.items()):
        if 8 in cells:
            c = cells[8]
            out.append(f"- N = {n}, 8 B: auto {_us(c['auto'])} µs against native "
                       f"{_us(c['native'])} µs + 1 — {verdict(c['auto'] <= c['native'] + 1)}"
                       f" (passthrough {_us(c['passthrough'])} µs, C {_us(c.get('C'))} µs).")
        def best(c: dict[str, float]) -> float:
            return min(c[k] for k in ("native", *SCHEDULES) if k in c)

        worst = max(cells, key=lambda s: cells[s]["auto"] / best(cells[s]))
        w = cells[worst]["auto"] / best(cells[worst])
        big = [s for s in cells if s >= 64 << 10]
        worst_big = max((cells[s]["auto"] / best(cells[s]) for s in big), default=0.0)
        out.append(f"- N = {n}: worst auto / best (native included) {w:.2f} at {_size(worst)}"
                   f" — {verdict(w <= 1.05)} (≤ 1.05); from 64 KiB {worst_big:.2f}.")
    if 2 in grid:
        cells = grid[2]
        for size, need in ((64 << 10, 0.7), *((s, 1.0) for s in sorted(cells) if s >= 1 << 20)):
            if size in cells:
                c = cells[size]
                speed = c["native"] / min(c["bml"], c["ring"])
                out.append(f"- N = 2, {_size(size)}: best of bml/ring runs at {speed:.2f}× "
                           f"native's speed (target ≥ {need}) — {verdict(speed >= need)}.")
        f = data.get("memfloor")
        if f and f["bytes"] in cells:
            c = cells[f["bytes"]]
            best = min(c["bml"], c["ring"])
            out.append(
                f"- N = 2, {_size(f['bytes'])} memory floor: each rank must read "
                f"{f['read_bytes_per_rank'] / 2**20:.0f} MiB and write "
                f"{f['written_bytes_per_rank'] / 2**20:.0f} MiB (reduce its half from both "
                f"ranks' inputs, copy the other half back); measured with both ranks at once: "
                f"add {f['add_GBps']:.1f} GB/s, copy {f['copy_GBps']:.1f} GB/s → floor "
                f"{f['floor_us'] / 1000:.2f} ms. Best of bml/ring {best / 1000:.2f} ms = "
                f"{best / f['floor_us']:.2f}× the floor (target ≤ 1.3) — "
                f"{verdict(best <= 1.3 * f['floor_us'])}; native "
                f"{c['native'] / f['floor_us']:.2f}×, C loop "
                f"{c['C'] / f['floor_us']:.2f}×." if "C" in c else
                f"- N = 2 memory floor {f['floor_us'] / 1000:.2f} ms; best of bml/ring "
                f"{best / f['floor_us']:.2f}× it.")
    out += shm_targets(data, grid)
    return out


def shm_targets(data: dict, grid: dict[int, dict[int, dict[str, float]]]) -> list[str]:
    """Issue 27's targets for the shared-memory allreduce, checked against this run."""
    out = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    for n, lowest in ((2, 1.0), (4, 0.9)):
        cells = grid.get(n, {})
        big = [s for s in sorted(cells) if s >= 64 << 10 and "shm" in cells[s]]
        if not big:
            continue
        speeds = {s: cells[s]["native"] / cells[s]["shm"] for s in big}
        worst = min(speeds, key=speeds.__getitem__)
        out.append(f"- N = {n}, shm from 64 KiB: slowest {speeds[worst]:.2f}× mpi4py's speed "
                   f"at {_size(worst)} (target ≥ {lowest}) — "
                   f"{verdict(speeds[worst] >= lowest)}; " + ", ".join(
                       f"{_size(s)} {v:.2f}×" for s, v in speeds.items()) + ".")
        if n == 2:
            mid = [s for s in big if (1 << 20) <= s <= (4 << 20)]
            if mid:
                low = min(speeds[s] for s in mid)
                out.append(f"- N = 2, shm at 1–4 MiB: slowest {low:.2f}× mpi4py's speed "
                           f"(target ≥ 1.5) — {verdict(low >= 1.5)}.")
            f = data.get("memfloor")
            if f and f["bytes"] in cells and "shm" in cells[f["bytes"]]:
                ratio = cells[f["bytes"]]["shm"] / f["floor_us"]
                out.append(f"- N = 2, shm at {_size(f['bytes'])}: "
                           f"{cells[f['bytes']]['shm'] / 1000:.2f} ms = {ratio:.2f}× the memory "
                           f"floor measured in this run (target ≤ 1.3) — {verdict(ratio <= 1.3)}.")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.baseline",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,9")
    p.add_argument("--min", type=int, default=8)
    p.add_argument("--max", type=int, default=64 << 20)
    p.add_argument("--small-iters", type=int, default=1000,
                   help="iterations up to 8 KiB (OSU's 1000; a tenth as warm-up)")
    p.add_argument("--large-iters", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--floor-bytes", type=int, default=64 << 20)
    p.add_argument("--collectives", default="",
                   help="the family's collectives to add (comma list of reduce_scatter, "
                        "allgather, reduce, bcast, or 'all'; default none)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per launched run")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--summarise-only", action="store_true",
                   help="rebuild the CSV and markdown from same-run.json")
    p.add_argument("--assemble", action="store_true",
                   help="rebuild same-run.json from the per-step files of an interrupted run")
    args = p.parse_args(argv)
    args.ranks = [int(x) for x in args.ranks.split(",")]
    args.collectives = list(FAMILY) if args.collectives == "all" else [
        c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in args.collectives if c not in FAMILY]
    if bad:
        p.error(f"unknown collectives {bad}; the family: {', '.join(FAMILY)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.assemble:
        data = assemble(out, args.ranks)
        (out / "same-run.json").write_text(json.dumps(data, indent=1))
    elif args.summarise_only:
        data = json.loads((out / "same-run.json").read_text())
    else:
        data = measure(args, out)
        (out / "same-run.json").write_text(json.dumps(data, indent=1))
        shutil.rmtree(out / "bin", ignore_errors=True)
        shutil.rmtree(out / "calib-cache", ignore_errors=True)
    flat, _ = table(data)
    with open(out / "same-run.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(flat[0]))
        w.writeheader()
        w.writerows(flat)
    (out / "same-run.md").write_text(markdown(data))
    print((out / "same-run.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
