"""Bucket plans: which gradient arrays share one allreduce, and when each bucket starts. MPI-free.

A plan is a :class:`~bmlmpi.training.ibatch.Batching`: buckets are contiguous runs of layers
(forward order), and ``split`` says which buckets wait for the end of the backward pass
(the forward overlap of :mod:`bmlmpi.training.ibatch`) instead of starting once ready.

* ``layer`` — one bucket per array (Poseidon's layer by layer, the paper's baseline): L
  startups, the most overlap.
* ``single`` — one bucket for the whole model: one startup, no overlap (the paper's default PS).
* ``threshold`` — Horovod / PyTorch DDP style: walking back from the last layer, a bucket
  fills until the next array would take it past a byte cap (``BMLMPI_FUSION_BYTES``, default
  25 MiB as DDP); an array larger than the cap is a bucket of its own.
* ``ibatch`` — iBatch's greedy batching on a measured :class:`~bmlmpi.training.ibatch.Profile`
  (:func:`bmlmpi.training.ibatch.ibatch_plan`).

:func:`start_order` gives the order every rank starts the buckets in (it must be the same on
all ranks: bmlmpi matches allreduces by call order).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import config
from .ibatch import Batching, Profile, ibatch_plan

PLANS = ("layer", "single", "threshold", "ibatch")
DEFAULT_FUSION_BYTES: int = config.variable("BMLMPI_FUSION_BYTES").default


def fusion_bytes_from_env(value: int | None = None) -> int:
    """The threshold plan's cap: ``value``, else ``BMLMPI_FUSION_BYTES``, else 25 MiB."""
    if value is None:
        value = config.get("BMLMPI_FUSION_BYTES")
    if value < 1:
        raise ValueError(f"the fusion cap must be at least 1 byte, got {value}")
    return value


def layer_plan(n: int) -> Batching:
    return Batching(tuple(range(1, n + 1)), 0)


def single_plan(n: int) -> Batching:
    return Batching((n,), 0)


def threshold_plan(nbytes: Sequence[int], cap: int) -> Batching:
    """Buckets filled from the last layer back, each at most ``cap`` bytes unless one array
    alone exceeds it."""
    n = len(nbytes)
    starts: list[int] = []   # first layer of each bucket, from the back
    size = 0
    for i in range(n - 1, -1, -1):
        if size and size + nbytes[i] > cap:
            starts.append(i + 1)
            size = 0
        size += nbytes[i]
    ends = tuple(sorted(starts)) + (n,)
    return Batching(ends, 0)


def make_plan(name: str, nbytes: Sequence[int], *, fusion_bytes: int | None = None,
              profile: Profile | None = None) -> Batching:
    """The batching plan ``name`` gives for arrays of ``nbytes`` (forward order)."""
    n = len(nbytes)
    if n == 0:
        raise ValueError("GradientBuckets needs at least one array")
    if name == "layer":
        return layer_plan(n)
    if name == "single":
        return single_plan(n)
    if name == "threshold":
        return threshold_plan(nbytes, fusion_bytes_from_env(fusion_bytes))
    if name == "ibatch":
        if profile is None:
            raise ValueError("the ibatch plan needs a profile")
        if tuple(profile.nbytes) != tuple(nbytes):
            raise ValueError(f"the profile's sizes {profile.nbytes} are not the arrays' "
                             f"{tuple(nbytes)}")
        return ibatch_plan(profile)
    raise ValueError(f"unknown plan {name!r}; plans: {', '.join(PLANS)}")


def start_order(plan: Batching) -> list[int]:
    """Bucket indices (forward order) in the order they start: back buckets from the last
    (their gradients are ready first), then the front buckets front first."""
    buckets = plan.buckets
    back = [b for b, (first, _) in enumerate(buckets) if first >= plan.split]
    front = [b for b, (first, _) in enumerate(buckets) if first < plan.split]
    return back[::-1] + front


__all__ = ["DEFAULT_FUSION_BYTES", "PLANS", "fusion_bytes_from_env", "layer_plan", "make_plan",
           "single_plan", "start_order", "threshold_plan"]
