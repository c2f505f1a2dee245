"""Per-iteration time of jobs/train_buckets.py's model under every bucket plan, interleaved.

One training run on N ranks; the plan changes every ``--block`` steps, round-robin over the
plans (``threshold:BYTES`` gives a cap), so that every plan sees the same drifting load of a
shared machine. The first step of each block (its forward pass waits for the previous plan's
allreduces) and the whole first round (warm-up; ibatch profiles itself there) are left out of
the statistics. One iteration per plan and rank is recorded as a timeline: the backward pass of
the block's second-to-last step, its allreduces, and the next forward pass.

    bmlmpi-run -n 4 python perf/buckets/interleaved.py --out interleaved-n4.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))

from train_buckets import MLP, epoch_order, load_dataset  # noqa: E402

import bmlmpi  # noqa: E402
from bmlmpi import config  # noqa: E402

DEFAULT_PLANS = "layer,single,ibatch,threshold:131072,threshold:524288,threshold:1572864"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plans", default=DEFAULT_PLANS)
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--cost", default="model", choices=["model", "measured"],
                   help="where ibatch's startup and per-byte times come from (measured: "
                        "allreduces timed on this communicator; use it on the testbed)")
    p.add_argument("--note", default="", help="free text stored in the result (the network)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.block < 3 or args.rounds < 2:
        p.error("--block must be >= 3 and --rounds >= 2")
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    x, y, source = load_dataset("auto", args.seed)
    model = MLP(args.seed)
    grads = [np.zeros_like(q) for q in model.params]
    communicator = bmlmpi.Communicator(comm)
    labels = [s.strip() for s in args.plans.split(",") if s.strip()]
    objs = {}
    for label in labels:
        plan, _, cap = label.partition(":")
        objs[label] = bmlmpi.GradientBuckets(grads, comm=communicator, plan=plan,
                                             fusion_bytes=int(cap) if cap else None,
                                             cost=args.cost)
    glob = args.batch * size
    # A global batch larger than the data set (to give each rank as much computation as one
    # allreduce of the model takes on a slow network) draws the epoch's permutation
    # cyclically: a sample appears more than once in such a step. Only the time is measured here;
    # jobs/train_buckets.py checks the losses.
    per_epoch = max(len(y) // glob, 1)
    times: dict[str, list[float]] = {label: [] for label in labels}
    timelines: dict[str, dict] = {}
    pending = [False] * model.layers
    prev = objs[labels[0]]
    loads = [os.getloadavg()]
    n = 0
    for rnd in range(args.rounds):
        for label in labels:
            cur = objs[label]
            for k in range(args.block):
                epoch, s = divmod(n, per_epoch)
                order = epoch_order(args.seed, epoch + 1, len(y))
                idx = order[np.arange(s * glob + rank * args.batch,
                                      s * glob + (rank + 1) * args.batch) % len(y)]
                waiting_on = prev

                def update(layer: int, owner=waiting_on) -> None:
                    if pending[layer]:
                        for i in (2 * layer, 2 * layer + 1):
                            owner.wait(i)
                            model.params[i] -= args.lr * grads[i]
                        pending[layer] = False

                record = rnd == args.rounds - 1 and k in (args.block - 2, args.block - 1)
                clock = timelines[label]["compute"] if k == args.block - 1 and record else None
                cur.record_timeline = record
                t0 = time.perf_counter()
                acts = model.forward(x[idx], before_layer=update, clock=clock)
                if record and k == args.block - 1:
                    tl = timelines[label]
                    tl["end"] = time.perf_counter()
                    tl["comm"] = [c for c in cur.timeline() if c[2] >= tl["t0"]]
                if record and k == args.block - 2:
                    timelines[label] = {"t0": time.perf_counter(), "compute": [],
                                        "buckets": cur.buckets}
                model.backward(acts, y[idx], grads, ready=cur.mark_ready,
                               clock=timelines[label]["compute"]
                               if record and k == args.block - 2 else None)
                pending[:] = [True] * model.layers
                if rnd > 0 and k > 0:
                    times[label].append(time.perf_counter() - t0)
                prev = cur
                n += 1
        loads.append(os.getloadavg())
    prev.wait()
    profiles = {label: obj.profile for label, obj in objs.items() if obj.profile is not None}
    for obj in objs.values():
        obj.close()
    gathered = comm.gather(timelines, root=0)
    if rank == 0:
        result = {
            "ranks": size, "batch_per_rank": args.batch, "cost": args.cost,
            "note": args.note,
            "algorithm": (communicator.algorithm if communicator.algorithm != "auto" else
                          config.get("BMLMPI_ALGORITHM") or "auto"),
            "topology": "x".join(map(str, communicator.shape)), "block": args.block,
            "rounds": args.rounds, "dataset": source,
            "host": platform.node(), "cores": os.cpu_count(), "load_average_per_round": loads,
            "oversubscribed": size * 2 > (os.cpu_count() or 1),
            "mpi": MPI.Get_library_version().replace("\0", "").splitlines()[0],
            "plans": [{"plan": label, "buckets": [list(b) for b in objs[label].buckets],
                       "step_seconds_median": float(np.median(times[label])),
                       "step_seconds_mean": float(np.mean(times[label])),
                       "step_seconds_quartiles": [float(q) for q in
                                                  np.percentile(times[label], [25, 75])],
                       "steps_measured": len(times[label]),
                       "profile": ({"startup_s": profiles[label].startup,
                                    "per_byte_s": profiles[label].per_byte,
                                    "forward_s": profiles[label].forward,
                                    "backward_s": profiles[label].backward}
                                   if label in profiles else None),
                       "timeline": [g[label] for g in gathered]} for label in labels]}
        Path(args.out).write_text(json.dumps(result, indent=1))
        for r in result["plans"]:
            print(f"{r['plan']:>18}: median {r['step_seconds_median'] * 1e3:9.2f} ms over "
                  f"{r['steps_measured']} steps, {len(r['buckets'])} buckets", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
