"""Same results, same numbers? The sweep and the failure soak on two revisions, interleaved.

    python perf/refactor/compare_revisions.py --before 9c3cd0e --after HEAD --ranks 2,4 \
        --rounds 2 --out perf/refactor/results/compare.json

For a change meant to leave behaviour alone (a restructuring): each revision is checked out
into a temporary ``git worktree`` and run from there (``PYTHONPATH`` points the ranks at it),
with this interpreter. Each round runs, for each rank count, ``bmlmpi-bench`` with validation
over every algorithm (``--iterations`` timed iterations per size, default 200)
(``BMLMPI_CALIBRATE=0``, so both sides pick from the same rule), before and after in turn
(the order swaps every round, so drift in the machine's load falls on both);
then ``perf/ft/soak.py`` on each side with the same seed.

It reports, per rank count and collective: whether every row passed validation on each side,
whether ``auto`` chose the same algorithm at every size in every run, and per algorithm the
geometric mean over sizes of its time relative to mpi4py's own call measured in the same run,
after ÷ before, beside the same revision's round-to-round spread (the noise to judge it by).
For the soak: exact trials, and the medians of first detection and recovery. Nothing is
asserted: it writes the comparison (JSON, and Markdown next to it) and exits non-zero only
if a row failed validation, auto's choices differ, or a soak trial was not exact.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True)
    return path


def run(tree: Path, cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree), BMLMPI_CALIBRATE="0")
    print("+", tree.name, " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=tree, env=env, text=True, capture_output=True,
                          timeout=timeout)


def sweep(tree: Path, n: int, collective: str, sizes: str, out: Path, timeout: int,
          iterations: int) -> dict:
    res = run(tree, [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable,
                     "-m", "bmlmpi.cli.bench", "-m", sizes, "-i", str(iterations),
                     "-x", str(max(iterations // 10, 1)), "-c",
                     "--algorithms", "all", "--blocks", "4", "--collective", collective,
                     "--json", str(out), "--no-progress"], timeout)
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-2000:], sep="\n")
        raise SystemExit(f"{tree.name}: bench at {n} ranks exited {res.returncode}")
    return json.loads(out.read_text())  # rows, and the bench's machine block


def soak(tree: Path, trials: int, seed: int, out: Path, timeout: int) -> dict:
    res = run(tree, [sys.executable, "perf/ft/soak.py", "--trials", str(trials), "--seed",
                     str(seed), "--groups", "2", "--group-size", "6", "--out", str(out)],
              timeout)
    if not out.exists():
        print(res.stdout[-2000:], res.stderr[-2000:], sep="\n")
        raise SystemExit(f"{tree.name}: the soak wrote nothing (exit {res.returncode})")
    summary = json.loads(out.read_text())["summary"]
    return {"trials": summary["trials"], "exact": summary["exact"],
            "detect_first_median_s": summary["detect_first_s"].get("median"),
            "recover_median_s": summary["recover_s"].get("median")}


def relative(rows: list[dict]) -> dict[str, float]:
    """Per algorithm: the geometric mean over sizes of its time ÷ native's, same run."""
    native = {r["size"]: r["avg_us"] for r in rows if r["algorithm"] == "native"}
    logs: dict[str, list[float]] = {}
    for r in rows:
        if r["algorithm"] != "native" and native.get(r["size"]):
            logs.setdefault(r["algorithm"], []).append(math.log(r["avg_us"] / native[r["size"]]))
    return {a: math.exp(sum(v) / len(v)) for a, v in logs.items()}


