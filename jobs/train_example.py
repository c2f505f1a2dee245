"""Data-parallel training with bmlmpi: a two-layer MLP (numpy) on a synthetic dataset.

Every rank builds the same dataset from the seed and trains on its own shard; after every step the
gradients are averaged over all ranks with `bmlmpi.Allreduce(..., op=bmlmpi.AVG)`, one call on the
whole flat gradient (as frameworks bucket gradients), and each rank takes the same SGD step.
Rank 0 prints the loss and accuracy over the full dataset after every epoch. At the end the job
checks that every rank holds bit-identical parameters and fails otherwise.

    mpiexec -n 4 python jobs/train_example.py --epochs 5 --out train.json
    srun -n 4 --mpi=pmix python jobs/train_example.py --expect-size 4

Options also come from the environment: BMLMPI_TRAIN_EPOCHS, BMLMPI_TRAIN_STEPS,
BMLMPI_TRAIN_BATCH, BMLMPI_TRAIN_OUT, BMLMPI_ALGORITHM, BMLMPI_EXPECT_SIZE.
Exit status: 2 when the world has the wrong size, 3 when the ranks' parameters differ.
`--kill-rank R --kill-step S` makes rank R die (SIGKILL) at step S, to exercise failure handling.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
from check_world import expected_size, mismatch_message
from job_options import add_loop_options
from mpi4py import MPI

import bmlmpi


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_loop_options(p, "train_example", epochs=5,
                     steps_help="stop after this many steps in all (default: run every epoch)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--algorithm", default=os.environ.get("BMLMPI_ALGORITHM", "auto"))
    p.add_argument("--out", default=os.environ.get("BMLMPI_TRAIN_OUT") or None,
                   help="JSON file for the results (written by rank 0)")
    p.add_argument("--expect-size", type=int, default=None, metavar="N",
                   help="fail unless the MPI world has N ranks (env BMLMPI_EXPECT_SIZE)")
    p.add_argument("--kill-rank", type=int, default=None, metavar="R")
    p.add_argument("--kill-step", type=int, default=None, metavar="S")
    args = p.parse_args(argv)
    for name in ("epochs", "batch", "samples", "features", "hidden", "classes"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.steps is not None and args.steps < 0:
        p.error("--steps must not be negative")
    if (args.kill_rank is None) != (args.kill_step is None):
        p.error("--kill-rank and --kill-step go together")
    return args


def make_dataset(seed: int, samples: int, features: int, classes: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters, two per class, so that a linear model is not enough."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, size=(2 * classes, features))
    cluster = rng.integers(0, 2 * classes, size=samples)
    x = centres[cluster] + rng.normal(0.0, 1.5, size=(samples, features))
    return x, cluster % classes


@dataclass
class MLP:
    """Parameters live in one flat vector; the weight matrices are views into it."""

    flat: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    @classmethod
    def views(cls, flat: np.ndarray, features: int, hidden: int, classes: int) -> MLP:
        shapes = [(features, hidden), (hidden,), (hidden, classes), (classes,)]
        parts, start = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            parts.append(flat[start:start + size].reshape(shape))
            start += size
        if start != flat.size:
            raise ValueError(f"flat vector has {flat.size} elements, the model needs {start}")
        return cls(flat, *parts)

    @staticmethod
    def size(features: int, hidden: int, classes: int) -> int:
        return features * hidden + hidden + hidden * classes + classes

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.tanh(x @ self.w1 + self.b1)
        logits = h @ self.w2 + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return h, p

    def loss_sum(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """Summed cross-entropy and number of correct predictions."""
        _, p = self.forward(x)
        picked = p[np.arange(len(y)), y]
        return float(-np.log(np.maximum(picked, 1e-300)).sum()), int((p.argmax(1) == y).sum())

    def gradient(self, x: np.ndarray, y: np.ndarray, grad: MLP) -> float:
        """Writes the gradient of the mean cross-entropy into grad; returns the mean loss."""
        h, p = self.forward(x)
        n = len(y)
        loss = float(-np.log(np.maximum(p[np.arange(n), y], 1e-300)).mean())
        d_logits = p
        d_logits[np.arange(n), y] -= 1.0
        d_logits /= n
        grad.w2[...] = h.T @ d_logits
        grad.b2[...] = d_logits.sum(axis=0)
        d_h = (d_logits @ self.w2.T) * (1.0 - h * h)
        grad.w1[...] = x.T @ d_h
        grad.b1[...] = d_h.sum(axis=0)
        return loss


def shard_bounds(samples: int, size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(samples, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def evaluate(model: MLP, x: np.ndarray, y: np.ndarray, comm: MPI.Comm,
             algorithm: str, total: int) -> tuple[float, float]:
    """Mean loss and accuracy over the whole dataset: each rank scores its shard, then a sum."""
    loss, correct = model.loss_sum(x, y)
    local = np.array([loss, float(correct)])
    summed = np.empty_like(local)
    bmlmpi.Allreduce(local, summed, op=MPI.SUM, comm=comm, algorithm=algorithm)
    return summed[0] / total, summed[1] / total


def parameters_identical(flat: np.ndarray, comm: MPI.Comm) -> list[int]:
    """Ranks whose parameters differ bitwise from rank 0's, checked with plain MPI."""
    reference = flat.copy()
    comm.Bcast(reference, root=0)
    same = bool(np.array_equal(reference.view(np.uint64), flat.view(np.uint64)))
    flags = comm.allgather(same)
    return [r for r, ok in enumerate(flags) if not ok]


