"""DDP communication hooks on bmlmpi: averaging, bmlmpi's compressors, bmlmpi's bucket plans.

    from bmlmpi.torch import hooks
    ddp.register_comm_hook(hooks.AllreduceState(), hooks.allreduce_hook)
    ddp.register_comm_hook(hooks.CompressionState("fp16"), hooks.compression_hook)
    ddp.register_comm_hook(hooks.BucketPlanState(plan="ibatch"), hooks.bucket_plan_hook)

Each hook takes DDP's ``GradBucket`` and returns a future holding the bucket's gradient
averaged over the process group's ranks (``bmlmpi.AVG``: divided by the ranks that
contributed, the survivors after a failure on the fault-tolerant backend).

* :func:`allreduce_hook` — bmlmpi's allreduce with AVG through the ``bmlmpi`` process group
  (the default DDP hook divides by the world size read when DDP was built; this one by the
  current size, which is what survivors of a failure need).
* :func:`compression_hook` — bmlmpi's compressed allreduce (:mod:`bmlmpi.compression`) with a
  :class:`bmlmpi.compression.Compressor` kept in the state: ``fp16``, ``bf16`` (16-bit wire with
  a shared power-of-two scale, partial sums rounded at every step), the TDF filters
  (``threshold``, ``random``, ``tdf``), top-k sparsification (``CompressionState("topk:0.01")``
  or ``CompressionState(bmlmpi.compression.topk(ratio=0.01))``: Deep Gradient Compression's
  sparsification; give a ratio, since k applies per bucket). Error feedback: the compressor
  keeps what it did not send of each bucket and adds it at the next step. Its memory is kept
  per group of parameters (the bucket's parameter indices), so DDP rebuilding its buckets
  after the first iteration moves each parameter's residual into its new bucket
  (``Compressor.regroup``) instead of losing it. Host memory only: a CUDA bucket is staged
  through the host.
* :func:`bucket_plan_hook` — bmlmpi's bucket plans (:mod:`bmlmpi.training`, the iBatch paper)
  over DDP's buckets: every DDP bucket is one array of a :class:`bmlmpi.GradientBuckets`,
  which fuses them by the plan (``ibatch``: profiled on three iterations, then iBatch's
  greedy batching; ``layer``, ``single``, ``threshold``) and overlaps the fused allreduces with
  the rest of the backward pass. Give DDP small buckets (``bucket_cap_mb``) so that the plan
  has layers to batch. DDP waits for every bucket at the end of the backward pass, so the part
  of a plan that iBatch would overlap with the next forward pass runs at the end of backward
  instead. The plan starts on the third iteration: the first two run each bucket's plain
  allreduce while DDP settles its bucket order (it rebuilds its buckets after the first).
  Not on the fault-tolerant backend (``GradientBuckets`` would need a second fault-tolerant
  communicator beside the group's): its state raises ``ValueError`` there.

Compared with torch's own hooks: ``torch.distributed.algorithms.ddp_comm_hooks.
default_hooks.fp16_compress_hook`` casts the bucket divided by N to float16 and sums it in
float16 with the backend's allreduce (no scale, no error feedback); bmlmpi's ``fp16``
scales by a power of two agreed across ranks (no overflow, no lost small values), reduces
through bmlmpi's schedule and keeps the rounding error for the next step. The two agree to
float16 rounding.
"""

import threading
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.futures import Future

from ..api import Communicator
from ..ops import AVG
from .process_group import ProcessGroupBmlmpi
from .tensors import host_view


def _group(process_group: Any) -> ProcessGroupBmlmpi:
    pg = process_group if process_group is not None else dist.group.WORLD
    if not isinstance(pg, ProcessGroupBmlmpi):
        raise TypeError(f"bmlmpi's DDP hooks run on a process group of the bmlmpi backend, "
                        f"not {type(pg).__name__}")
    return pg


class AllreduceState:
    """State of :func:`allreduce_hook`: the process group (default: the world group)."""

    def __init__(self, process_group: Any = None):
        self.process_group = _group(process_group)


def allreduce_hook(state: AllreduceState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket averaged with bmlmpi's AVG (bmlmpi's allreduce)."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG,
                           group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class CompressionState:
    """State of :func:`compression_hook`: the compressor (a spec such as ``"fp16"``,
    ``"tdf:0.01:0.5:0.5"``, or a :class:`bmlmpi.compression.Compressor`; it keeps the error
    feedback across steps) and the process group."""

    def __init__(self, compression: Any, process_group: Any = None):
        from ..compression import parse
        self.process_group = _group(process_group)
        self.compressor = parse(compression)
        if self.compressor is None:
            raise ValueError("CompressionState needs a compressor (use allreduce_hook for none)")
        self._index: dict[int, int] | None = None
        self._sizes: list[int] = []

    def key(self, bucket: dist.GradBucket) -> tuple[int, ...]:
        """The bucket's parameters as indices (stable across DDP's bucket rebuild); moves the
        residuals of an earlier grouping of the same parameters under this key."""
        params = bucket.parameters()
        if self._index is None:
            self._index = {}
        for p in params:
            if id(p) not in self._index:
                self._index[id(p)] = len(self._sizes)
                self._sizes.append(p.numel())
        key = tuple(self._index[id(p)] for p in params)
        c = self.compressor
        if key not in c.iterations:
            members = set(key)
            old = [k for k in c.iterations if isinstance(k, tuple) and members & set(k)]
            if old:
                leftover = sorted({i for k in old for i in k} - members)
                c.regroup(old, [key, *[(i,) for i in leftover]], self._sizes)
        return key


