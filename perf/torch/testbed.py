"""DDP step time on the emulated BCube(3,2) testbed: backend ``bmlmpi`` with BML against
``gloo``, and both on the Fat-Tree twin (perf/testbed: namespaces, veth, bridges, tc).

    BML_TESTBED_VENV=/tmp/venv-testbed-torch python -m perf.torch.testbed --rate 200mbit \\
        --cycles 2 --out perf/torch/testbed_200mbit.json

Run from the repository root, as root (the testbed's own needs). A cycle builds BCube 3x3 (9
servers, 2 NICs each, every link ``--rate`` each way) and runs ``perf/torch/ddp_step.py`` on 9
ranks, one a server: the default group on backend ``bmlmpi`` with BML on topology 3x3 and a
``gloo`` group beside it, the two DDP replicas' steps alternating in rounds (same run, same
load); it tears BCube down, builds the Fat-Tree twin (9 servers, one NIC each on one switch,
same rate) and runs the same with bmlmpi's ring (the best algorithm on one NIC, at its wire
limit there: perf/testbed/README.md) against gloo. Cycles repeat both, so the two testbeds
alternate as well.

A step is forward, backward (DDP's bucketed gradient all_reduce) and SGD's update of the MLP of
``ddp_step.py`` (1 385 482 parameters, 5.5 MB of float32 gradients), timed as the slowest
rank's. Reported: median and quartiles per backend and testbed over every cycle; the ratios
bmlmpi/gloo on BCube and on the Fat-Tree (each from one run), and BML on BCube against gloo
on the Fat-Tree (the issue's comparison, from the two runs of each cycle); the bandwidth-only
wire time of one allreduce of the gradient (perf/testbed/theory.py); the load before and
after each run.

The ranks need torch in the testbed's MPICH venv (``BML_TESTBED_VENV``; the MPICH wheel's
mpiexec is what crosses the namespaces):

    BML_TESTBED_VENV=/tmp/venv-testbed-torch python -m perf.testbed setup
    /tmp/venv-testbed-torch/bin/pip install torch==2.13.0

torch's store: rank 0 serves it on its eth0 address (``--store-host``), since MPI sees all
ranks on one node while each namespace has its own loopback; gloo is told the NIC with
``GLOO_SOCKET_IFNAME=eth0``.
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

from perf.testbed import mpi, netns, theory, topology

REPO = Path(__file__).resolve().parents[2]
SHAPE = "3x3"
# the testbed, bmlmpi's algorithm there, the topology it is given
RUNS = [("bcube", "bml", SHAPE), ("fattree", "ring", None)]


def check_venv() -> str:
    """The torch version in the ranks' venv; raises with the commands that make it."""
    probe = "import torch, bmlmpi.torch; print(torch.__version__)"
    done = subprocess.run([str(mpi.venv_python()), "-c", probe], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=mpi.environment())
    if done.returncode != 0:
        raise SystemExit(f"the testbed venv {mpi.VENV} has no torch: "
                         f"BML_TESTBED_VENV={mpi.VENV} python -m perf.testbed setup && "
                         f"{mpi.VENV}/bin/pip install torch==2.13.0\n{done.stderr[-800:]}")
    return done.stdout.strip()


def one_run(kind: str, algorithm: str, topo: str | None, a: argparse.Namespace) -> dict:
    """Build the testbed, run ddp_step.py on its 9 servers, tear it down; its report."""
    with tempfile.TemporaryDirectory(prefix="bmlmpi-torch-testbed-") as tmp:
        out = Path(tmp) / "step.json"
        with netns.testbed(kind, SHAPE, a.rate) as net:
            argv = ["python", "perf/torch/ddp_step.py", "--algorithm", algorithm,
                    "--store-host", net.host_address(0), "--steps", str(a.steps),
                    "--rounds", str(a.rounds), "--warmup", str(a.warmup), "--out", str(out)]
            if topo:
                argv += ["--topology", topo]
            env = {"GLOO_SOCKET_IFNAME": "eth0", "BMLMPI_CALIBRATE": "0",
                   "BMLMPI_TIMEOUT": str(a.timeout), "PYTHONUNBUFFERED": "1"}
            started = time.monotonic()
            proc = mpi.run(net, argv, timeout=a.timeout, env=env)
            seconds = time.monotonic() - started
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"{kind}: ddp_step.py failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}")
        report = json.loads(out.read_text())
    report.update(testbed=kind, rate=a.rate, seconds=round(seconds, 1))
    print(f"{kind:8s} bmlmpi({algorithm}) {report['stats']['bmlmpi']['median_ms']:8.1f} ms  "
          f"gloo {report['stats']['gloo']['median_ms']:8.1f} ms  ratio "
          f"{report['ratio_bmlmpi_over_gloo']:.3f}  load {report['load_before'][0]:.1f} -> "
          f"{report['load_after'][0]:.1f}", flush=True)
    return report


def summary(runs: list[dict], rate_bps: float) -> dict:
    def med(kind: str, backend: str) -> float:
        return statistics.median(r["stats"][backend]["median_ms"] for r in runs
                                 if r["testbed"] == kind)

    per_cycle = [b["stats"]["bmlmpi"]["median_ms"] / f["stats"]["gloo"]["median_ms"]
                 for b, f in zip(runs[0::2], runs[1::2], strict=True)]
    nbytes = 4 * runs[0]["parameters"]
    radices = topology.parse_shape(SHAPE)
    return {
        "median_ms": {f"{kind}/{backend}": med(kind, backend) for kind, _, _ in RUNS
                      for backend in ("bmlmpi", "gloo")},
        "bcube_bmlmpi_over_gloo": med("bcube", "bmlmpi") / med("bcube", "gloo"),
        "fattree_bmlmpi_over_gloo": med("fattree", "bmlmpi") / med("fattree", "gloo"),
        "bml_bcube_over_gloo_fattree": med("bcube", "bmlmpi") / med("fattree", "gloo"),
        "bml_bcube_over_gloo_fattree_per_cycle": per_cycle,
        "gradient_bytes": nbytes,
        "wire_ms_bml_bcube": 1e3 * theory.predicted_seconds("bcube", "bml", nbytes, rate_bps,
                                                            radices),
        "wire_ms_one_nic_fattree": 1e3 * theory.predicted_seconds("fattree", "ring", nbytes,
                                                                  rate_bps, radices),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="200mbit", help="link rate, each direction (tc units)")
    p.add_argument("--cycles", type=int, default=2, help="BCube then Fat-Tree, this often")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round and backend")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per run, then killed")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"no emulated testbed here: {why}")
    mpich = mpi.check()
    torch_version = check_venv()
    runs = []
    for _ in range(a.cycles):
        for kind, algorithm, topo in RUNS:
            runs.append(one_run(kind, algorithm, topo, a))
    result = {"summary": summary(runs, netns.parse_rate(a.rate)), "runs": runs,
              "rate": a.rate, "shape": SHAPE, "cycles": a.cycles, "torch": torch_version,
              "mpi": mpich, "host": platform.node(), "cpus": os.cpu_count(),
              "kernel": platform.release(), "command": " ".join(sys.argv),
              "note": "shared machine: other developers' tests ran at the same time; the 9 "
                      "ranks and every link's packet processing share its CPUs"}
    s = result["summary"]
    print(json.dumps(s, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
