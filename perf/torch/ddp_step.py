"""DDP step time on backend ``bmlmpi`` against backend ``gloo``, same model, same run.

    bmlmpi-run -n 2 python perf/torch/ddp_step.py --out perf/torch/ddp_step_n2.json

One launch holds both process groups: the default group on ``bmlmpi`` and a ``gloo`` group
beside it (its store made through MPI), and two DDP replicas of one MLP (≥ 1 M parameters,
``--hidden``). Rounds alternate: ``--steps`` timed training steps (forward, backward with
DDP's bucketed gradient allreduce, SGD step) on bmlmpi, then as many on gloo, ``--rounds``
times, after ``--warmup`` steps of each; so both see the same load. A step's time is the
slowest rank's (MPI MAX of the per-rank times). Rank 0 prints the median and quartiles per
backend, the ratio bmlmpi / gloo of the medians, and the load (``os.getloadavg``) at the
start and end, and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import bmlmpi.torch


def model(hidden: int, inputs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--inputs", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--topology", default=None, help="bmlmpi's BCube shape, e.g. 3x3")
    p.add_argument("--store-host", default=None,
                   help="the address rank 0 serves torch's store on (the testbed: its eth0)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    load_before = os.getloadavg()
    bmlmpi.torch.init_process_group(
        options=bmlmpi.torch.Options(algorithm=a.algorithm, topology=a.topology),
        store_host=a.store_host)
    gloo = dist.new_group(backend="gloo")
    replicas = {"bmlmpi": None, "gloo": gloo}
    ddp, opt = {}, {}
    for name, group in replicas.items():
        m = model(a.hidden, a.inputs)
        ddp[name] = torch.nn.parallel.DistributedDataParallel(m, process_group=group)
        opt[name] = torch.optim.SGD(m.parameters(), lr=0.01)
    params = sum(q.numel() for q in ddp["gloo"].parameters())
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(a.batch, a.inputs, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g)

    def step(name: str) -> None:
        opt[name].zero_grad()
        torch.nn.functional.cross_entropy(ddp[name](x), y).backward()
        opt[name].step()

    for name in replicas:
        for _ in range(a.warmup):
            step(name)
    times: dict[str, list[float]] = {name: [] for name in replicas}
    for _ in range(a.rounds):
        for name in replicas:
            comm.Barrier()
            for _ in range(a.steps):
                t0 = time.perf_counter()
                step(name)
                times[name].append(time.perf_counter() - t0)
    slowest = {}
    for name, ts in times.items():
        mine = np.array(ts)
        worst = np.empty_like(mine)
        comm.Allreduce(mine, worst, MPI.MAX)
        slowest[name] = worst
    load_after = os.getloadavg()
    if comm.rank == 0:
        stats = {name: {"median_ms": float(np.median(t) * 1e3),
                        "q1_ms": float(np.percentile(t, 25) * 1e3),
                        "q3_ms": float(np.percentile(t, 75) * 1e3), "steps": len(t)}
                 for name, t in slowest.items()}
        ratio = stats["bmlmpi"]["median_ms"] / stats["gloo"]["median_ms"]
        result = {"ranks": comm.size, "parameters": params, "batch_per_rank": a.batch,
                  "steps_per_round": a.steps, "rounds": a.rounds, "warmup": a.warmup,
                  "algorithm": a.algorithm, "topology": a.topology, "stats": stats,
                  "ratio_bmlmpi_over_gloo": ratio,
                  "load_before": load_before, "load_after": load_after,
                  "torch": torch.__version__, "mpi": MPI.Get_library_version().splitlines()[0],
                  "host": platform.node(), "cpus": os.cpu_count(),
                  "note": "shared machine: other developers' tests ran at the same time"}
        for name, s in stats.items():
            print(f"{name:7s} step median {s['median_ms']:.2f} ms (q1 {s['q1_ms']:.2f}, q3 "
                  f"{s['q3_ms']:.2f}), {s['steps']} steps", flush=True)
        print(f"N={comm.size} params={params} bmlmpi/gloo = {ratio:.3f}  load "
              f"{load_before[0]:.1f} -> {load_after[0]:.1f}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=2)
    # every rank reaches the teardown together: with rank 0 still writing its report, the
    # other's destroy_process_group was seen to block inside torch (in C++, past bmlmpi's
    # Python code) until the launch was killed
    comm.Barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
