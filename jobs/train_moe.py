"""A mixture-of-experts classifier, expert-parallel over the ranks, on the torch.distributed
backend ``bmlmpi``: tokens dispatched to their experts and combined back by ``all_to_all_single``
with uneven split sizes.

    bmlmpi-run -n 2 python jobs/train_moe.py --epochs 2 --out moe.json
    bmlmpi-run -n 2 python jobs/train_moe.py --backend gloo --out moe-gloo.json
    bmlmpi-run -n 2 python jobs/train_moe.py --check-gloo
    bmlmpi-run -n 4 python jobs/train_moe.py --experts-per-rank 3 --alltoall bcube

Data: scikit-learn's 8x8 digits (1437 for training, 360 held out, as ``jobs/train_torch.py``),
each image one token of 64 features. Model: an embedding (64 → ``--width``), one MoE layer
with a residual connection, and a head (→ 10 classes). The MoE layer has ``--experts-per-rank``
experts (two-layer MLPs) on every rank, E = N × that in all, expert e on rank e // that; a
router (one linear layer, replicated) sends each token to its top-1 expert and scales the
expert's output by the router's probability for it (so the router learns).

One step on every rank: its share of the global batch is embedded and routed; the tokens are
sorted by expert; the counts per expert go to every rank (``all_to_all_single`` of E integers,
equal splits), so each rank knows how many tokens it receives from each; the tokens go to their
experts' ranks (``all_to_all_single`` with uneven split sizes, zeros whenever a rank routes
nothing to another), each expert runs on its tokens, and the results come back the same way
(split sizes swapped), in their original order. Autograd runs the two exchanges backwards
(``Exchange``: the gradients go back by the same all-to-all). An expert's gradient is the sum
over every rank's tokens it served, divided by N; the replicated parameters' gradients are
averaged by one ``all_reduce`` (SUM, then divided by N). SGD with momentum.

``--backend gloo`` runs the same steps on torch's gloo (the store made through MPI). All-to-all
moves bytes, so the two backends give the same bits wherever their ``all_reduce`` does: at
N = 2 (a sum of two numbers is the same bits in either order) the parameters end bitwise
identical. ``--check-gloo`` (2 ranks) shows it in one launch: after the bmlmpi run it trains
again from the same start on a gloo group made beside it and compares every rank's parameters
and every step's loss bit for bit (``tests/test_torch_moe.py`` runs it). Rank 0 prints each
epoch's mean loss and the held-out accuracy and writes ``--out`` (JSON: losses, accuracy, every
rank's split sizes at each step, each step's seconds, the SHA-256 of every rank's parameters,
whether the replicated parameters are identical on every rank, and with ``--check-gloo``
gloo's digests and losses and whether they are identical). Exit status 3 when the replicated
parameters differ between ranks, 4 when gloo's run differs from bmlmpi's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

from job_options import add_loop_options

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError:
    sys.exit("train_moe: needs PyTorch, the torch extra: pip install '.[torch]' (the CPU "
             "build: see docs/torch.md)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_loop_options(p, "train_moe", epochs=2, steps_help="stop after this many steps in all")
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--width", type=int, default=32, help="token width inside the model")
    p.add_argument("--hidden", type=int, default=64, help="an expert's hidden width")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--backend", choices=["bmlmpi", "gloo"], default="bmlmpi")
    p.add_argument("--algorithm", default=os.environ.get("BMLMPI_ALGORITHM", "auto"),
                   help="the bmlmpi world group's algorithm (its all_reduce's)")
    p.add_argument("--alltoall", default=None,
                   help="run the experts' exchanges on a bmlmpi group of their own with this "
                        "all-to-all algorithm (bmlmpi.algorithms('alltoall'); default: the "
                        "world group)")
    p.add_argument("--timeout", type=float, default=None, help="deadline of every wait (s)")
    p.add_argument("--check-gloo", action="store_true",
                   help="train again from the same start on a gloo group beside the bmlmpi "
                        "one and compare bit for bit (2 ranks; exit status 4 if they differ)")
    p.add_argument("--out", default=None, help="JSON report (rank 0)")
    a = p.parse_args(argv)
    if a.experts_per_rank < 1:
        p.error("--experts-per-rank must be at least 1")
    if a.batch < 1:
        p.error("--batch must be at least 1")
    if (a.alltoall or a.check_gloo) and a.backend != "bmlmpi":
        p.error("--alltoall and --check-gloo need --backend bmlmpi")
    return a


class Exchange(torch.autograd.Function):
    """``all_to_all_single`` with autograd: forward sends ``send[j]`` rows to rank j and
    receives ``recv[i]`` from rank i; backward sends the gradients back the same way, split
    sizes swapped."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


