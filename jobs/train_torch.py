"""A small CNN on scikit-learn's digits, DDP on the torch.distributed backend ``bmlmpi``.

    bmlmpi-run -n 4 python jobs/train_torch.py --epochs 10
    bmlmpi-run -n 4 python jobs/train_torch.py --compression fp16
    bmlmpi-run -n 4 python jobs/train_torch.py --plan ibatch --bucket-cap-mb 0.01
    bmlmpi-run -n 3 python jobs/train_torch.py --reproducible --algorithm ring
    bmlmpi-run --ft --tolerate-lost -n 4 python jobs/train_torch.py --fault-tolerant \
        --kill-rank 2 --kill-step 37

Data: the 1797 8x8 digits (``sklearn.datasets.load_digits``), 360 of them (a fixed random
choice) held out for the accuracy. Each step takes the next ``--batch`` × N samples of an
epoch's permutation (the same on every rank) and splits them over the ranks alive, so the
global batch and the steps per epoch stay the same when ranks die: a survivor's share grows
to u + u·x/(N−x) (bmlmpi's ``rescaled_batch`` rule). The learning rate falls linearly to zero
over the run. The gradient is averaged by DDP through the bmlmpi backend: plain DDP, or a
bmlmpi hook with ``--compression`` (``bmlmpi.torch.hooks.compression_hook``), ``--plan``
(``bucket_plan_hook``) or ``--fault-tolerant`` (``allreduce_hook``: bmlmpi's AVG divides by
the survivors).

``--reproducible`` runs the backend in bmlmpi's reproducible mode (``Options(reproducible=
True)``): every gradient all_reduce returns bits that depend on the gradients alone, so the
final parameters are the same bits whichever ``--algorithm`` ran. ``--compare-plain`` (with
``--reproducible``) then trains the same model again from the same seed on a plain process
group of the same ``--algorithm`` (``new_group`` with ``Options(reproducible=False)``) and
reports its parameters' digest too, so one launch shows both modes. With ``--reproducible``,
``--algorithm`` may name several, comma-separated (``ring,bml,auto``): the same model is
trained from the same seed once per algorithm, the first on the world group, each other on a
group of its own (and, with ``--compare-plain``, once per algorithm on a plain group), and
``--out`` reports each one's digest and the algorithms its gradient all_reduces ran
(``by_algorithm``; what ``auto`` ran is its priced choice: DDP's all_reduce is non-blocking,
and ``auto`` times the candidates on blocking calls only). ``--steps S`` ends each epoch
after S steps (default: the whole epoch).

``--fault-tolerant`` runs the backend on bmlmpi's fault-tolerant communicator (start with
``bmlmpi-run --ft``); ``--kill-rank R --kill-step S`` makes original rank R die (SIGKILL) at
global step S, before its forward pass. The survivors finish the step with the gradient
averaged over themselves and train on, at N−1.

``--backend gloo`` runs the same training on torch's gloo (the store made through MPI), for
comparison. Rank 0 prints each epoch's mean training loss and the held-out accuracy and writes
``--out`` (JSON: losses, accuracies, ranks per epoch, failures, whether the parameters are
identical on every rank, the SHA-256 of rank 0's final parameters' bytes, seconds). Exit
status 3 when they are not identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError:
    sys.exit("train_torch: needs PyTorch, the torch extra: pip install '.[torch]' (the CPU "
             "build: see docs/torch.md)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=int(os.environ.get("BMLMPI_TRAIN_EPOCHS", 10)))
    p.add_argument("--batch", type=int, default=int(os.environ.get("BMLMPI_TRAIN_BATCH", 16)),
                   help="samples per rank per step (u)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--backend", choices=["bmlmpi", "gloo"], default="bmlmpi")
    p.add_argument("--algorithm", default=os.environ.get("BMLMPI_ALGORITHM", "auto"))
    p.add_argument("--topology", default=None, help="BCube shape, e.g. 2x2")
    p.add_argument("--compression", default=None,
                   help="a bmlmpi compressor spec: fp16, bf16, threshold:PHI, tdf:PHI:D:P, "
                        "topk:RATIO, ...")
    p.add_argument("--plan", default=None, choices=["ibatch", "layer", "single", "threshold"],
                   help="bmlmpi bucket plan over DDP's buckets (bucket_plan_hook)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket cap")
    p.add_argument("--reproducible", action="store_true",
                   help="reproducible reductions: the same bits whatever the algorithm")
    p.add_argument("--compare-plain", action="store_true",
                   help="with --reproducible: train again on a plain process group and "
                        "report both digests")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per epoch at most (default: the whole epoch)")
    p.add_argument("--fault-tolerant", action="store_true")
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--kill-step", type=int, default=None)
    p.add_argument("--hang-timeout", type=float, default=None)
    p.add_argument("--timeout", type=float, default=None, help="deadline of every wait (s)")
    p.add_argument("--out", default=None, help="JSON report (rank 0)")
    a = p.parse_args(argv)
    if (a.kill_rank is None) != (a.kill_step is None):
        p.error("give --kill-rank and --kill-step together")
    if a.kill_rank is not None and not a.fault_tolerant:
        p.error("--kill-rank needs --fault-tolerant (a plain job cannot survive it)")
    if a.backend == "gloo" and (a.compression or a.plan or a.fault_tolerant):
        p.error("--compression, --plan and --fault-tolerant need --backend bmlmpi")
    if a.compression and a.plan:
        p.error("choose one of --compression and --plan")
    if a.fault_tolerant and a.plan:
        p.error("--plan does not run on the fault-tolerant backend")
    if a.compare_plain and (not a.reproducible or a.fault_tolerant or a.backend != "bmlmpi"):
        p.error("--compare-plain needs --reproducible on the plain bmlmpi backend")
    a.algorithms = a.algorithm.split(",")
    if len(a.algorithms) > 1 and (not a.reproducible or a.fault_tolerant
                                  or a.backend != "bmlmpi"):
        p.error("several --algorithm need --reproducible on the plain bmlmpi backend")
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be at least 1")
    return a


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 2 * 2, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data() -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, held = order[:-360], order[-360:]
    return x[train], y[train], x[held], y[held]


def init(a: argparse.Namespace):
    from mpi4py import MPI

    import bmlmpi.torch
    expect = os.environ.get("BMLMPI_EXPECT_SIZE")   # set by the jobs/ scripts
    if expect and int(expect) != MPI.COMM_WORLD.size:
        raise SystemExit(f"train_torch: the MPI world has {MPI.COMM_WORLD.size} ranks, the "
                         f"job asked for {expect} (launcher and MPI library disagree?)")
    if a.backend == "gloo":
        comm = MPI.COMM_WORLD
        dist.init_process_group("gloo", store=bmlmpi.torch.store_from_mpi(comm),
                                rank=comm.rank, world_size=comm.size)
        return dist.group.WORLD
    options = bmlmpi.torch.Options(algorithm=a.algorithms[0], topology=a.topology,
                                   fault_tolerant=a.fault_tolerant,
                                   hang_timeout=a.hang_timeout, timeout=a.timeout,
                                   reproducible=a.reproducible or None)
    return bmlmpi.torch.init_process_group(options=options)


def wrap(model: torch.nn.Module, a: argparse.Namespace, pg) -> torch.nn.Module:
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                    bucket_cap_mb=a.bucket_cap_mb)
    if a.backend == "gloo":
        return ddp
    from bmlmpi.torch import hooks
    if a.compression:
        ddp.register_comm_hook(hooks.CompressionState(a.compression, pg),
                               hooks.compression_hook)
    elif a.plan:
        ddp.register_comm_hook(hooks.BucketPlanState(pg, plan=a.plan), hooks.bucket_plan_hook)
    elif a.fault_tolerant:
        # DDP's own reduction divides by the world size it read at construction; bmlmpi's AVG
        # divides by the ranks that contributed (the survivors after a failure)
        ddp.register_comm_hook(hooks.AllreduceState(pg), hooks.allreduce_hook)
    return ddp


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def identical(pg, model: torch.nn.Module) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=pg)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=pg)
    return bool(torch.equal(hi, lo))


def digest(model: torch.nn.Module) -> str:
    """The SHA-256 of the model's parameters' bytes."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def gradient_algorithms(pg) -> list[str]:
    """The algorithms the float32 all_reduces (the gradients') of ``pg``'s communicator ran,
    as its flight recorder kept them."""
    return sorted({c["chosen"] for c in pg.communicator.recorder.calls()
                   if c["collective"] == "allreduce" and c["dtype"] == "float32"})


