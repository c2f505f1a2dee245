"""The same-run comparison of the reproducible allreduce with the non-reproducible calls:
N = 2 and 4, float32 and float64, 64 KiB-64 MiB per rank.

    python perf/reproducible/compare.py [--ranks 2,4] [--write perf/reproducible/results]

Launches :mod:`perf.reproducible.collective` (``--compare``) under ``bmlmpi-run -n N`` for each
rank count: mpi4py's own ``comm.Allreduce`` of the values, bmlmpi's plain allreduce by each
algorithm and the reproducible allreduce by each algorithm take turns in every block of
every size (the median call of a block, then the median over the blocks). Prints, per rank
count and dtype, the best plain schedule, the best reproducible one, their ratio, the
reproducible call's ratio to mpi4py's, and every reproducible algorithm's ratio to the best
plain schedule; with ``--write``, the rows as JSON and the tables as Markdown, with the
machine, the versions and the load average before and after each launch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = "perf/reproducible/collective.py"


def launch(n: int, args: list[str], timeout: int) -> list[dict]:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable, PROGRAM,
           *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env=env)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr)[-3000:]
        raise SystemExit(f"{n} ranks failed ({res.returncode}):\n{tail}")
    return [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
            if line.startswith("REPRO-JSON ")]


def human(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def tables(rows: list[dict]) -> str:
    """The Markdown tables of one run's rows."""
    out = []
    keys = sorted({(r["ranks"], r["dtype"]) for r in rows})
    for ranks, dtype in keys:
        mine = [r for r in rows if r["ranks"] == ranks and r["dtype"] == dtype]
        algorithms = sorted({r["row"].split()[1] for r in mine
                             if r["row"].startswith("reproducible")},
                            key=lambda a: ("bml ring tree multitree shm native".split()
                                           .index(a)))
        out.append(f"\n### N = {ranks}, {dtype}\n")
        head = ("| size | mpi4py ms | best plain | ms | best reproducible | ms | "
                "repro/plain | repro/mpi4py | " + " | ".join(algorithms) + " | valid | load |")
        out.append(head)
        out.append("|" + " --- |" * (head.count("|") - 1))
        for nbytes in sorted({r["bytes"] for r in mine}):
            at = {r["row"]: r for r in mine if r["bytes"] == nbytes}
            plain = min((r for k, r in at.items() if k.startswith("plain")),
                        key=lambda r: r["ms"])
            repro = min((r for k, r in at.items() if k.startswith("reproducible")),
                        key=lambda r: r["ms"])
            mpi = at["mpi4py"]["ms"]
            each = " | ".join(f"{at['reproducible ' + a]['ms'] / plain['ms']:.2f}"
                              for a in algorithms)
            valid = all(r["valid"] for r in at.values())
            load = max(r["load"] for r in at.values())
            out.append(f"| {human(nbytes)} | {mpi:.3f} | {plain['row'].split()[1]} | "
                       f"{plain['ms']:.3f} | {repro['row'].split()[1]} | {repro['ms']:.3f} | "
                       f"{repro['ms'] / plain['ms']:.2f} | {repro['ms'] / mpi:.2f} | {each} | "
                       f"{'yes' if valid else 'NO'} | {load:.1f} |")
    return "\n".join(out)


def versions() -> str:
    """The versions the rows were measured with. MPI's is read without initialising MPI
    here (the standard allows it before MPI_Init): this driver would be a singleton, whose
    shared-memory segment Open MPI 5 leaves in /dev/shm at exit."""
    import mpi4py
    import numba
    import numpy
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    return (f"Python {platform.python_version()}, numpy {numpy.__version__}, numba "
            f"{numba.__version__}, mpi4py {mpi4py.__version__}, "
            f"{MPI.Get_library_version().splitlines()[0].strip()}; {platform.machine()}, "
            f"{os.cpu_count()} CPUs")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--scale", type=int, default=64)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per launch")
    parser.add_argument("--write", default=None, help="folder for compare.json and compare.md")
    args = parser.parse_args(argv)
    rows, loads = [], []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for n in (int(x) for x in args.ranks.split(",")):
        before = os.getloadavg()[0]
        got = launch(n, ["--sizes", args.sizes, "--dtypes", args.dtypes, "--blocks",
                         str(args.blocks), "--scale", str(args.scale)], args.timeout)
        loads.append((n, before, os.getloadavg()[0]))
        rows += got
    text = tables(rows)
    head = (f"# {started}; {versions()}\n# load average (1 min) before/after each launch: "
            + ", ".join(f"N = {n}: {b:.1f}/{a:.1f}" for n, b, a in loads))
    print(head)
    print(text)
    if args.write:
        folder = Path(args.write)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "compare.json").write_text(json.dumps(
            {"started": started, "versions": versions(), "loads": loads, "rows": rows},
            indent=1))
        (folder / "compare.md").write_text(head + "\n" + text + "\n")


if __name__ == "__main__":
    main()