def expert(width: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, width))


class MoEClassifier(torch.nn.Module):
    """Embedding, one expert-parallel MoE layer (this rank's experts only), head."""

    def __init__(self, a: argparse.Namespace, rank: int, size: int, group):
        super().__init__()
        self.group, self.size = group, size
        self.local = a.experts_per_rank
        total = self.local * size
        # every rank draws every expert from the same seed and keeps its own, so the model
        # does not depend on the rank count's split of the experts
        self.embed = torch.nn.Linear(64, a.width)
        self.router = torch.nn.Linear(a.width, total)
        self.head = torch.nn.Linear(a.width, 10)
        every = [expert(a.width, a.hidden) for _ in range(total)]
        self.experts = torch.nn.ModuleList(every[rank * self.local:(rank + 1) * self.local])

    def replicated(self) -> list[torch.nn.Parameter]:
        """The parameters every rank holds (their gradients are averaged)."""
        return [*self.embed.parameters(), *self.router.parameters(), *self.head.parameters()]

    def forward(self, x: torch.Tensor, splits: list | None = None) -> torch.Tensor:
        h = F.relu(self.embed(x))
        return self.head(h + self.moe(h, splits))

    def moe(self, h: torch.Tensor, splits: list | None) -> torch.Tensor:
        n, local = self.size, self.local
        probs = F.softmax(self.router(h), dim=-1)
        weight, choice = probs.max(dim=-1)                  # top-1 expert of every token
        order = torch.argsort(choice, stable=True)          # tokens grouped by expert
        per_expert = torch.bincount(choice, minlength=n * local)
        # how many tokens of each of my experts every rank sends me
        incoming = torch.empty_like(per_expert)
        dist.all_to_all_single(incoming, per_expert, group=self.group)
        send = per_expert.view(n, local).sum(1).tolist()
        recv = incoming.view(n, local).sum(1).tolist()
        if splits is not None:
            splits.append(send)
        received = Exchange.apply(h[order], send, recv, self.group)
        # the tokens came by source rank, each source's by expert: run each expert on its own
        mine = torch.arange(local).repeat(n).repeat_interleave(incoming)
        by_expert = torch.argsort(mine, stable=True)
        pieces = torch.split(received[by_expert], torch.bincount(mine, minlength=local).tolist())
        done = torch.cat([e(t) for e, t in zip(self.experts, pieces, strict=True)])
        out = torch.empty_like(done).index_copy(0, by_expert, done)
        back = Exchange.apply(out, recv, send, self.group)
        combined = torch.empty_like(back).index_copy(0, order, back)
        return combined * weight.unsqueeze(1)


def load_data() -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, held = order[:-360], order[-360:]
    return x[train], y[train], x[held], y[held]


def init(a: argparse.Namespace):
    """(the replicated parameters' group, the experts' group, a gloo group for
    ``--check-gloo`` or None)."""
    from mpi4py import MPI

    import bmlmpi.torch
    expect = os.environ.get("BMLMPI_EXPECT_SIZE")   # set by the jobs/ scripts
    if expect and int(expect) != MPI.COMM_WORLD.size:
        raise SystemExit(f"train_moe: the MPI world has {MPI.COMM_WORLD.size} ranks, the job "
                         f"asked for {expect} (launcher and MPI library disagree?)")
    if a.backend == "gloo":
        comm = MPI.COMM_WORLD
        dist.init_process_group("gloo", store=bmlmpi.torch.store_from_mpi(comm),
                                rank=comm.rank, world_size=comm.size)
        return dist.group.WORLD, dist.group.WORLD, None
    if a.check_gloo and MPI.COMM_WORLD.size != 2:
        raise SystemExit(f"train_moe: --check-gloo compares bits, which it may at 2 ranks "
                         f"only, where a sum of two is the same in either order (with more, "
                         f"gloo's all_reduce and bmlmpi's may add in different orders); this "
                         f"job has {MPI.COMM_WORLD.size}")
    options = bmlmpi.torch.Options(algorithm=a.algorithm, timeout=a.timeout)
    world = bmlmpi.torch.init_process_group(options=options)
    experts = world
    if a.alltoall:
        # a group's algorithm serves every collective it runs: all-to-all's algorithms have
        # no all_reduce, so the exchanges get a group of their own
        experts = dist.new_group(backend="bmlmpi", pg_options=bmlmpi.torch.Options(
            algorithm=a.alltoall, timeout=a.timeout))
    control = dist.new_group(backend="gloo") if a.check_gloo else None
    return world, experts, control


