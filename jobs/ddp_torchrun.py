"""DDP as PyTorch's tutorials write it for torchrun, run unchanged by bmlmpi-run.

    torchrun --nproc_per_node 2 jobs/ddp_torchrun.py --backend gloo
    bmlmpi-run --nproc_per_node 2 jobs/ddp_torchrun.py --backend bmlmpi

The script reads what torchrun exports (``LOCAL_RANK`` to pick its device, the rest through
torch's ``env://`` rendezvous) and takes the backend from the command line; ``bmlmpi-run``
exports the same variables, so only the launcher's name and ``--backend`` change. Each step
trains a small MLP to a fixed linear map, on a batch drawn from a generator seeded by the step
and the rank; every
rank prints its rank, ``LOCAL_RANK`` and last loss, and rank 0 writes ``--out`` (JSON: the
backend, the world size and every step's loss on each rank). With the gradient averaged the
same way, gloo and bmlmpi give the same losses (bit for bit at 2 ranks, where a sum of two
numbers has one order).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo", help="gloo, bmlmpi, nccl, ...")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default=None, help="JSON report (rank 0)")
    a = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() and \
        a.backend == "nccl" else torch.device("cpu")
    if a.backend == "bmlmpi":
        import bmlmpi.torch  # noqa: F401 - registers the backend "bmlmpi"
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda"
                                  else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    target = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
    losses = []
    for step in range(a.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = x @ target + 0.1 * torch.randn(32, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"rank {rank} of {world}, LOCAL_RANK {local_rank}, backend {a.backend}: last loss "
          f"{losses[-1]:.6f}", flush=True)
    every = [None] * world
    dist.all_gather_object(every, losses)
    if rank == 0 and a.out:
        with open(a.out, "w") as f:
            json.dump({"backend": a.backend, "world_size": world, "losses": every}, f)
    # no rank ends before the report is written: a launcher ends the others when one ends
    # badly (a gloo worker may abort as its process ends, tests/test_torchrun.py)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