def load() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True)
    p.add_argument("--after", default="HEAD")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--collectives", default="allreduce,allgather,reduce_scatter")
    p.add_argument("--sizes", default="8:1048576")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--soak-trials", type=int, default=40)
    p.add_argument("--soak-seeds", default="11")
    p.add_argument("--iterations", type=int, default=200,
                   help="timed iterations per size (a tenth of them warm-up)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per launch")
    p.add_argument("--out", default=str(ROOT / "perf/refactor/results/compare.json"))
    args = p.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")]
    collectives = args.collectives.split(",")
    sides = ("before", "after")
    tmp = Path(tempfile.mkdtemp(prefix="bmlmpi-compare-"))
    trees = {}
    try:
        trees = {"before": checkout(args.before, tmp), "after": checkout(args.after, tmp)}
        revs = {s: subprocess.run(["git", "-C", str(trees[s]), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
                for s in sides}
        runs: list[dict] = []
        machines: dict[int, dict] = {}
        for rnd in range(args.rounds):
            order = sides if rnd % 2 == 0 else sides[::-1]
            for n in ranks:
                for coll in collectives:
                    for side in order:
                        before_load = load()
                        bench = sweep(trees[side], n, coll, args.sizes,
                                      tmp / f"{side}-{rnd}-{n}-{coll}.json", args.timeout,
                                      args.iterations)
                        rows = bench["rows"]
                        machines.setdefault(n, bench["machine"])
                        runs.append({"side": side, "round": rnd, "ranks": n, "collective": coll,
                                     "load_before": before_load, "load_after": load(),
                                     "passed": all(r["validation"] == "Pass" for r in rows),
                                     "auto": {r["size"]: r.get("chose") for r in rows
                                              if r["algorithm"] == "auto"},
                                     "relative": relative(rows)})
        soaks = []
        for seed in (int(s) for s in args.soak_seeds.split(",")):
            for side in sides:
                soaks.append({"side": side, "seed": seed, "load_before": load(),
                              **soak(trees[side], args.soak_trials, seed,
                                     tmp / f"soak-{side}-{seed}.json", 3 * args.timeout)})
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
        shutil.rmtree(tmp, ignore_errors=True)

    table = []
    same_choices = True
    for n in ranks:
        for coll in collectives:
            mine = [r for r in runs if r["ranks"] == n and r["collective"] == coll]
            choices = {json.dumps(r["auto"], sort_keys=True) for r in mine}
            same_choices &= len(choices) == 1
            for algo in sorted(mine[0]["relative"]):
                def of(side: str, rnd: int, algo: str = algo, mine: list = mine) -> float:
                    return next(r["relative"][algo] for r in mine
                                if r["side"] == side and r["round"] == rnd)
                ratio = [of("after", k) / of("before", k) for k in range(args.rounds)]
                spread = [of(s, k) / of(s, 0) for s in sides for k in range(1, args.rounds)]
                table.append({"ranks": n, "collective": coll, "algorithm": algo,
                              "after_over_before": ratio, "same_side_spread": spread})
    passed = all(r["passed"] for r in runs)
    exact = all(s["exact"] == s["trials"] for s in soaks)
    result = {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version()},
              "bench_machine": machines,
              "revisions": revs, "args": vars(args), "every_row_passed": passed,
              "auto_chose_the_same": same_choices, "soak_all_exact": exact,
              "runs": runs, "table": table, "soaks": soaks}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    lines = [f"# {revs['before']} (before) vs {revs['after']} (after)", "",
             f"Every row passed validation: {passed}. `auto` chose the same at every size in "
             f"every run: {same_choices}. Soak exact on both sides: {exact}.", ""]
    for n, m in sorted(machines.items()):
        lines.append(f"N = {n}: {m['cpu']}, {m['cores']} cores, "
                     f"{'oversubscribed' if m['oversubscribed'] else 'not oversubscribed'}; "
                     f"{m['mpi_library'].split(',')[0]}, mpi4py {m['mpi4py']}, numpy "
                     f"{m['numpy']}, numba {m['numba']}, Python {m['python']}.")
    lines += ["",
              "Per algorithm, the geometric mean over sizes of its time ÷ mpi4py's call (same "
              "run), after ÷ before per round; the same revision's round-to-round spread beside "
              "it.", "", "| N | collective | algorithm | after ÷ before | same-side spread |",
              "|---|---|---|---|---|"]
    lines += [f"| {t['ranks']} | {t['collective']} | {t['algorithm']} | "
              f"{', '.join(f'{x:.2f}' for x in t['after_over_before'])} | "
              f"{', '.join(f'{x:.2f}' for x in t['same_side_spread']) or '-'} |" for t in table]
    lines += ["", "| side | seed | exact | first detection median (ms) | recovery median (ms) "
              "| load |", "|---|---|---|---|---|---|"]
    lines += [f"| {s['side']} | {s['seed']} | {s['exact']}/{s['trials']} | "
              f"{1e3 * (s['detect_first_median_s'] or 0):.1f} | "
              f"{1e3 * (s['recover_median_s'] or 0):.1f} | {s['load_before']:.1f} |"
              for s in soaks]
    lines += ["", "Loads (1-min average) before each sweep: "
              + ", ".join(f"{r['load_before']:.1f}" for r in runs) + "."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if passed and same_choices and exact else 1


if __name__ == "__main__":
    sys.exit(main())
