"""``auto`` against the best of all, one quiet same-run command:

    python -m perf.auto                                  # N = 2 and 4, every collective
    python -m perf.auto --ranks 2 --collectives allreduce --sizes 8,16M --out /tmp/quick

For each rank count, one job (``perf/auto/ranks.py`` under ``bmlmpi-run``) with an empty
calibration cache and tuning table of its own, as a new user's: per collective and size, a
fresh ``auto`` signature's first calls one by one (its exploration), then ``auto`` after its
tuning calls, every algorithm named and mpi4py's own blocking call, interleaved in blocks.
Then, at each rank count, the first call of a job: ``--first-jobs`` fresh jobs of mpi4py's
``Allreduce`` and as many of ``bmlmpi.Communicator(...)`` and its first ``auto`` call
(``perf/auto/first_call.py``), alternated, with an empty cache.

Writes ``auto.json`` (everything, with the load averages before and after each part) and
``auto.md`` (per collective and size: auto's choice and why, auto ÷ the best row, the best
row, auto − mpi4py at the smallest size, the exploration's extra time over the signature's
first 100 calls and until its commit; the first-call table) into ``--out`` (default
``perf/auto/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bmlmpi import config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SIZES = "8,64,1K,16K,64K,256K,1M,4M,16M,64M"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def launch(n: int, args: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable, *args]
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=timeout,
                         env=env)
    if res.returncode != 0:
        raise SystemExit(f"exit {res.returncode} at {n} ranks:\n"
                         f"{(res.stdout + res.stderr)[-3000:]}")
    return res


def fresh_env(folder: Path) -> dict:
    """An empty calibration cache and tuning table, in ``folder``; the kernels numba compiled
    for this installation stay (its cache folder linked in): they are compiled once per
    installation, not per job."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("BMLMPI_ALGORITHM", "BMLMPI_RECALIBRATE", "BMLMPI_CALIBRATE")}
    folder.mkdir(parents=True, exist_ok=True)
    kernels = config.cache_dir() / "numba"
    if kernels.is_dir() and not (folder / "numba").exists():
        (folder / "numba").symlink_to(kernels, target_is_directory=True)
    return {**env, "BMLMPI_CACHE_DIR": str(folder), "BMLMPI_TUNING": str(folder / "t.jsonl"),
            "PYTHONUNBUFFERED": "1"}


def first_jobs(n: int, jobs: int, nbytes: int, base: Path, timeout: int) -> dict:
    got: dict[str, list[float]] = {"mpi4py": [], "bmlmpi": []}
    for i in range(jobs):
        for mode in ("mpi4py", "bmlmpi"):
            env = fresh_env(base / f"first-{n}-{mode}-{i}")
            res = launch(n, [str(HERE / "first_call.py"), mode, str(nbytes)], env, timeout)
            line = next(s for s in res.stdout.splitlines() if s.startswith("FIRST-CALL"))
            got[mode].append(json.loads(line.split(" ", 1)[1])["seconds"])
    return {"bytes": nbytes, **got}


