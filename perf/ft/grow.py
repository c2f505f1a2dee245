"""Time from a rank's death to the full BCube again: detect, shrink, finish the call on the
recovery schedule, spawn the replacement, rebuild, hand over the state.

    python perf/ft/grow.py --launches 2 --out perf/ft/results/grow.json

Each launch is ``bmlmpi-run --ft -n 9 python tests/ft/grow_ranks.py SPEC`` on BCube(3,2)
(``topology="3x3"``, bml, 65,536 float64 by default): ``--kills`` ranks die one after another
(SIGKILL at a schedule step of every other call; a replacement may die again), and after each
such call the survivors call ``replace_failed`` with the parameters as state. Per failure,
from the victim's ``time.time()`` just before SIGKILL (one host, one clock):

* detected: the first survivor noticed it (``RecoveryRecord.noticed``);
* shrunk: the last survivor's shrunk communicator exists;
* call done: the last survivor committed the failed call (re-run on the BCube-preserving
  recovery schedule, whose first use per dead set includes building it);
* spawned / rebuilt / full: ``replace_failed``'s phases on the last survivor (``GrowRecord``),
  full = the job is on the full BCube again with the state handed over;
* grow: ``replace_failed`` alone (full − started), the slowest survivor.

Every launch is also checked: all 9 final processes exact in every call, same parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch(spec: dict, timeout: float) -> list[dict]:
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", "9", sys.executable,
           "tests/ft/grow_ranks.py", json.dumps(spec)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env=env)
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith("GROW-JSON ")]
    finals = [r for r in records if "results" in r]
    ok = (len(finals) == 9 and not any("error" in r for r in records)
          and all(x["exact"] for f in finals for x in f["results"])
          and len({f["params"] for f in finals}) == 1 and all(f["size"] == 9 for f in finals))
    if not ok:
        raise SystemExit(f"launch failed its checks:\n{(res.stdout + res.stderr)[-4000:]}")
    return records


def first(records):
    return min(records, key=lambda g: g.get("noticed", g.get("started")), default=None)


def failures(records: list[dict]) -> list[dict]:
    """One row per kill, from the records of the processes alive at the end."""
    finals = [r for r in records if "results" in r]
    rows = []
    for v in (r for r in records if "victim" in r):
        kill = v["at"]
        survivors = [f for f in finals if any(x["call"] == v["call"] for x in f["results"])]
        # a rank may die twice (its replacement dies again): take each survivor's first
        # record after this kill
        recs = [first(g for g in f["recoveries"] if v["victim"] in g["lost"]
                      and g["noticed"] >= kill - 0.01) for f in survivors]
        grows = [first(g for g in f["regrowths"] if v["victim"] in g["replaced"]
                       and not g["joined"] and g["started"] >= kill) for f in survivors]
        recs = [g for g in recs if g is not None]
        grows = [g for g in grows if g is not None]
        done = [x["committed"] for f in survivors for x in f["results"]
                if x["call"] == v["call"]]
        rows.append({
            "victim": v["victim"], "call": v["call"],
            "detected": min(g["noticed"] for g in recs) - kill,
            "shrunk": max(g["shrunk"] for g in recs) - kill,
            "call_done": max(done) - kill,
            "spawned": max(g["spawned"] for g in grows) - kill,
            "rebuilt": max(g["rebuilt"] for g in grows) - kill,
            "full": max(g["done"] for g in grows) - kill,
            "grow": max(g["done"] - g["started"] for g in grows),
        })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--kills", type=int, default=3, help="failures per launch")
    ap.add_argument("--count", type=int, default=65_536)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    started = time.time()
    load = os.getloadavg()
    for _ in range(args.launches):
        kills = [{"call": 1 + 2 * i, "rank": rng.randrange(9), "step": rng.randrange(4)}
                 for i in range(args.kills)]
        spec = {"timeout": 120, "hang_timeout": 30, "topology": "3x3", "count": args.count,
                "calls": 2 * args.kills + 2, "kills": kills}
        rows += failures(launch(spec, args.timeout))
    keys = ["detected", "shrunk", "call_done", "spawned", "rebuilt", "full", "grow"]
    summary = {k: {"median": statistics.median(r[k] for r in rows),
                   "max": max(r[k] for r in rows)} for k in keys}
    print(f"{len(rows)} failures, load average at start {load[0]:.1f}")
    for k in keys:
        print(f"  {k:10s} median {summary[k]['median']:7.3f} s   max {summary[k]['max']:7.3f} s")
    if args.out:
        args.out.write_text(json.dumps({
            "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "started": started, "loadavg_at_start": load, "loadavg_at_end": os.getloadavg(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "failures": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
