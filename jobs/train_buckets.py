"""Data-parallel training with ``bmlmpi.GradientBuckets``: an 11-layer MLP (numpy, hand-written
backward) on scikit-learn's handwritten digits.

Every rank holds the same model; each step the global batch of ``ranks × batch`` samples is cut
into one slice per rank; the backward pass marks each layer's gradient ready as soon as it is
computed (the last layer first), and the buckets' allreduces (``op=bmlmpi.AVG``) run while the
backward pass goes on. The SGD update of layer i is applied lazily, in the next forward pass,
right after ``wait(i)`` (so a plan that reduces the front layers last hides their allreduce
behind the forward pass). After every epoch every rank evaluates the loss over the whole
training set.

``--shard`` trains ZeRO-1 style instead of through the buckets: the parameters and gradients
are one flat float64 vector cut into one shard per rank; each step reduce-scatters the
gradients (``Communicator.Reduce_scatter``, ``op=bmlmpi.AVG``: each rank receives the average
of its shard), updates its shard of the parameters, and allgathers the parameters
(``Communicator.Allgatherv`` in place). It gives the parameters of the allreduce run (same
averages, same updates) to float rounding. ``--params-out FILE`` saves rank 0's final
parameters (``.npy``; with several plans, the last run's) to compare runs. Under Slurm or
the mpirun scripts: ``BMLMPI_TRAIN_ARGS=--shard``.

``--reference`` trains the same model in one process on the summed batch (all ``ranks``
slices at once): its losses are what the distributed run must reproduce to float rounding
(the mean over the global batch versus the average of the ranks' means; float64).

The data set: ``sklearn.datasets.load_digits`` (1797 8×8 images, 10 classes; ``pip install
'.[train]'``); without scikit-learn a generated set of the same shape stands in (noisy
class prototypes), and the output says which was used.

    mpiexec -n 4 python jobs/train_buckets.py --plan ibatch --epochs 3 --out train.json
    python jobs/train_buckets.py --reference --ranks 4 --epochs 3

Options also come from the environment: BMLMPI_TRAIN_EPOCHS, BMLMPI_TRAIN_STEPS,
BMLMPI_TRAIN_BATCH, BMLMPI_TRAIN_OUT, BMLMPI_PLAN, BMLMPI_FUSION_BYTES, BMLMPI_EXPECT_SIZE.
Exit status: 2 when the world has the wrong size, 3 when the ranks' parameters differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from job_options import add_loop_options
from job_options import env_int as _env_int

WIDTHS = (64, 512, 96, 384, 32, 256, 448, 64, 320, 128, 192, 10)   # 11 layers, uneven
PLANS = ("layer", "single", "threshold", "ibatch")


def env_int(name: str, default: int | None) -> int | None:
    return _env_int(name, default, "train_buckets")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_loop_options(
        p, "train_buckets", epochs=3,
        steps_help="stop each epoch after this many steps (default: the whole set)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--plan", default=os.environ.get("BMLMPI_PLAN", "threshold"),
                   help="layer, single, threshold or ibatch; a comma list trains once per "
                        "plan, one after another, from the same initial model")
    p.add_argument("--fusion-bytes", type=int, default=env_int("BMLMPI_FUSION_BYTES", None))
    p.add_argument("--algorithm", default=os.environ.get("BMLMPI_ALGORITHM", "auto"))
    p.add_argument("--dataset", choices=["auto", "digits", "generated"], default="auto")
    p.add_argument("--reference", action="store_true",
                   help="train in one process on the summed batch of --ranks ranks")
    p.add_argument("--ranks", type=int, default=None, help="with --reference: the N to mimic")
    p.add_argument("--timeline", default=None,
                   help="JSON file for one iteration's compute and allreduce intervals per rank")
    p.add_argument("--out", default=os.environ.get("BMLMPI_TRAIN_OUT") or None,
                   help="JSON file for the results (written by rank 0)")
    p.add_argument("--expect-size", type=int, default=None, metavar="N")
    p.add_argument("--shard", action="store_true",
                   help="ZeRO-1: reduce-scatter the gradients, update the local shard, "
                        "allgather the parameters (instead of the buckets' allreduces)")
    p.add_argument("--params-out", default=None,
                   help=".npy file for rank 0's final parameters (flat, float64)")
    p.add_argument("--compression", default="none",
                   help="gradient compression (bmlmpi.compression spec): none, fp16, bf16, "
                        "threshold:PHI[:D], random:P[:SEED], tdf:PHI:D:P[:WIRE], topk:K, "
                        "topk:RATIO; @sparse or "
                        "@dense after it pins the exchange")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1:
        p.error("--epochs and --batch must be at least 1")
    if args.reference and (args.ranks is None or args.ranks < 1):
        p.error("--reference needs --ranks N (N >= 1)")
    try:
        from bmlmpi.compression import parse
        parse(args.compression)
    except (ValueError, TypeError) as exc:
        p.error(f"--compression: {exc}")
    args.plans = [s.strip() for s in args.plan.split(",") if s.strip()]
    bad = [s for s in args.plans if s not in PLANS]
    if bad or not args.plans:
        p.error(f"--plan: unknown plan(s) {bad}; plans: {', '.join(PLANS)}")
    return args


def load_dataset(which: str, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    if which in ("auto", "digits"):
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            if which == "digits":
                raise SystemExit("train_buckets: --dataset digits needs scikit-learn "
                                 "(pip install '.[train]')") from None
        else:
            d = load_digits()
            return d.data / 16.0, d.target.astype(np.int64), "sklearn digits"
    rng = np.random.default_rng(seed)
    prototypes = rng.random((10, 64))
    y = rng.integers(0, 10, size=1797)
    x = np.clip(prototypes[y] + rng.normal(0, 0.25, size=(1797, 64)), 0, 1)
    return x, y, "generated digits-like"


class MLP:
    """tanh layers, softmax output; parameters and gradients as lists of arrays in forward
    order (W0, b0, W1, b1, ...)."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.params: list[np.ndarray] = []
        for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
            self.params.append(rng.normal(0, 1 / np.sqrt(fan_in), size=(fan_in, fan_out)))
            self.params.append(np.zeros(fan_out))
        self.layers = len(WIDTHS) - 1

    def shapes(self) -> list[tuple[int, ...]]:
        return [p.shape for p in self.params]

    def forward(self, x: np.ndarray, before_layer=None, clock=None) -> list[np.ndarray]:
        acts = [x]
        h = x
        for layer in range(self.layers):
            if before_layer is not None:
                before_layer(layer)
            t0 = time.perf_counter()
            w, b = self.params[2 * layer], self.params[2 * layer + 1]
            z = h @ w + b
            h = np.tanh(z) if layer < self.layers - 1 else z
            acts.append(h)
            if clock is not None:
                clock.append(("forward", layer, t0, time.perf_counter()))
        return acts

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.forward(x)[-1].argmax(axis=1) == y).mean())

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        logits = self.forward(x)[-1]
        logits = logits - logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(y)), y].mean())

    def backward(self, acts: list[np.ndarray], y: np.ndarray, grads: list[np.ndarray],
                 ready=None, clock=None) -> None:
        """Gradient of the mean cross-entropy into ``grads``, last layer first; ``ready(i)``
        after each array is written."""
        logits = acts[-1]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        d = p
        d[np.arange(len(y)), y] -= 1.0
        d /= len(y)
        for layer in range(self.layers - 1, -1, -1):
            t0 = time.perf_counter()
            np.matmul(acts[layer].T, d, out=grads[2 * layer])
            np.sum(d, axis=0, out=grads[2 * layer + 1])
            if layer:
                d = (d @ self.params[2 * layer].T) * (1.0 - acts[layer] ** 2)
            if clock is not None:
                clock.append(("backward", layer, t0, time.perf_counter()))
            if ready is not None:
                ready(2 * layer + 1)
                ready(2 * layer)


