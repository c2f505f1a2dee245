"""The α-β price of the network for the sparse/dense choice, measured once per communicator.

The compression layer chooses between the sparse exchange and the dense allreduce by pricing
both with α (seconds per message round) and β (seconds per byte). A communicator that ran
:func:`bmlmpi.calibrate.calibrate` (algorithm ``auto``) has them. A communicator with a fixed
algorithm never calibrates, and pricing its network as shared memory (:data:`DEFAULT_ALPHA`,
:data:`DEFAULT_BETA`) would keep the sparse exchange from being chosen on a slow network
where it is faster.

So the first compressed call that asks the cost model (filters on, path ``auto``) on such a
communicator measures, on the compression layer's private duplicate communicator, as a stage
of that call (so under its deadline, never a hang):

* ranks paired 2i ↔ 2i+1 (an odd last rank sits out and takes the others' result), a warm-up
  exchange then ``SMALL_REPS`` simultaneous exchanges of 8 bytes (α: the median) and
  ``LARGE_REPS`` of 1 MiB (β: (median − α) / bytes);
* one ``Iallreduce(MAX)`` of (α, β): every rank gets the same two numbers, so every rank makes
  the same choice. The measurement is taken only after the call's agreement (which checks the
  arguments and the compressor's path on every rank), so every rank enters it together.

The times are taken as the compressed call's own stages see them (posted, then tested until
complete by whoever progresses the call), which is how the sparse exchange's messages are
progressed too. Cost, once per communicator: 2 + ``SMALL_REPS`` + ``LARGE_REPS`` exchanges
and one small allreduce (about 0.4 s at 100 Mbit/s, a few ms on shared memory). The result
is kept in the communicator's compression channel (:attr:`.channel.CompressionChannel.links`);
``BMLMPI_CALIBRATE=0`` keeps the defaults (no measurement).

Source: the α-β (Hockney) model; the pairing is :mod:`bmlmpi.calibrate`'s.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import config

#: α-β defaults when nothing is measured (shared memory, order of magnitude)
DEFAULT_ALPHA = 2e-5
DEFAULT_BETA = 1e-9

SMALL_BYTES = 8
LARGE_BYTES = 1 << 20
SMALL_REPS = 5
LARGE_REPS = 3


def known(channel: Any) -> tuple[float, float] | None:
    """(α, β) without communication for a communicator's compression channel: its
    communicator's calibration, the measured ones, or (with ``BMLMPI_CALIBRATE=0``, or a
    single rank) the defaults; None: to be measured."""
    calib = channel.owner.calibration
    if calib is not None:
        return calib.alpha, calib.beta
    if channel.links is not None:
        return channel.links
    if channel.owner.size == 1 or not config.get("BMLMPI_CALIBRATE"):
        return DEFAULT_ALPHA, DEFAULT_BETA
    return None


def _timed_exchanges(dup: MPI.Comm, partner: int, tag: int, nbytes: int, reps: int
                     ) -> Generator[list, None, list[float]]:
    out = np.zeros(nbytes, np.uint8)
    inp = np.empty(nbytes, np.uint8)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        yield [dup.Irecv(inp, partner, tag), dup.Isend(out, partner, tag)]
        times.append(time.perf_counter() - t0)
    return times


def measure(dup: MPI.Comm, tag: int) -> Generator[list, None, tuple[float, float]]:
    """Stages measuring (α, β) over ``dup`` (collective; every rank gets the same values).
    ``tag``: two tags of the calling compressed call's block."""
    size, rank = dup.Get_size(), dup.Get_rank()
    partner = rank ^ 1
    mine = np.zeros(2)
    if partner < size:
        yield from _timed_exchanges(dup, partner, tag, SMALL_BYTES, 1)   # first touch
        small = yield from _timed_exchanges(dup, partner, tag, SMALL_BYTES, SMALL_REPS)
        yield from _timed_exchanges(dup, partner, tag + 1, LARGE_BYTES, 1)
        large = yield from _timed_exchanges(dup, partner, tag + 1, LARGE_BYTES, LARGE_REPS)
        alpha = float(np.median(small))
        mine[:] = alpha, max(float(np.median(large)) - alpha, 0.0) / LARGE_BYTES
    agreed = np.empty(2)
    yield [dup.Iallreduce(mine, agreed, MPI.MAX)]
    return float(agreed[0]), float(agreed[1])


def alpha_beta(channel: Any, tag: int) -> Generator[list, None, tuple[float, float]]:
    """Stages giving the communicator's (α, β): :func:`known`, else :func:`measure`d once on
    the channel's duplicate and kept in ``channel.links``."""
    have = known(channel)
    if have is not None:
        return have
    channel.links = got = yield from measure(channel.comm, tag)
    return got


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BETA", "alpha_beta", "known", "measure"]