def trained_on(a: argparse.Namespace, algorithm: str, reproducible: bool) -> dict:
    """The same training on a new process group of ``algorithm`` in the given mode: its
    parameters' digest, whether they are identical on every rank, the algorithms its
    gradient all_reduces ran."""
    import bmlmpi.torch
    options = bmlmpi.torch.Options(algorithm=algorithm, topology=a.topology,
                                   timeout=a.timeout, reproducible=reproducible)
    pg = dist.new_group(backend="bmlmpi", pg_options=options)
    model, _, _, _ = fit(a, pg)
    return {"params_sha256": digest(model), "params_identical": identical(pg, model),
            "ran": gradient_algorithms(pg)}


def train(a: argparse.Namespace) -> dict:
    pg = init(a)
    world = dist.get_world_size()
    model, history, seconds, steps_per_epoch = fit(a, pg)
    same = identical(pg, model)
    failed = list(getattr(pg, "failed", ()))
    by_algorithm = {}
    if a.backend == "bmlmpi" and not a.fault_tolerant:
        first = {"params_sha256": digest(model), "params_identical": same,
                 "ran": gradient_algorithms(pg)}
        by_algorithm = {a.algorithms[0]: first}
        for algorithm in a.algorithms[1:]:
            by_algorithm[algorithm] = trained_on(a, algorithm, a.reproducible)
        if a.compare_plain:
            for algorithm in a.algorithms:
                plain = trained_on(a, algorithm, False)
                by_algorithm[algorithm].update(
                    {f"plain_{k}": v for k, v in plain.items()})
    same = same and all(r["params_identical"] and r.get("plain_params_identical", True)
                        for r in by_algorithm.values())
    plain = by_algorithm[a.algorithms[0]].get("plain_params_sha256") if by_algorithm else None
    return {"backend": a.backend, "algorithm": a.algorithm, "compression": a.compression,
            "plan": a.plan, "fault_tolerant": a.fault_tolerant, "world_size": world,
            "survivors": dist.get_world_size(), "failed": failed, "epochs": a.epochs,
            "steps_per_epoch": steps_per_epoch, "batch_per_rank": a.batch,
            "history": history, "losses": [h["loss"] for h in history],
            "accuracy": history[-1]["accuracy"] if history else None,
            "params_identical": same, "params_sha256": digest(model),
            "plain_params_sha256": plain, "by_algorithm": by_algorithm,
            "reproducible": a.reproducible, "seconds": seconds, "rank": dist.get_rank()}