def compression_hook(state: CompressionState,
                     bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket averaged through bmlmpi's compressed allreduce (``state.compressor``)."""
    buffer = bucket.buffer()
    work = state.process_group.compressed_allreduce(buffer, state.compressor,
                                                    state.key(bucket))
    return work.get_future().then(lambda fut: fut.value()[0])


class BucketPlanState:
    """State of :func:`bucket_plan_hook`: a bmlmpi bucket plan over DDP's buckets.

    Made on every rank before training (it builds its own :class:`bmlmpi.Communicator` over
    the group's ranks, a collective). ``plan``: ``ibatch`` (default), ``layer``, ``single``,
    ``threshold``; ``compression``: as :class:`CompressionState` (the compressor of
    ``GradientBuckets``); ``cost``: ``model`` or ``measured`` (how iBatch prices an
    allreduce, :mod:`bmlmpi.training.costs`)."""

    WARMUP_STEPS = 2

    def __init__(self, process_group: Any = None, plan: str = "ibatch",
                 compression: Any = None, cost: str = "model"):
        pg = _group(process_group)
        if pg.failed or getattr(pg.communicator, "original_size", None) is not None:
            raise ValueError("bucket_plan_hook does not run on the fault-tolerant bmlmpi "
                             "backend; use allreduce_hook or compression_hook there")
        self.process_group = pg
        self.plan = plan
        self.compression = compression
        self.cost = cost
        o = pg.options
        with pg.locked():
            self.communicator = Communicator(pg.mpi_comm, algorithm=o.algorithm,
                                             topology=o.topology, timeout=o.timeout)
        self.buckets: Any = None            # the GradientBuckets, once DDP's layout is stable
        self._layout: list[tuple[int, int]] = []
        self._previous: list[tuple[int, int]] | None = None
        self._steps = 0
        self._futures: dict[int, Future] = {}
        self._tensors: dict[int, torch.Tensor] = {}
        self._arrays: list[Any] = []
        self._tensors_ptr: dict[int, int] = {}
        self._waiter: threading.Thread | None = None

    def _build(self, tensors: dict[int, torch.Tensor]) -> None:
        from ..training import GradientBuckets
        # DDP's bucket 0 holds the last layers (ready first): forward order is the reverse
        order = sorted(tensors, reverse=True)
        self._position = {b: i for i, b in enumerate(order)}
        self._tensors_ptr = {b: t.data_ptr() for b, t in tensors.items()}
        self._arrays = [host_view(tensors[b]).array for b in order]
        self.buckets = GradientBuckets(self._arrays, comm=self.communicator, op=AVG,
                                       plan=self.plan, compression=self.compression,
                                       cost=self.cost)

    def plain(self, bucket: dist.GradBucket) -> Future:
        """A warm-up step's bucket: bmlmpi's AVG allreduce on its own communicator."""
        buffer = bucket.buffer()
        arr = host_view(buffer).array
        self.communicator.Allreduce(MPI.IN_PLACE, arr, AVG)
        fut: Future = Future()
        fut.set_result(buffer)
        return fut

    def step_end(self) -> None:
        layout = self._layout
        self._steps += 1
        stable = layout == self._previous
        self._previous, self._layout = layout, []
        if self.buckets is None and stable and self._steps >= self.WARMUP_STEPS:
            self._build(self._tensors)

    def finish_async(self) -> None:
        """Wait for every bucket of this step in a thread and complete DDP's futures (DDP
        waits on them from C++ at the end of the backward pass)."""
        futures, tensors = self._futures, self._tensors
        self._futures = {}

        def run() -> None:
            try:
                self.buckets.wait()
            except BaseException as exc:  # noqa: BLE001 - DDP raises it from the future
                for f in futures.values():
                    f.set_exception(exc)
                return
            for b, f in futures.items():
                f.set_result(tensors[b])

        self._waiter = threading.Thread(target=run, name="bmlmpi bucket plan", daemon=True)
        self._waiter.start()


def bucket_plan_hook(state: BucketPlanState,
                     bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's bucket as one array of ``state``'s :class:`bmlmpi.GradientBuckets`."""
    index = bucket.index()
    buffer = bucket.buffer()
    state._tensors[index] = buffer
    if state.buckets is None:
        state._layout.append((index, buffer.numel()))
        fut = state.plain(bucket)
        if bucket.is_last():
            state.step_end()
        return fut
    if buffer.data_ptr() != state._tensors_ptr.get(index, buffer.data_ptr()):
        raise RuntimeError(f"bucket_plan_hook: DDP bucket {index} moved to new memory after "
                           f"the bucket plan was built on it")
    if state._waiter is not None:
        state._waiter.join()    # the previous step's waiter (done: DDP waited for it)
        state._waiter = None
    fut = Future()
    state._futures[index] = fut
    state.buckets.mark_ready(state._position[index])
    if bucket.is_last():
        state.finish_async()
    return fut


__all__ = ["AllreduceState", "BucketPlanState", "CompressionState", "allreduce_hook",
           "bucket_plan_hook", "compression_hook"]
