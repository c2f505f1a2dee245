"""Data-parallel training that loses a rank mid-training and finishes with the survivors.

The model, data and shards are those of ``jobs/train_example.py`` (a two-layer numpy MLP on
Gaussian clusters); the gradients are reduced over a fault-tolerant communicator
(``bmlmpi.Communicator(..., fault_tolerant=True)``). When ranks die, the allreduce in flight
completes over the survivors, and before the next step every survivor

* takes a new shard of the dataset (the samples split over the survivors, so none is lost),
* rescales its mini-batch with ``bmlmpi.rescaled_batch(u, N, x, rank=...)`` so that the
  survivors still process the original global batch u·N per step (the BML slides' u + u·x/(N−x);
  the integer split adds up exactly),

and training goes on with the same learning rate. The gradient is reduced as a weighted sum
(each rank's mean gradient times its batch size, plus the batch size itself) and divided by
the total, so ranks with batches one sample apart are weighted exactly.

    bmlmpi-run --ft -n 4 python jobs/train_resilient.py --steps 60 --kill-rank 2 --kill-step 20

``--kill-how``: kill (SIGKILL, default), raise (an uncaught exception), exit (os._exit(0)),
stop (SIGSTOP: a hung rank, fenced by the heartbeat after ``--hang-timeout`` seconds).
The lowest surviving rank prints the loss every ``--eval-every`` steps and a summary, and
writes ``--out`` (JSON). Exit status 3 when the survivors' parameters differ.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI
from train_example import MLP, make_dataset, shard_bounds

import bmlmpi
from bmlmpi import ft


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (u)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--algorithm", default=os.environ.get("BMLMPI_ALGORITHM", "bml"))
    p.add_argument("--topology", default=None, help="BCube shape, e.g. 2x2")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--kill-rank", type=int, action="append", default=[], metavar="R")
    p.add_argument("--kill-step", type=int, action="append", default=[], metavar="S")
    p.add_argument("--kill-how", default="kill", choices=["kill", "raise", "exit", "stop"])
    p.add_argument("--timeout", type=float, default=None, help="deadline of every wait (s)")
    p.add_argument("--hang-timeout", type=float, default=None,
                   help="heartbeat age that gets a hung rank fenced (s)")
    p.add_argument("--out", default=None, help="JSON results (written by the lowest survivor)")
    args = p.parse_args(argv)
    if len(args.kill_rank) != len(args.kill_step):
        p.error("give one --kill-step per --kill-rank")
    if args.steps < 0 or args.batch < 1 or args.eval_every < 1:
        p.error("--steps must be >= 0, --batch and --eval-every >= 1")
    return args


def die(how: str) -> None:
    print(f"train_resilient: rank {MPI.COMM_WORLD.rank} dies ({how})", file=sys.stderr,
          flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise RuntimeError("train_resilient: this rank fails on purpose")
    elif how == "exit":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)


class Trainer:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.world = MPI.COMM_WORLD.size
        self.comm = bmlmpi.Communicator(MPI.COMM_WORLD, algorithm=args.algorithm,
                                        topology=args.topology, fault_tolerant=True,
                                        timeout=args.timeout, hang_timeout=args.hang_timeout,
                                        on_failure=self.on_failure)
        x, y = make_dataset(args.seed, args.samples, args.features, args.classes)
        self.x = (x - x.mean(axis=0)) / x.std(axis=0)
        self.y = y
        n = MLP.size(args.features, args.hidden, args.classes)
        # every rank draws the same initial parameters from the seed
        self.flat = np.random.default_rng(args.seed + 1).normal(0.0, 0.3, size=n)
        self.model = MLP.views(self.flat, args.features, args.hidden, args.classes)
        self.grad = MLP.views(np.empty(n), args.features, args.hidden, args.classes)
        self.events: list[dict] = []
        self.step = 0
        self.reshard()

    def on_failure(self, comm: ft.FaultTolerantCommunicator, lost: tuple[int, ...]) -> None:
        self.events.append({"step": self.step, "lost": list(lost), "survivors": comm.size})
        self.reshard()

    def reshard(self) -> None:
        """This survivor's shard and mini-batch for the current set of survivors."""
        c, a = self.comm, self.args
        lo, hi = shard_bounds(a.samples, c.size, c.rank)
        self.shard = np.arange(lo, hi)
        self.batch = bmlmpi.rescaled_batch(a.batch, self.world, self.world - c.size,
                                           rank=c.rank)
        self.order = np.random.default_rng([a.seed, self.step, c.original_rank]).permutation(
            self.shard)
        self.cursor = 0

    def next_batch(self) -> np.ndarray:
        if self.cursor + self.batch > len(self.order):
            self.order = np.random.default_rng(
                [self.args.seed, self.step, self.comm.original_rank]).permutation(self.shard)
            self.cursor = 0
        idx = self.order[self.cursor:self.cursor + self.batch]
        self.cursor += self.batch
        return idx

    def evaluate(self) -> tuple[float, float]:
        loss, correct = self.model.loss_sum(self.x[self.shard], self.y[self.shard])
        out = self.comm.allreduce(np.array([loss, float(correct)]), op=MPI.SUM)
        return out[0] / self.args.samples, out[1] / self.args.samples

    def train(self) -> dict:
        a = self.args
        kills = dict(zip(a.kill_step, a.kill_rank, strict=True))
        history = []
        started = time.perf_counter()
        buf = np.empty(self.flat.size + 1)
        for self.step in range(a.steps):
            if self.step % a.eval_every == 0:
                history.append(self.record())
            if kills.get(self.step) == self.comm.original_rank:
                die(a.kill_how)
            idx = self.next_batch()
            self.model.gradient(self.x[idx], self.y[idx], self.grad)
            buf[:-1] = self.grad.flat * len(idx)
            buf[-1] = len(idx)
            total = self.comm.allreduce(buf, op=MPI.SUM)
            self.flat -= a.lr * total[:-1] / total[-1]
        self.step = a.steps
        history.append(self.record())
        return {"world_size": self.world, "survivors": self.comm.size,
                "failed": list(self.comm.failed), "events": self.events,
                "algorithm": a.algorithm, "steps": a.steps, "batch_per_rank": a.batch,
                "final_batch_per_rank": self.batch, "history": history,
                "seconds": time.perf_counter() - started}

    def record(self) -> dict:
        loss, acc = self.evaluate()
        if self.comm.rank == 0:
            print(f"step {self.step:4d}  ranks {self.comm.size}  batch {self.batch:3d}  "
                  f"loss {loss:.4f}  accuracy {acc:.3f}", flush=True)
        return {"step": self.step, "ranks": self.comm.size, "loss": loss, "accuracy": acc}

    def parameters_identical(self) -> bool:
        hi = self.comm.allreduce(self.flat, op=MPI.MAX)
        lo = self.comm.allreduce(self.flat, op=MPI.MIN)
        return bool(np.array_equal(hi, lo))


def main(argv: list[str] | None = None) -> int:
    ft.install_exit_handlers()
    args = parse_args(argv)
    trainer = Trainer(args)
    result = trainer.train()
    result["params_identical"] = trainer.parameters_identical()
    if trainer.comm.rank == 0:
        first, last = result["history"][0], result["history"][-1]
        print(f"train_resilient: {args.steps} steps, {result['world_size']} -> "
              f"{result['survivors']} ranks (lost {result['failed']}), loss "
              f"{first['loss']:.4f} -> {last['loss']:.4f}, parameters identical on every "
              f"survivor: {result['params_identical']}", flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
    return 0 if result["params_identical"] else 3


if __name__ == "__main__":
    ft.finish(main())