def fit(a: argparse.Namespace, pg) -> tuple[torch.nn.Module, list, float, int]:
    """Train a fresh model (seeded) with DDP on ``pg``: the model, the epochs' records, the
    seconds and the steps per epoch."""
    world = dist.get_world_size(pg)
    original_rank = dist.get_rank()
    torch.manual_seed(a.seed)
    model = Net()
    ddp = wrap(model, a, pg)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    xtr, ytr, xte, yte = load_data()
    global_batch = a.batch * world
    steps_per_epoch = len(xtr) // global_batch
    if a.steps is not None:
        steps_per_epoch = min(steps_per_epoch, a.steps)
    # the learning rate falls linearly to zero over the run, so the last epochs settle
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 1.0 - t / max(1, a.epochs * steps_per_epoch))
    history, step = [], 0
    started = time.perf_counter()
    for epoch in range(a.epochs):
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(a.seed + epoch))
        total, count = 0.0, 0
        for s in range(steps_per_epoch):
            if a.kill_step == step and a.kill_rank == original_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            size, rank = dist.get_world_size(), dist.get_rank()
            idx = perm[s * global_batch:(s + 1) * global_batch].tensor_split(size)[rank]
            opt.zero_grad()
            loss = F.cross_entropy(ddp(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            count += len(idx)
            step += 1
        sums = torch.tensor([total, float(count)], dtype=torch.float64)
        dist.all_reduce(sums, group=pg)
        record = {"epoch": epoch + 1, "loss": float(sums[0] / sums[1]),
                  "accuracy": accuracy(model, xte, yte), "ranks": dist.get_world_size()}
        history.append(record)
        if dist.get_rank() == 0:
            print(f"epoch {record['epoch']:3d}  ranks {record['ranks']}  loss "
                  f"{record['loss']:.4f}  accuracy {record['accuracy']:.4f}", flush=True)
    return model, history, time.perf_counter() - started, steps_per_epoch


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import sklearn  # noqa: F401 - load_data's
    except ImportError:
        sys.exit("train_torch: needs scikit-learn, the train extra: pip install '.[train]'")
    if a.fault_tolerant:
        from bmlmpi import ft
        ft.install_exit_handlers()
    result = train(a)
    if result["rank"] == 0:
        print(f"train_torch: {a.epochs} epochs on {result['world_size']} -> "
              f"{result['survivors']} ranks (lost {result['failed']}), accuracy "
              f"{result['accuracy']:.4f}, parameters identical on every rank: "
              f"{result['params_identical']}", flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=2)
    code = 0 if result["params_identical"] else 3
    if not a.fault_tolerant:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    if "--fault-tolerant" in sys.argv:
        from bmlmpi import ft
        ft.finish(main())
    sys.exit(main())
