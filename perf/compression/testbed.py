"""The training job (jobs/train_buckets.py) on the emulated BCube testbed, once per compressor:
step time, bytes per step, dropped fraction, loss and accuracy per epoch against uncompressed.

Needs root and the MPICH venv of ``perf/testbed`` (with scikit-learn); hold the testbed lock:

    export BML_TESTBED_VENV=/tmp/venv-testbed-<name>   # python -m perf.testbed setup
    flock /tmp/bmlmpi-testbed.lock python perf/compression/testbed.py \\
        --shape 2x2 --rate 100mbit --epochs 3 --out perf/compression/testbed.json

Brings the testbed up, runs ``python -m perf.testbed run -- python jobs/train_buckets.py
--plan threshold --algorithm bml --compression SPEC`` for every spec (one rank per server,
OPENBLAS_NUM_THREADS=1), records the load average around each run, and tears the testbed
down. ``threshold:0`` drops nothing: the plain allreduce bit for bit, with its bytes counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# the sparse settings both left to the cost model (auto: it prices the links it measured on
# the first call, bmlmpi.compression.network_price) and pinned with @sparse
SPECS = ["threshold:0", "fp16", "bf16", "tdf:0.001:0.5:0.6", "tdf:0.01:0.5:0.9",
         "tdf:0.01:0.5:0.9:none", "tdf:0.1:0.5:0.99", "tdf:0.1:0.5:0.99:none",
         "tdf:0.3:0.5:0.99:none", "tdf:0.1:0.5:0.99:none@sparse",
         "tdf:0.3:0.5:0.99:none@sparse"]


def testbed(*argv: str, timeout: float) -> None:
    subprocess.run([sys.executable, "-m", "perf.testbed", *argv], check=True, cwd=ROOT,
                   timeout=timeout)


def run(spec: str, epochs: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        before = os.getloadavg()
        testbed("run", "--timeout", str(timeout), "--", "python", "jobs/train_buckets.py",
                "--epochs", str(epochs), "--plan", "threshold", "--algorithm", "bml",
                "--compression", spec, "--out", str(out), timeout=timeout + 60)
        r = json.loads(out.read_text())["runs"][0]
    r["load_average_before"], r["load_average_after"] = before, os.getloadavg()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2x2")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--specs", default=",".join(SPECS))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", BMLMPI_ALGORITHM="bml")
    runs = []
    testbed("up", "bcube", args.shape, "--rate", args.rate, timeout=120)
    try:
        for spec in args.specs.split(","):
            r = run(spec, args.epochs, args.timeout)
            runs.append(r)
            print(f"{spec:24s} acc {r['accuracies'][-1]:.4f} step "
                  f"{r['step_seconds_median'] * 1e3:.1f} ms bytes/step "
                  f"{r.get('compressed_bytes_per_step', 'plain')} dropped "
                  f"{r.get('dropped_fraction', 0):.3f} paths {r.get('compression_paths')} "
                  f"load {r['load_average_before'][0]:.1f}", flush=True)
    finally:
        testbed("down", timeout=120)
    if args.out:
        ranks = runs[0]["ranks"] if runs else None
        Path(args.out).write_text(json.dumps({
            "testbed": f"bcube {args.shape}, {args.rate}, reno, mtu 1500 (perf.testbed), "
                       f"{ranks} ranks, MPICH",
            "command": " ".join(["python", "perf/compression/testbed.py", *sys.argv[1:]]),
            "load_average": os.getloadavg(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
