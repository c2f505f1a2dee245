"""Time to detect and recover from a link that goes down (seed 001: its server is masked).

    sudo python perf/ft/linkdown.py --launches 2 --out perf/ft/results/linkdown.json

Each launch is ``bmlmpi-run --ft python tests/ft/ft_ranks.py SPEC`` with ``--groups``
independent BCube(2,2) groups (4 ranks, bml, 65,536 float64); in each, one rank watches one
end of a veth pair made for it (``watch_links``), and at the start of a random schedule step of
call 1 that rank runs ``ip link set <end> down``. Its link watch (period = the heartbeat
period, 0.25 s by default) fences it; ULFM reports the death; the survivors recover. Per
failure, from the victim's ``time.time()`` just before ``ip link set`` (one host, one clock):
detected = the first survivor noticed, recovered = the last survivor's shrunk communicator
exists (the call then re-runs over the survivors). Every launch is checked like the FT tests:
exact survivors' results, the same on all. Needs root (veth pairs); the ranks' transfers use
shared memory (Open MPI does not start across the testbed's namespaces: README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def veth(name: str) -> None:
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"],
                   check=True, timeout=30)
    for end in (name, name + "p"):
        subprocess.run(["ip", "link", "set", end, "up"], check=True, timeout=30)


def launch(groups: list[dict], timeout: float) -> list[dict]:
    spec = {"timeout": 120, "hang_timeout": 20, "groups": groups}
    n = sum(g["size"] for g in groups)
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", str(n), sys.executable,
           "tests/ft/ft_ranks.py", json.dumps(spec)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env=env)
    return [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
            if line.startswith("FT-JSON ")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--count", type=int, default=65_536)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root to make veth pairs")
    sys.path.insert(0, str(ROOT))
    from tests.test_ft_launch import check  # the FT tests' exactness check

    rng = random.Random(args.seed)
    rows = []
    load = os.getloadavg()
    for li in range(args.launches):
        names = [f"bmlld{os.getpid() % 10_000}{li}{g}" for g in range(args.groups)]
        groups = []
        try:
            for name in names:
                veth(name)
                victim = rng.randrange(4)
                groups.append({"size": 4, "algorithm": "bml", "topology": "2x2", "calls": 3,
                               "count": args.count, "links": {str(victim): name},
                               "kills": [{"call": 1, "rank": victim, "when": "post",
                                          "step": rng.randrange(4), "how": "link"}]})
            records = launch(groups, args.timeout)
        finally:
            for name in names:
                subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
        if any("unfenced" in r for r in records):
            raise SystemExit(f"a link watch did not fence its rank: {records}")
        check(groups, subprocess.CompletedProcess([], 0, "", ""), records)
        for gi in range(len(groups)):
            mine = [r for r in records if r.get("group") == gi]
            at = next(r["at"] for r in mine if "victim" in r)
            recs = [s["recoveries"][0] for s in mine if "survivor" in s]
            rows.append({"detected": min(r["noticed"] for r in recs) - at,
                         "recovered": max(r["shrunk"] for r in recs) - at})
    summary = {k: {"median": statistics.median(r[k] for r in rows),
                   "max": max(r[k] for r in rows)} for k in ("detected", "recovered")}
    print(f"{len(rows)} links down, load average at start {load[0]:.1f}")
    for k, v in summary.items():
        print(f"  {k:10s} median {v['median']:.3f} s   max {v['max']:.3f} s")
    if args.out:
        args.out.write_text(json.dumps({"started": time.time(), "loadavg_at_start": load,
                                        "loadavg_at_end": os.getloadavg(),
                                        "args": {k: str(v) for k, v in vars(args).items()},
                                        "failures": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
