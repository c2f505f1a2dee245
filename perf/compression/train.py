"""The training job (jobs/train_buckets.py) once per compressor: loss and accuracy per epoch
beside the uncompressed run, bytes per step and step time; one plot.

    python perf/compression/train.py --ranks 4 --epochs 5      # writes train.json, train.png

Each run is ``python -m bmlmpi.cli.launch -n RANKS python jobs/train_buckets.py --compression SPEC``
from the same initial model and data order; OPENBLAS_NUM_THREADS=1 (more ranks than cores).
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
#: "threshold:0" drops nothing: the plain allreduce bit for bit (tested), but its bytes are counted
BASELINE = "threshold:0"
SPECS = [BASELINE, "fp16", "bf16", "threshold:0.001:0.5", "random:0.6", "tdf:0.001:0.5:0.6",
         "tdf:0.01:0.5:0.9", "tdf:0.01:0.5:0.9:none", "tdf:0.1:0.5:0.99:none@sparse",
         "tdf:0.3:0.5:0.99:none@sparse"]


def run(spec: str, ranks: int, epochs: int, plan: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(ranks), sys.executable,
               str(ROOT / "jobs" / "train_buckets.py"), "--epochs", str(epochs), "--plan", plan,
               "--compression", spec, "--out", str(out)]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        subprocess.run(cmd, check=True, timeout=timeout, env=env, cwd=ROOT)
        return json.loads(out.read_text())["runs"][0]


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        ep = range(len(r["losses"]))
        style = "k-" if r["compression"] == BASELINE else "--"
        label = "uncompressed" if r["compression"] == BASELINE else r["compression"]
        a.plot(ep, r["losses"], style, label=label, marker="o", ms=3)
        b.plot(ep, [100 * x for x in r["accuracies"]], style, label=label, marker="o", ms=3)
    a.set(xlabel="epoch", ylabel="training loss", yscale="log", title="loss per epoch")
    b.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy per epoch")
    a.legend(fontsize=7)
    fig.suptitle(f"train_buckets, {runs[0]['ranks']} ranks, {runs[0]['dataset']}, "
                 f"per compressor (uncompressed: black)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--plan", default="threshold")
    ap.add_argument("--specs", default=",".join(SPECS))
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    runs = []
    for spec in args.specs.split(","):
        r = run(spec, args.ranks, args.epochs, args.plan, args.timeout)
        runs.append(r)
        print(f"{spec:22s} acc {r['accuracies'][-1]:.4f} loss {r['losses'][-1]:.5f} step "
              f"{r['step_seconds_median'] * 1e3:.1f} ms bytes/step "
              f"{r.get('compressed_bytes_per_step', 'plain')} dropped "
              f"{r.get('dropped_fraction', 0):.3f} paths {r.get('compression_paths')}",
              flush=True)
    (HERE / "train.json").write_text(json.dumps({"load_average": os.getloadavg(),
                                                 "runs": runs}, indent=1))
    plot(runs, HERE / "train.png")


if __name__ == "__main__":
    main()