def average_gradients(model: MoEClassifier, size: int, group) -> None:
    """Replicated parameters: one all_reduce of their gradients, divided by N. Experts: the
    exchange's backward summed every rank's share into them; divided by N as well."""
    replicated = model.replicated()
    flat = torch.cat([p.grad.reshape(-1) for p in replicated])
    dist.all_reduce(flat, group=group)
    flat /= size
    at = 0
    for p in replicated:
        p.grad.copy_(flat[at:at + p.numel()].view(p.shape))
        at += p.numel()
    for p in model.experts.parameters():
        if p.grad is not None:
            p.grad /= size


def identical(group, params: list[torch.nn.Parameter]) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in params]).double()
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    return bool(torch.equal(hi, lo))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def train(a: argparse.Namespace, group, experts_group, backend: str) -> dict:
    """``--epochs`` of training from the seed's start: the replicated parameters' gradients
    averaged on ``group``, the tokens exchanged on ``experts_group``."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(a.seed)
    model = MoEClassifier(a, rank, size, experts_group)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    xtr, ytr, xte, yte = load_data()
    global_batch = a.batch * size
    steps_per_epoch = len(xtr) // global_batch
    losses, history, splits, step_seconds, step = [], [], [], [], 0
    started = time.perf_counter()
    for epoch in range(a.epochs):
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(a.seed + epoch))
        total = 0.0
        for s in range(steps_per_epoch):
            if a.steps is not None and step >= a.steps:
                break
            idx = perm[s * global_batch:(s + 1) * global_batch].tensor_split(size)[rank]
            begun = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx], splits), ytr[idx])
            loss.backward()
            average_gradients(model, size, group)
            opt.step()
            step_seconds.append(time.perf_counter() - begun)
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=group)
            losses.append(float(mean) / size)
            total += losses[-1]
            step += 1
        done = step - sum(h["steps"] for h in history)
        if not done:
            break
        with torch.no_grad():
            correct = (model(xte).argmax(1) == yte).sum().to(torch.float64)
        # every rank ran the held-out set through the same experts (all of them took part)
        history.append({"epoch": epoch + 1, "steps": done, "loss": total / done,
                        "accuracy": float(correct) / len(yte)})
        if rank == 0:
            print(f"epoch {epoch + 1:3d}  loss {total / done:.4f}  accuracy "
                  f"{history[-1]['accuracy']:.4f}", flush=True)
    seconds = time.perf_counter() - started
    every_splits = [None] * size
    dist.all_gather_object(every_splits, splits, group=group)
    digests = [None] * size
    dist.all_gather_object(digests, digest(model), group=group)
    same = identical(group, model.replicated())
    return {"backend": backend, "algorithm": a.algorithm if backend == "bmlmpi" else None,
            "alltoall": a.alltoall if backend == "bmlmpi" else None, "world_size": size,
            "experts": a.experts_per_rank * size,
            "experts_per_rank": a.experts_per_rank, "steps": step, "batch_per_rank": a.batch,
            "losses": losses, "history": history,
            "accuracy": history[-1]["accuracy"] if history else None,
            "split_sizes": every_splits, "params_sha256": digests,
            "replicated_identical": same, "seconds": seconds, "step_seconds": step_seconds,
            "rank": rank}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import sklearn  # noqa: F401 - load_data's
    except ImportError:
        sys.exit("train_moe: needs scikit-learn, the train extra: pip install '.[train]'")
    group, experts_group, control = init(a)
    result = train(a, group, experts_group, a.backend)
    if control is not None:
        gloo = train(a, control, control, "gloo")
        result["gloo"] = {k: gloo[k] for k in ("params_sha256", "losses", "accuracy")}
        result["gloo_identical"] = (gloo["params_sha256"] == result["params_sha256"]
                                    and gloo["losses"] == result["losses"])
    if result["rank"] == 0:
        print(f"train_moe: {result['steps']} steps on {result['world_size']} ranks, "
              f"{result['experts']} experts, backend {a.backend}, accuracy "
              f"{result['accuracy']}, replicated parameters identical on every rank: "
              f"{result['replicated_identical']}", flush=True)
        if control is not None:
            print(f"train_moe: the same steps on gloo ended with bitwise identical parameters "
                  f"and losses: {result['gloo_identical']}", flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=2)
    dist.destroy_process_group()
    if not result["replicated_identical"]:
        return 3
    return 4 if result.get("gloo_identical") is False else 0


if __name__ == "__main__":
    sys.exit(main())