def train(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    rank, size = comm.rank, comm.size
    x, y = make_dataset(args.seed, args.samples, args.features, args.classes)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    lo, hi = shard_bounds(args.samples, size, rank)
    x_shard, y_shard = x[lo:hi], y[lo:hi]
    # Every rank must make the same number of allreduce calls, so the smallest shard sets it.
    steps_per_epoch = (args.samples // size) // args.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"train_example: --batch {args.batch} is larger than a shard "
                         f"({args.samples // size} samples on {size} ranks)")

    nparams = MLP.size(args.features, args.hidden, args.classes)
    flat = np.random.default_rng(args.seed + 1).normal(0.0, 0.3, size=nparams)
    comm.Bcast(flat, root=0)  # as frameworks do, so that all ranks start from one model
    model = MLP.views(flat, args.features, args.hidden, args.classes)
    grad = MLP.views(np.empty(nparams), args.features, args.hidden, args.classes)
    avg = np.empty(nparams)

    history: list[dict] = []

    def record(epoch: int) -> None:
        loss, acc = evaluate(model, x_shard, y_shard, comm, args.algorithm, args.samples)
        history.append({"epoch": epoch, "loss": loss, "accuracy": acc})
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {loss:.4f}  accuracy {acc:.3f}", flush=True)

    record(0)
    step = 0
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng([args.seed, epoch, rank]).permutation(len(y_shard))
        for s in range(steps_per_epoch):
            if args.steps is not None and step >= args.steps:
                break
            if rank == args.kill_rank and step == args.kill_step:
                print(f"train_example: rank {rank} killing itself at step {step}",
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            batch = order[s * args.batch:(s + 1) * args.batch]
            model.gradient(x_shard[batch], y_shard[batch], grad)
            bmlmpi.Allreduce(grad.flat, avg, op=bmlmpi.AVG, comm=comm, algorithm=args.algorithm)
            flat -= args.lr * avg
            step += 1
        record(epoch)
        if args.steps is not None and step >= args.steps:
            break
    seconds = time.perf_counter() - started

    return {
        "world_size": size,
        "algorithm": args.algorithm,
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "batch_per_rank": args.batch,
        "global_batch": args.batch * size,
        "parameters": nparams,
        "history": history,
        "seconds": seconds,
        "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
        "flat": flat,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    expected = expected_size(args.expect_size)
    if expected is not None and comm.size != expected:
        if comm.rank == 0:
            print(f"train_example: error: {mismatch_message(comm.size, expected)}",
                  file=sys.stderr, flush=True)
        return 2

    result = train(args, comm)
    flat = result.pop("flat")
    differing = parameters_identical(flat, comm)
    result["params_identical"] = not differing
    result["param_checksum"] = float(np.abs(flat).sum())
    if comm.rank == 0:
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
        first, last = result["history"][0], result["history"][-1]
        print(f"train_example: {result['steps']} steps on {comm.size} ranks, loss "
              f"{first['loss']:.4f} -> {last['loss']:.4f}, {result['seconds']:.2f} s", flush=True)
        if differing:
            print(f"train_example: error: parameters differ from rank 0's on ranks {differing}",
                  file=sys.stderr, flush=True)
    return 3 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