def epoch_order(seed: int, epoch: int, samples: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(samples)


def train_reference(args: argparse.Namespace) -> dict:
    x, y, source = load_dataset(args.dataset, args.seed)
    model = MLP(args.seed)
    grads = [np.zeros_like(p) for p in model.params]
    glob = args.batch * args.ranks
    steps = len(y) // glob if args.steps is None else min(args.steps, len(y) // glob)
    losses = [model.loss(x, y)]
    for epoch in range(1, args.epochs + 1):
        order = epoch_order(args.seed, epoch, len(y))
        for s in range(steps):
            idx = order[s * glob:(s + 1) * glob]
            model.backward(model.forward(x[idx]), y[idx], grads)
            for p, g in zip(model.params, grads, strict=True):
                p -= args.lr * g
        losses.append(model.loss(x, y))
        print(f"epoch {epoch:3d}  loss {losses[-1]:.10f}", flush=True)
    return {"reference": True, "ranks": args.ranks, "dataset": source, "losses": losses,
            "steps_per_epoch": steps, "global_batch": glob}


def train(args: argparse.Namespace, comm, plan: str) -> dict:
    from mpi4py import MPI

    import bmlmpi

    rank, size = comm.rank, comm.size
    x, y, source = load_dataset(args.dataset, args.seed)
    model = MLP(args.seed)
    grads = [np.zeros_like(p) for p in model.params]
    communicator = bmlmpi.Communicator(comm, algorithm=args.algorithm)
    buckets = bmlmpi.GradientBuckets(grads, comm=communicator, op=bmlmpi.AVG, plan=plan,
                                     fusion_bytes=args.fusion_bytes,
                                     compression=args.compression)
    glob = args.batch * size
    steps = len(y) // glob if args.steps is None else min(args.steps, len(y) // glob)
    if steps == 0:
        raise SystemExit(f"train_buckets: the global batch {glob} exceeds the {len(y)} samples")
    pending = [False] * model.layers

    def update(layer: int) -> None:
        # the lazy SGD step: layer's reduced gradient is needed only now
        if pending[layer]:
            for i in (2 * layer, 2 * layer + 1):
                buckets.wait(i)
                model.params[i] -= args.lr * grads[i]
            pending[layer] = False

    def flush() -> None:
        buckets.wait()
        for layer in range(model.layers):
            update(layer)

    losses = [model.loss(x, y)]
    accuracies = [model.accuracy(x, y)]
    if rank == 0:
        print(f"train_buckets: {size} ranks, plan {plan}, {source}, "
              f"{sum(p.size for p in model.params)} parameters in {len(grads)} arrays, "
              f"{steps} steps per epoch", flush=True)
    step_times: list[float] = []
    timeline: dict | None = None
    clock: list = []
    total_steps = steps * args.epochs
    record_at = total_steps - 2 if total_steps >= 3 else -1
    n = 0
    for epoch in range(1, args.epochs + 1):
        order = epoch_order(args.seed, epoch, len(y))
        for s in range(steps):
            idx = order[s * glob + rank * args.batch:s * glob + (rank + 1) * args.batch]
            # the timeline: step record_at's backward, its allreduces and the next forward
            recording = n in (record_at, record_at + 1) and args.timeline is not None
            buckets.record_timeline = recording
            t0 = time.perf_counter()
            acts = model.forward(x[idx], before_layer=update, clock=clock if recording else None)
            if n == record_at + 1 and timeline is not None:
                timeline["end"] = time.perf_counter()
                timeline["comm"] = [c for c in buckets.timeline() if c[2] >= timeline["t0"]]
            if n == record_at and args.timeline is not None:
                clock = []
                timeline = {"t0": time.perf_counter(), "compute": clock,
                            "buckets": buckets.buckets}
            model.backward(acts, y[idx], grads, ready=buckets.mark_ready,
                           clock=clock if n == record_at else None)
            pending[:] = [True] * model.layers
            step_times.append(time.perf_counter() - t0)
            n += 1
        flush()
        losses.append(model.loss(x, y))
        accuracies.append(model.accuracy(x, y))
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {losses[-1]:.10f}  accuracy {accuracies[-1]:.4f}",
                  flush=True)
    buckets.close()
    flat = np.concatenate([p.reshape(-1) for p in model.params])
    params = flat
    first = flat.copy()
    comm.Bcast(first, root=0)
    differ = comm.allgather(not np.array_equal(first.view(np.uint64), flat.view(np.uint64)))
    timelines = comm.gather(timeline, root=0) if args.timeline else None
    warm = step_times[min(len(step_times) // 4, 10):] or step_times
    result = {"ranks": size, "plan": plan, "fusion_bytes": args.fusion_bytes,
              "algorithm": args.algorithm, "dataset": source, "losses": losses,
              "accuracies": accuracies, "compression": args.compression,
              "steps_per_epoch": steps, "global_batch": glob,
              "buckets": [list(b) for b in buckets.buckets],
              "step_seconds_median": float(np.median(warm)),
              "step_seconds_mean": float(np.mean(warm)),
              "ranks_with_other_parameters": [r for r, d in enumerate(differ) if d],
              "params": params,
              "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0]}
    if buckets.compression is not None:
        # bytes this rank sent for its gradients, per training step (all epochs)
        result["compressed_bytes_per_step"] = sum(buckets.compression.bytes_sent.values()) / n
        result["compression_paths"] = dict(buckets.compression.calls)
        result["dropped_fraction"] = (buckets.compression.dropped /
                                      max(buckets.compression.elements, 1))
        # the α, β the sparse/dense choice priced the links with (a fixed algorithm has no
        # calibration: measured on the first call that asked, bmlmpi.compression.network_price)
        from bmlmpi.compression.network_price import known
        links = known(communicator.compression)
        if links is not None:
            result["compression_links_alpha_beta"] = list(links)
    if buckets.profile is not None:
        result["profile"] = {"forward": buckets.profile.forward,
                             "backward": buckets.profile.backward,
                             "startup": buckets.profile.startup,
                             "per_byte": buckets.profile.per_byte}
    if rank == 0 and args.timeline:
        with open(args.timeline if len(args.plans) == 1 else
                  args.timeline.replace(".json", f"-{plan}.json"), "w") as f:
            json.dump({"plan": plan, "fusion_bytes": args.fusion_bytes,
                       "ranks": timelines}, f)
    return result


def train_sharded(args: argparse.Namespace, comm) -> dict:
    """ZeRO-1 (module docstring): one reduce-scatter and one allgather per step."""
    from mpi4py import MPI

    import bmlmpi

    rank, size = comm.rank, comm.size
    x, y, source = load_dataset(args.dataset, args.seed)
    model = MLP(args.seed)
    communicator = bmlmpi.Communicator(comm, algorithm=args.algorithm)
    total = sum(p.size for p in model.params)
    flat_params = np.concatenate([p.reshape(-1) for p in model.params])
    flat_grads = np.zeros(total)
    # the model's arrays become views of the flat vectors, so the collectives move them
    at, grads = 0, []
    for i, p in enumerate(model.params):
        model.params[i] = flat_params[at:at + p.size].reshape(p.shape)
        grads.append(flat_grads[at:at + p.size].reshape(p.shape))
        at += p.size
    counts = [total // size + (1 if r < total % size else 0) for r in range(size)]
    lo = sum(counts[:rank])
    shard = np.zeros(counts[rank])
    glob = args.batch * size
    steps = len(y) // glob if args.steps is None else min(args.steps, len(y) // glob)
    if steps == 0:
        raise SystemExit(f"train_buckets: the global batch {glob} exceeds the {len(y)} samples")
    losses, accuracies = [model.loss(x, y)], [model.accuracy(x, y)]
    if rank == 0:
        print(f"train_buckets: {size} ranks, ZeRO-1 shards of {counts[0]} parameters, "
              f"{source}, {steps} steps per epoch", flush=True)
    step_times = []
    for epoch in range(1, args.epochs + 1):
        order = epoch_order(args.seed, epoch, len(y))
        for s in range(steps):
            idx = order[s * glob + rank * args.batch:s * glob + (rank + 1) * args.batch]
            t0 = time.perf_counter()
            model.backward(model.forward(x[idx]), y[idx], grads)
            communicator.Reduce_scatter(flat_grads, shard, counts, bmlmpi.AVG)
            flat_params[lo:lo + counts[rank]] -= args.lr * shard
            communicator.Allgatherv(MPI.IN_PLACE, [flat_params, counts])
            step_times.append(time.perf_counter() - t0)
        losses.append(model.loss(x, y))
        accuracies.append(model.accuracy(x, y))
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {losses[-1]:.10f}  accuracy {accuracies[-1]:.4f}",
                  flush=True)
    first = flat_params.copy()
    comm.Bcast(first, root=0)
    differ = comm.allgather(not np.array_equal(first.view(np.uint64),
                                               flat_params.view(np.uint64)))
    warm = step_times[min(len(step_times) // 4, 10):] or step_times
    communicator.Free()
    return {"ranks": size, "plan": "shard", "algorithm": args.algorithm, "dataset": source,
            "losses": losses, "accuracies": accuracies, "steps_per_epoch": steps,
            "global_batch": glob, "shard_counts": counts,
            "step_seconds_median": float(np.median(warm)),
            "step_seconds_mean": float(np.mean(warm)),
            "ranks_with_other_parameters": [r for r, d in enumerate(differ) if d],
            "params": flat_params,
            "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference:
        result = train_reference(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    from check_world import expected_size, mismatch_message
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    expected = expected_size(args.expect_size)
    if expected is not None and comm.size != expected:
        print(mismatch_message(comm.size, expected), file=sys.stderr, flush=True)
        return 2
    runs = []
    for plan in (["shard"] if args.shard else args.plans):
        result = train_sharded(args, comm) if args.shard else train(args, comm, plan)
        params = result.pop("params")
        runs.append(result)
        if comm.rank == 0:
            print(f"train_buckets: median step {result['step_seconds_median'] * 1e3:.2f} ms "
                  f"(plan {plan}, buckets {result.get('buckets', 'none: sharded')})",
                  flush=True)
            if args.params_out:
                np.save(args.params_out, params)
    if comm.rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"ranks": comm.size, "runs": runs}, f, indent=1)
    differ = sorted({r for run in runs for r in run["ranks_with_other_parameters"]})
    if differ:
        print(f"train_buckets: ranks {differ} ended with parameters other than rank 0's",
              file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