def _size(b: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def extra_first(entry: dict, most: int | None = 100) -> float:
    """The exploration's extra seconds over the signature's first ``most`` calls (None: every
    call recorded, until ten after the commit): those calls less as many of ``auto``'s
    committed time; the later calls are committed ones, which cost that time."""
    times = entry["first"]["times"][:most]
    return sum(times) - len(times) * entry["rows"]["auto"]


def markdown(data: dict) -> str:
    out = [f"# `auto` after its tuning calls against the best of all ({data['started']})", "",
           f"`{data['command']}` on {data['machine']}; main at {data['commit']}. Every time "
           f"is the MAX over ranks, a row's the median of its block means; auto ÷ best "
           f"compares auto with the fastest other row (mpi4py's call included).", ""]
    for n, part in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
        took = f", {part['seconds']:.0f} s" if "seconds" in part else ""
        out += [f"## N = {n} (load before {part['load_before']}, after {part['load_after']}"
                f"{took})", ""]
        for coll in dict.fromkeys(e["collective"] for e in part["results"]):
            out += [f"### {coll}", "",
                    "| size | auto chose (why) | auto us | best (us) | auto / best | "
                    "mpi4py us | exploration extra over 100 calls (ms) | until the commit (ms) | "
                    "committed after |",
                    "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
            for e in (e for e in part["results"] if e["collective"] == coll):
                rows = e["rows"]
                best = min((v, r) for r, v in rows.items() if r != "auto")
                bad = [r for r, ok in e["exact"].items() if not ok]
                flag = f" **not exact: {', '.join(bad)}**" if bad else ""
                out.append(f"| {_size(e['bytes'])} | {e['chosen']} ({e['why']}){flag} | "
                           f"{rows['auto'] * 1e6:.1f} | {best[1]} ({best[0] * 1e6:.1f}) | "
                           f"{rows['auto'] / best[0]:.2f} | {rows['mpi4py'] * 1e6:.1f} | "
                           f"{extra_first(e) * 1e3:.2f} | {extra_first(e, None) * 1e3:.2f} | "
                           f"{e['first']['committed_after']} |")
            small = min((e for e in part["results"] if e["collective"] == coll),
                        key=lambda e: e["bytes"])
            out += ["", f"At {_size(small['bytes'])}: auto − mpi4py = "
                        f"{(small['rows']['auto'] - small['rows']['mpi4py']) * 1e6:.2f} us; "
                        f"the candidates' agreed medians (us): " + ", ".join(
                            f"{c['name']} {c['measured'] * 1e6:.1f}" if c["measured"]
                            else f"{c['name']} -" for c in small["candidates"]), ""]
        first = part.get("first")
        if first:
            m, b = statistics.median(first["mpi4py"]), statistics.median(first["bmlmpi"])
            out += [f"First call of a job ({_size(first['bytes'])} allreduce, empty cache, "
                    f"median of {len(first['mpi4py'])} jobs each): mpi4py {m * 1e3:.2f} ms, "
                    f"bmlmpi (Communicator and its first auto call) {b * 1e3:.2f} ms, "
                    f"difference {(b - m) * 1e3:.2f} ms (each job: mpi4py "
                    + ", ".join(f"{x * 1e3:.2f}" for x in first["mpi4py"]) + "; bmlmpi "
                    + ", ".join(f"{x * 1e3:.2f}" for x in first["bmlmpi"]) + " ms)", ""]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.auto", description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--collectives", default="all")
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--blocks", type=int, default=0,
                    help="blocks of the interleaved rows (0: one per row)")
    ap.add_argument("--first-jobs", type=int, default=3)
    ap.add_argument("--first-bytes", type=int, default=1 << 20)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    data = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m perf.auto " + " ".join(argv if argv is not None
                                                         else sys.argv[1:]),
            "commit": commit, "cores": os.cpu_count(),
            "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.python_version()}",
            "ranks": {}}
    with tempfile.TemporaryDirectory(prefix="bmlmpi-perf-auto-") as tmp:
        for n in (int(x) for x in args.ranks.split(",")):
            before = loadavg()
            started = time.monotonic()
            target = Path(tmp) / f"auto-n{n}.json"
            launch(n, [str(HERE / "ranks.py"), "--collectives", args.collectives, "--sizes",
                       args.sizes, "--blocks", str(args.blocks), "--json", str(target)],
                   fresh_env(Path(tmp) / f"cache-{n}"), args.timeout)
            part = json.loads(target.read_text())
            part["load_before"] = before
            part["sweep_seconds"] = time.monotonic() - started
            if args.first_jobs:
                part["first"] = first_jobs(n, args.first_jobs, args.first_bytes, Path(tmp),
                                           args.timeout)
            part["load_after"] = loadavg()
            part["seconds"] = time.monotonic() - started
            data["ranks"][str(n)] = part
            (out / "auto.json").write_text(json.dumps(data, indent=1))
    (out / "auto.md").write_text(markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
