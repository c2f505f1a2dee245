"""Measure the cost model's machine parameters over MPI, once, and cache them on disk.

:func:`calibrate` is collective: every rank of ``comm`` calls it together, every wait has a
deadline (a missing rank raises :class:`~bmlmpi.execute.DeadlineExceeded`, never hangs), and
every rank returns the same :class:`~bmlmpi.model.Calibration`, so that every rank's
:func:`bmlmpi.selection.choose` reaches the same decision. It took 0.5–3 s on the 2-core
development machine (2 to 12 ranks), most of it in the 16 MiB runs.

What is measured, on a private duplicate of ``comm``, all ranks at once (ranks paired
2i ↔ 2i+1; with an odd size the last rank sits out the pair phases):

* ``alpha``: a simultaneous exchange of 8 bytes between partners, per exchange;
* ``beta``: a simultaneous exchange of 4 MiB, (time − α) / bytes — seconds per byte through
  one rank's port while every other rank copies too;
* ``step_overhead``/``msg_overhead``: bmlmpi's Python executor running the ring, the P2P
  parameter-server and the BML schedules at a few elements; a least-squares fit of their
  times to steps · (α + step_overhead) + messages · msg_overhead, where steps and messages
  are what the cost model counts for those schedules;
* ``gamma``: a numpy sum of 4 MiB into 4 MiB, per byte;
* shared memory, when all ranks share one node (:mod:`bmlmpi.shm`) — or, on several nodes
  that each hold two ranks or more, on every node at once (hierarchical's node tier) —, every
  rank at once: ``shm_copy``, a copy of 4 MiB per byte; ``shm_reduce``, ``out = a + b`` of
  4 MiB per byte read; ``shm_sync``, the shared-memory allreduce of one element per rank of
  the node (three steps of barrier, flag and wait) per step; on one node ``shm`` is then
  timed for ``corrections`` with the others;
* ``native``: the MPI library's blocking ``MPI_Allreduce`` as user code calls it (mpi4py's
  ``comm.Allreduce``) at 8 B, 64 KiB, 256 KiB, 1 MiB, 4 MiB and 16 MiB — the real baseline, not
  bmlmpi's polled ``MPI_Iallreduce`` pass-through (7× slower at 8 B on the development
  machine, which made every schedule look better against it). A blocking call has no
  deadline of its own, so each one follows a barrier that has one: once every rank has
  passed it, all are in the same phase and make the same call; only a rank that dies inside
  that one call (microseconds to milliseconds) can still hold the others;
* ``natives``: the same for the other collectives (mpi4py's blocking
  ``comm.Reduce_scatter_block``, ``Allgather``, ``Reduce`` and ``Bcast``, root 0) at 8 B,
  64 KiB, 1 MiB and 4 MiB of work buffer (the whole input of a reduce-scatter, the whole output
  of an allgather), so that ``auto`` prices the native call of each collective;
* ``family_corrections``: the same for the other collectives' schedules (each collective's
  calibrated algorithms, every rank's block equal, root 0) at 8 B, 64 KiB, 1 MiB and 4 MiB
  of work buffer, interleaved with mpi4py's blocking call of that collective (whose times there
  are its ``natives`` points), so that ``auto`` prices each family call with this machine's
  measured factors as it prices the allreduce;
* ``corrections``: the algorithms whose records say calibration corrects them (bml, ring and,
  up to ``AUTO_TREE_MAX_RANKS`` ranks, the single and multi
  tree), each run by the executor at 64 KiB, 256 KiB, 1, 4 and 16 MiB, in blocks of calls
  interleaved with the native allreduce of the same size on the same buffers, as the sweep
  times them (:func:`_interleaved_times`); each time divided by the model's price of the same
  schedule with the parameters above. On the development machine these factors ranged from
  0.24 (single tree, 9 ranks) to 2.16 (bml, 9 ranks, 1 MiB): the model prices link time and
  per-step overheads, not several ranks sharing a core. ``auto`` scales each modelled time by
  the factor interpolated at its size.

Each timing is a median over a few repetitions, and the slowest rank's (an allreduce ends
when its slowest rank does), agreed with a non-blocking MAX allreduce before anything is
derived from it.

Cache: ``$BMLMPI_CACHE_DIR`` or ``~/.cache/bmlmpi``, one JSON file per host and MPI library
(``calib-<host>-<mpi>.json``), one entry per (ranks, nodes). Rank 0 reads and writes it and
broadcasts what it read; ``BMLMPI_RECALIBRATE=1`` (or ``use_cache=False``) measures afresh.
A measured entry's ``meta`` keeps the 1-minute load and the core count as it was measured
(``loadavg``, ``cores``: :func:`bmlmpi.model.plausibility.overloaded` reads them).

``bmlmpi-calibrate`` (:mod:`bmlmpi.cli.calibrate`) prints the calibration and the algorithm the
model picks at each message size.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config
from .execute import Plan, timeout_from_env, wait_for
from .executors import start_allreduce, start_collective
from .model.cost import price_symmetric
from .model.estimate import Calibration, estimate
from .model.network import SharedMemoryNode
from .schedules import algorithms as records
from .schedules.shm import node_steps, slices
from .schedules.types import Schedule
from .shm import NodeTier
from .topology.nodes import Nodes, nodes_from_ids

#: the cache's format: bumped whenever what is measured changes (older entries are re-measured)
FORMAT = 9  # 9: shared memory measured on each node of several
SMALL_BYTES = 8
LARGE_BYTES = 4 << 20
NATIVE_BYTES = (8, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
CORRECTION_BYTES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)  # ⊂ NATIVE_BYTES
#: the other collectives whose native call is timed, and the work-buffer sizes it is timed at
#: (``auto`` interpolates between them and extrapolates along the last segment)
FAMILY = ("reduce_scatter", "allgather", "reduce", "bcast")
FAMILY_BYTES = (8, 64 << 10, 1 << 20, 4 << 20)
#: the sizes the family's schedules are timed at for their corrections: every size of
#: FAMILY_BYTES, 8 B included (the executor's own cost, which a factor measured at 64 KiB
#: would shrink; and native's 8 B point then comes from the least disturbed block of calls,
#: not from single calls, one of which a time slice can stretch to milliseconds)
FAMILY_CORRECTION_BYTES = FAMILY_BYTES
#: consecutive calls of one candidate timed together (the sweep's blocks: 20 calls in 5)
BLOCK_CALLS = 4
_HOST_BYTES = 64

_log = logging.getLogger("bmlmpi")


def cache_dir() -> Path:
    """Where calibrations (and, under ``numba/``, compiled kernels) are cached."""
    return config.cache_dir()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:48] or "unknown"


def mpi_library() -> str:
    """A short name of the MPI library: its version string's first clause."""
    first = MPI.Get_library_version().strip().splitlines()[0]
    return _slug(first.split(",")[0])


def cache_path(host: str, mpi: str) -> Path:
    return cache_dir() / f"calib-{_slug(host)}-{_slug(mpi)}.json"


class MeasurementOverrun(RuntimeError):
    """A measurement stopped on every rank alike once it ran past its budget (``measure``'s
    ``budget``): nothing was measured that could be kept."""


# -- waiting with deadlines ------------------------------------------------------------------

def _wait(reqs: Sequence[MPI.Request], timeout: float, what: str) -> None:
    reqs = list(reqs)
    wait_for(lambda: MPI.Request.Testall(reqs), timeout,
             lambda t: f"bmlmpi.calibrate: {what} made no progress in {t:g} s "
                       f"(did every rank call calibrate?)")


def _barrier(comm: MPI.Comm, timeout: float, what: str) -> None:
    _wait([comm.Ibarrier()], timeout, what)


def _allreduce_max(comm: MPI.Comm, values: Sequence[float], timeout: float) -> np.ndarray:
    send = np.array(values, dtype=np.float64)
    recv = np.empty_like(send)
    _wait([comm.Iallreduce(send, recv, op=MPI.MAX)], timeout, "agreeing on the timings")
    return recv


# -- measurements ------------------------------------------------------------------------------

def _exchange_time(comm: MPI.Comm, nbytes: int, reps: int, timeout: float) -> float:
    """Seconds per simultaneous exchange of ``nbytes`` with the partner (0 if none)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    partner = rank ^ 1
    if partner >= size:
        return 0.0
    out = np.zeros(max(nbytes, 1), dtype=np.uint8)
    inp = np.empty_like(out)

    def once() -> None:
        _wait([comm.Irecv(inp, partner, 11), comm.Isend(out, partner, 11)], timeout,
              f"exchanging {nbytes} bytes with rank {partner}")

    return _median_seconds(once, reps)


def _run_schedule(comm: MPI.Comm, sched: Schedule, reps: int, timeout: float) -> float:
    """Seconds per execution of ``sched`` by bmlmpi's executor (median of ``reps``)."""
    plan = Plan.flat(sched, comm)
    buf = np.ones(sched.count, dtype=np.float64)
    times = []
    for i in range(reps + 1):
        run = start_allreduce(plan, buf, "sum", (i % 4) * 4096, f"calibrate {sched.algorithm}")
        start = time.perf_counter()
        wait_for(run.test, timeout, run.describe_timeout)
        if i:  # the first run pays for allocating
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def _reduce_time(nbytes: int, reps: int) -> float:
    """Seconds to add ``nbytes`` of float64 into another array (numpy: a memory-bound sum like
    the kernels', without paying their JIT compilation inside the calibration)."""
    n = nbytes // 8
    dst, src = np.ones(n), np.ones(n)
    return _median_seconds(lambda: np.add(dst, src, out=dst), reps)


def _median_seconds(fn: Callable[[], Any], reps: int) -> float:
    """The median seconds of ``reps`` calls of ``fn`` after one untimed (first touch)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _native_once(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, timeout: float) -> float:
    """Seconds of one blocking ``comm.Allreduce`` (the MPI library's own, as user code calls
    it), after a barrier with a deadline so that a missing rank raises instead of hanging."""
    _barrier(comm, timeout, "before a native allreduce")
    start = time.perf_counter()
    comm.Allreduce(send, recv, op=MPI.SUM)
    return time.perf_counter() - start


def _native_time(comm: MPI.Comm, nbytes: int, reps: int, timeout: float) -> float:
    """Seconds of the native blocking allreduce of ``nbytes`` (median of ``reps``)."""
    send = np.ones(max(nbytes // 8, 1), dtype=np.float64)
    recv = np.empty_like(send)
    _native_once(comm, send, recv, timeout)  # first touch, the MPI's own setup
    return float(np.median([_native_once(comm, send, recv, timeout) for _ in range(reps)]))


def _native_family_call(comm: MPI.Comm, collective: str, nbytes: int
                        ) -> tuple[Callable, int, tuple[np.ndarray, np.ndarray]]:
    """(one blocking call of ``collective`` as user code makes it through mpi4py, with about
    ``nbytes`` in its work buffer, root 0; the work buffer's bytes it really has; its send
    and receive buffers, float64)."""
    size = comm.Get_size()
    block = max(nbytes // 8 // size, 1)
    if collective == "reduce_scatter":
        send, recv = np.ones(block * size), np.empty(block)
        return (lambda: comm.Reduce_scatter_block(send, recv, MPI.SUM)), send.nbytes, (send,
                                                                                       recv)
    if collective == "allgather":
        send, recv = np.ones(block), np.empty(block * size)
        return (lambda: comm.Allgather(send, recv)), recv.nbytes, (send, recv)
    buf = np.ones(max(nbytes // 8, 1))
    recv = np.empty_like(buf)
    if collective == "reduce":
        return (lambda: comm.Reduce(buf, recv, MPI.SUM, 0)), buf.nbytes, (buf, recv)
    return (lambda: comm.Bcast(buf, 0)), buf.nbytes, (buf, recv)


def _native_family_time(comm: MPI.Comm, collective: str, nbytes: int, reps: int,
                        timeout: float) -> list[float]:
    """[work-buffer bytes, seconds of the native blocking call (median of ``reps``)], each
    call after a barrier with a deadline (as :func:`_native_once`)."""
    call, real, _ = _native_family_call(comm, collective, nbytes)

    def once() -> float:
        _barrier(comm, timeout, f"before a native {collective}")
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    once()  # first touch, the MPI's own setup
    return [float(real), float(np.median([once() for _ in range(reps)]))]


def _copy_time(nbytes: int, reps: int) -> float:
    """Seconds to copy ``nbytes`` between two arrays (a shared-memory publish or fetch)."""
    dst, src = np.zeros(nbytes, dtype=np.uint8), np.ones(nbytes, dtype=np.uint8)
    return _median_seconds(lambda: np.copyto(dst, src), reps)


def _combine_time(nbytes: int, reps: int) -> float:
    """Seconds per byte read of ``out = a + b`` over ``nbytes`` (a shared-memory reduction
    reads its sources once and writes its slice once)."""
    n = nbytes // 8
    a, b, out = np.ones(n), np.ones(n), np.empty(n)
    return _median_seconds(lambda: np.add(a, b, out=out), reps) / (2 * nbytes)


def shm_step_time(tier: NodeTier, reps: int, timeout: float) -> float:
    """Seconds per step of the shared-memory allreduce of one float64 per rank over this
    rank's node of ``tier`` (collective over ``tier.comm``: every node at once)."""
    rank, members = tier.comm.Get_rank(), tier.members
    m = len(members)
    steps = node_steps(rank, members, [slices(0, m, members)], "allreduce") if m > 1 else []
    sched = Schedule("shm", rank, tier.comm.Get_size(), m, tuple(steps))
    plan = tier.bind(sched, 8)
    buf = np.ones(m)
    times = []
    for i in range(reps + 1):
        start = time.perf_counter()
        start_allreduce(plan, buf, "sum", 0, "calibrate shm").drive(timeout)
        if i:
            times.append(time.perf_counter() - start)
    return float(np.median(times)) / max(sched.nsteps, 1)


def _one_node(comm: MPI.Comm, timeout: float) -> NodeTier | None:
    """The shared-memory tier of ``comm`` when all its ranks share one node, else None."""
    if comm.Get_size() < 2:
        return None
    tier = NodeTier(comm, Nodes((tuple(range(comm.Get_size())),)), timeout)
    if tier.one_node:
        return tier
    tier.free()
    return None


def several_nodes(comm: MPI.Comm, timeout: float, nodes: Nodes | None = None
                  ) -> NodeTier | None:
    """The shared-memory tier of ``comm``'s ``nodes`` (None: its ranks grouped by host) when
    there are several and every one holds at least two ranks that share its memory: what
    hierarchical's node tier runs on, so the calibration measures shared memory there too,
    on every node at once. None otherwise (collective over ``comm``)."""
    if nodes is None:
        nodes = nodes_from_ids(_hosts(comm, timeout))
    if nodes.count < 2 or min(nodes.sizes) < 2:
        return None
    tier = NodeTier(comm, nodes, timeout)
    if tier.fits:
        return tier
    tier.free()
    return None


def _interleaved_times(comm: MPI.Comm, nbytes: int, names: Sequence[str], rounds: int,
                       timeout: float, tier: NodeTier | None = None) -> list[float]:
    """Seconds per call of the native blocking ``MPI_Allreduce`` and of each named schedule,
    for ``nbytes`` of float64, measured the way the sweep (:mod:`bmlmpi.cli.bench`) and user code
    call them: every candidate reduces the same ``send`` into the same ``recv`` (a schedule
    with its separate input, as ``Allreduce(send, recv)`` runs it), timed in turn
    (:func:`_in_turn`)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    n = max(nbytes // 8, 1)
    send = np.ones(n, dtype=np.float64)
    recv = np.empty_like(send)
    plans = [tier.bind(_schedule(a, rank, size, nbytes), 8) if a == "shm"
             else Plan.flat(_schedule(a, rank, size, nbytes), comm) for a in names]
    calls = [0]

    def scheduled(i: int) -> Callable[[], None]:
        def run() -> None:
            calls[0] += 1
            # the blocking path a checked signature's calls take
            start_allreduce(plans[i], recv, "sum", (calls[0] % 4) * 4096,
                            f"calibrate {names[i]}", src=send).drive(timeout)
        return run

    return _in_turn(comm, [lambda: comm.Allreduce(send, recv, op=MPI.SUM),
                           *(scheduled(i) for i in range(len(names)))], rounds, timeout)


def _family_layout(collective: str, nbytes: int, size: int
                   ) -> tuple[int, int, tuple[int, ...] | None]:
    """(count, itemsize, block counts or None) of a family schedule on the buffers of
    :func:`_native_family_call` (float64), as a call of it hands them to its schedule and
    ``auto`` prices it: the allgather and the broadcast move bytes, reductions elements."""
    block = max(nbytes // 8 // size, 1)
    if collective == "reduce_scatter":
        return block * size, 8, (block,) * size
    if collective == "allgather":
        return block * size * 8, 1, (block * 8,) * size
    n = max(nbytes // 8, 1)
    return (n, 8, None) if collective == "reduce" else (n * 8, 1, None)


def _interleaved_family_times(comm: MPI.Comm, collective: str, nbytes: int,
                              names: Sequence[str], rounds: int, timeout: float,
                              tier: NodeTier | None = None) -> list[float]:
    """[work-buffer bytes, seconds per call of mpi4py's blocking ``collective``, then of each
    named schedule of it], timed in turn (:func:`_in_turn`) on the same buffers."""
    rank, size = comm.Get_rank(), comm.Get_size()
    native, real, (send, recv) = _native_family_call(comm, collective, nbytes)
    count, itemsize, counts = _family_layout(collective, nbytes, size)
    # this rank's input and output as the call hands them to its schedule (root 0)
    inp, out = {"reduce_scatter": (send, recv),
                "allgather": (send.view(np.uint8), recv.view(np.uint8)),
                "reduce": (send, recv if rank == 0 else None),
                "bcast": (send.view(np.uint8) if rank == 0 else None,
                          send.view(np.uint8))}[collective]
    ctx = records.Context(size, count, itemsize, rank, collective=collective, counts=counts)
    plans = [tier.bind(records.build(a, ctx), itemsize) if a == "shm"
             else Plan.flat(records.build(a, ctx), comm) for a in names]
    dtype = np.dtype(np.float64 if itemsize == 8 else np.uint8)
    calls = [0]

    def scheduled(i: int) -> Callable[[], None]:
        def run() -> None:
            calls[0] += 1
            start_collective(plans[i], inp, out, "sum", (calls[0] % 4) * 4096,
                             f"calibrate {names[i]} {collective}", None, dtype).drive(timeout)
        return run

    times = _in_turn(comm, [native, *(scheduled(i) for i in range(len(names)))], rounds,
                     timeout)
    return [float(real), *times]


def _in_turn(comm: MPI.Comm, calls: Sequence[Callable[[], None]], rounds: int,
             timeout: float) -> list[float]:
    """Seconds per call of each of ``calls`` (the native one first), in blocks of
    :data:`BLOCK_CALLS` consecutive calls with a barrier after each, the blocks of all
    candidates taken in turn for ``rounds`` rounds (a change in the machine's load hits all
    alike) after one untimed call each; this rank's least disturbed block (the smallest block
    mean: another process's time slice only ever adds, and with a few rounds one slow block
    moves a median).

    Why this way: timed one call at a time, each on its own buffers, every call started with
    cold caches and paid the skew of the barrier before it; on the 2-core development machine
    that priced native at 1 MiB and 4 MiB 2.4-3.7x above what the sweep then measured, and
    ``auto`` left native where native was 1.5x faster."""
    def once(i: int) -> float:
        start = time.perf_counter()
        calls[i]()
        took = time.perf_counter() - start
        # the barrier (with a deadline) before the next call, as the sweep's after each call:
        # every rank has then left this call, so a blocking native call is only ever entered
        # by ranks that all reached it
        _barrier(comm, timeout, "between calibration runs")
        return took

    _barrier(comm, timeout, "before the calibration runs")
    times: list[list[float]] = [[] for _ in calls]
    for i in range(len(times)):
        once(i)  # allocation, first touch, kernel compilation
    for _ in range(rounds):
        for i in range(len(times)):
            times[i].append(sum(once(i) for _ in range(BLOCK_CALLS)) / BLOCK_CALLS)
    return [min(t) for t in times]


def _overhead_schedules(size: int) -> list[Callable[[int], Schedule]]:
    """Builders (rank -> Schedule) of tiny ring, P2P-PS and BML allreduces: many steps of two
    messages, two steps of 2(N−1) messages, and in between."""
    from .schedules.bml import bml_schedule
    from .schedules.ps import ps_schedule
    from .schedules.ring import ring_schedule
    from .topology.bcube import default_shape

    shape = default_shape(size)
    pieces = max(len(shape), 1) * size
    return [lambda r: ring_schedule(r, size, size), lambda r: ps_schedule(r, size, size),
            lambda r: bml_schedule(r, size, pieces, shape)]


def fit_overheads(alpha: float, runs: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(step_overhead, msg_overhead) from runs of (active steps, Σ messages, seconds), fitting
    seconds ≈ steps · (α + step_overhead) + messages · msg_overhead, both overheads >= 0."""
    rows = [(s, m, t) for s, m, t in runs if s > 0]
    if not rows:
        return 0.0, 0.0
    a = np.array([[s, m] for s, m, _ in rows], dtype=np.float64)
    y = np.array([t for _, _, t in rows], dtype=np.float64)
    per_step, per_msg = 0.0, -1.0
    if np.linalg.matrix_rank(a) == 2:
        per_step, per_msg = np.linalg.lstsq(a, y, rcond=None)[0]
    if per_msg < 0 or per_step < 0:  # collinear or noisy: all of it per step
        per_step, per_msg = float(y.sum() / a[:, 0].sum()), 0.0
    return max(0.0, float(per_step) - alpha), float(per_msg)


def measure(comm: MPI.Comm, timeout: float | None = None,
            nodes: Nodes | None = None, budget: float | None = None) -> Calibration:
    """Measure a Calibration over ``comm`` now (collective; no cache). ``nodes``: which ranks
    share a node where they do not all share one (None: by host). ``budget``: seconds the
    whole measurement may take; before each phase the ranks agree on the longest time spent
    so far (one small MAX allreduce in place of the phase's barrier), and once it is past the
    budget every rank stops there alike and raises :class:`MeasurementOverrun`."""
    timeout = timeout_from_env(timeout)
    size, rank = comm.Get_size(), comm.Get_rank()
    scheds = _overhead_schedules(size) if size > 1 else []
    started = time.perf_counter()
    phases: dict[str, float] = {}
    raw: list[float] = []

    def phase(name: str, fn: Callable[[], float | list[float]]) -> None:
        if budget is None:
            _barrier(comm, timeout, f"before calibration phase {name!r}")
        else:
            spent = float(_allreduce_max(comm, [time.perf_counter() - started], timeout)[0])
            if spent > budget:
                raise MeasurementOverrun(
                    f"the calibration was stopped before its phase {name!r} after "
                    f"{spent:.1f} s, past its budget of {budget:g} s")
        t0 = time.perf_counter()
        got = fn()
        raw.extend(got if isinstance(got, list) else [got])
        phases[name] = round(time.perf_counter() - t0, 4)

    phase("small exchange", lambda: _exchange_time(comm, SMALL_BYTES, 10, timeout))
    phase("large exchange", lambda: _exchange_time(comm, LARGE_BYTES, 3, timeout))
    for i, build in enumerate(scheds):
        phase(f"executor {i}", lambda b=build: _run_schedule(comm, b(rank), 5, timeout))
    phase("reduce", lambda: _reduce_time(LARGE_BYTES, 3))
    tier = _one_node(comm, timeout)
    # shared memory: over all ranks on one node, else on each node at once (hierarchical's
    # node tier); the shm algorithm itself is timed for corrections only on one node
    shared = tier if tier is not None else several_nodes(comm, timeout, nodes)
    if shared is not None:
        phase("shm copy", lambda: _copy_time(LARGE_BYTES, 3))
        phase("shm reduce", lambda: _combine_time(LARGE_BYTES, 3))
        phase("shm sync", lambda: shm_step_time(shared, 10, timeout))
    names = _allreduce_corrected(size, tier is not None)
    for nbytes in NATIVE_BYTES:
        reps = 5 if nbytes < (1 << 20) else 3
        if names and nbytes in CORRECTION_BYTES:
            phase(f"native and {','.join(names)} {nbytes}", lambda n=nbytes, r=reps:
                  _interleaved_times(comm, n, names, r, timeout, tier))
        else:
            phase(f"native {nbytes}", lambda n=nbytes, r=reps: _native_time(comm, n, r, timeout))
    family_names = {c: _family_corrected(c, size, tier is not None) for c in FAMILY}
    for coll in FAMILY:
        for nbytes in FAMILY_BYTES:
            if family_names[coll] and nbytes in FAMILY_CORRECTION_BYTES:
                phase(f"native {coll} and {','.join(family_names[coll])} {nbytes}",
                      lambda c=coll, n=nbytes: _interleaved_family_times(
                          comm, c, n, family_names[c], 3, timeout, tier))
            else:
                phase(f"native {coll} {nbytes}", lambda c=coll, n=nbytes:
                      _native_family_time(comm, c, n, 5 if n < (1 << 20) else 3, timeout))
    worst = _allreduce_max(comm, raw, timeout)
    small, large = float(worst[0]), float(worst[1])
    alpha = small
    beta = max(large - small, 0.0) / LARGE_BYTES if size > 1 else 0.0
    runs = []
    if scheds:
        net = SharedMemoryNode(size)
        for i, build in enumerate(scheds):
            cost = price_symmetric(build(0), net)
            runs.append((cost.nsteps, sum(st.messages for st in cost.steps if st.active),
                         float(worst[2 + i])))
    step_overhead, msg_overhead = fit_overheads(alpha, runs)
    at = 2 + len(scheds)
    gamma = float(worst[at]) / LARGE_BYTES
    shm_copy = shm_reduce = shm_sync = 0.0
    if shared is not None:
        shm_copy = float(worst[at + 1]) / LARGE_BYTES
        shm_reduce, shm_sync = float(worst[at + 2]), float(worst[at + 3])
        at += 3
        shared.free()
    native, measured_runs, i = [], [], at + 1
    for nbytes in NATIVE_BYTES:
        native.append((nbytes, float(worst[i])))
        i += 1
        if names and nbytes in CORRECTION_BYTES:
            measured_runs += [(a, nbytes, float(worst[i + j])) for j, a in enumerate(names)]
            i += len(names)
    natives, family_runs = [], []
    for coll in FAMILY:
        for nbytes in FAMILY_BYTES:
            natives.append((coll, int(worst[i]), float(worst[i + 1])))
            i += 2
            if family_names[coll] and nbytes in FAMILY_CORRECTION_BYTES:
                family_runs += [(coll, a, nbytes, float(worst[i + j]))
                                for j, a in enumerate(family_names[coll])]
                i += len(family_names[coll])
    shm = {"shm_sync": shm_sync, "shm_copy": shm_copy, "shm_reduce": shm_reduce}
    base = Calibration(alpha=alpha, beta=beta, step_overhead=step_overhead,
                       msg_overhead=msg_overhead, gamma=gamma, native=tuple(native), **shm)
    fixes = []
    for name, nbytes, seconds in measured_runs:
        modelled = estimate([name], nbytes // 8, 8, size, calib=base, corrected=False)[name]
        if modelled > 0 and seconds > 0:
            fixes.append((name, nbytes, seconds / modelled))
    family_fixes = []
    for coll, name, nbytes, seconds in family_runs:
        count, itemsize, counts = _family_layout(coll, nbytes, size)
        modelled = estimate([name], count, itemsize, size, calib=base, corrected=False,
                            collective=coll, counts=counts)[name]
        if modelled > 0 and seconds > 0:
            family_fixes.append((coll, name, nbytes, seconds / modelled))
    return Calibration(alpha=alpha, beta=beta, step_overhead=step_overhead,
                       msg_overhead=msg_overhead, gamma=gamma, native=native,
                       corrections=tuple(fixes), natives=tuple(natives),
                       family_corrections=tuple(family_fixes), **shm,
                       meta={"size": size, "seconds": round(time.perf_counter() - started, 3),
                             "phases": phases, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                             # the 1-minute load as the measurement ends, so that a
                             # calibration taken on busy cores says so
                             # (bmlmpi.model.plausibility.overloaded)
                             "loadavg": round(os.getloadavg()[0], 2),
                             "cores": os.cpu_count() or 1})


def _corrected_algorithms(size: int, shm: bool = False) -> list[str]:
    """The algorithms timed for corrections (``shm`` only where all ranks share a node)."""
    return [a for a in records.calibrated(size) if a != "shm" or shm]


def _allreduce_corrected(size: int, shm: bool = False) -> list[str]:
    """The allreduce schedules timed for corrections."""
    return [a for a in _corrected_algorithms(size, shm) if records.get(a).serves("allreduce")]


def _family_corrected(collective: str, size: int, shm: bool = False) -> list[str]:
    """The schedules of ``collective`` timed for its corrections (one rank: none)."""
    if size == 1:
        return []
    return [a for a in _corrected_algorithms(size, shm) if records.get(a).serves(collective)]


def _schedule(name: str, rank: int, size: int, nbytes: int) -> Schedule:
    """The schedule ``auto`` would run for ``nbytes`` of float64 (the builders the model
    prices: bml on the default shape, ring segmented, trees from a flat link matrix)."""
    return records.build(name, records.Context(size, max(nbytes // 8, 1), 8, rank))


# -- the cache ---------------------------------------------------------------------------------

def _hosts(comm: MPI.Comm, timeout: float) -> list[str]:
    name = (MPI.Get_processor_name() or socket.gethostname()).encode()[:_HOST_BYTES]
    mine = np.zeros(_HOST_BYTES, dtype=np.uint8)
    mine[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    allnames = np.empty((comm.Get_size(), _HOST_BYTES), dtype=np.uint8)
    _wait([comm.Iallgather(mine, allnames)], timeout, "exchanging host names")
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in allnames]


def _entry_key(size: int, nodes: int) -> str:
    return f"ranks={size},nodes={nodes}"


def _read_cache(path: Path, key: str) -> Calibration | None:
    """The cached entry ``key`` of ``path``; None where there is none (no file, an older
    format, no entry for these ranks) or it cannot be read, which one warning on logger
    ``bmlmpi`` names (it is then measured again, or ignored where the caller only reads the
    cache)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        entry = data["entries"].get(key)
        return None if entry is None else Calibration.from_dict(entry)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.warning("bmlmpi: the cached calibration %s (%s) cannot be read, so it is "
                     "not used (bmlmpi-calibrate measures it again): %s: %s", path, key,
                     type(exc).__name__, exc)
        return None


def _write_cache(path: Path, key: str, calib: Calibration, host: str, mpi: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError
        except (OSError, ValueError):
            data = {"format": FORMAT, "host": host, "mpi": mpi, "entries": {}}
        data["entries"][key] = calib.to_dict()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home must not break the allreduce
        import warnings
        warnings.warn(f"bmlmpi.calibrate: cannot write the cache {path}: {exc}", stacklevel=3)


# the cache's broadcast vector: flag, 5 parameters, native points, one slot per (algorithm,
# size) factor, (bytes, seconds) per (collective, size) of the family's native calls, the
# shared-memory constants. The factor slots follow the records at call time, so an algorithm
# registered after import (every rank registers the same ones) has its slots too.
_FIX_AT = 6 + 2 * len(NATIVE_BYTES)
#: the last two slots: the load and core count the entry was measured at (``meta``), so that
#: every rank can tell a calibration taken on busy cores (plausibility.overloaded)
_LOAD_SLOTS = 2


def _fix_slots() -> list[tuple[str, int]]:
    return [(a, b) for a in records.corrected() if records.get(a).serves("allreduce")
            for b in CORRECTION_BYTES]


def _family_fix_slots() -> list[tuple[str, str, int]]:
    return [(c, a, b) for c in FAMILY for a in records.corrected() if records.get(a).serves(c)
            for b in FAMILY_CORRECTION_BYTES]


def _layout() -> tuple[list[tuple[str, int]], int, int, list[tuple[str, str, int]], int]:
    """(allreduce factor slots, where the family's natives start, where the shm constants
    start, the family's factor slots, the vector's length); the family's factors follow the
    shm constants."""
    slots = _fix_slots()
    family_at = _FIX_AT + len(slots)
    shm_at = family_at + 2 * len(FAMILY) * len(FAMILY_BYTES)
    family_slots = _family_fix_slots()
    return slots, family_at, shm_at, family_slots, shm_at + 3 + len(family_slots) + _LOAD_SLOTS


def _pack(calib: Calibration | None) -> np.ndarray:
    fix_slots, family_at, shm_at, family_slots, length = _layout()
    vec = np.zeros(length, dtype=np.float64)
    if calib is not None and len(calib.native) <= len(NATIVE_BYTES):
        vec[:6] = (1.0, calib.alpha, calib.beta, calib.step_overhead, calib.msg_overhead,
                   calib.gamma)
        for i, (b, s) in enumerate(calib.native):
            vec[6 + 2 * i:8 + 2 * i] = (b, s)
        for a, b, f in calib.corrections:
            if (a, b) in fix_slots:
                vec[_FIX_AT + fix_slots.index((a, b))] = f
        slot = dict.fromkeys(FAMILY, 0)
        for c, b, t in calib.natives:
            if c in slot and slot[c] < len(FAMILY_BYTES):
                at = family_at + 2 * (FAMILY.index(c) * len(FAMILY_BYTES) + slot[c])
                vec[at:at + 2] = (b, t)
                slot[c] += 1
        vec[shm_at:shm_at + 3] = (calib.shm_sync, calib.shm_copy, calib.shm_reduce)
        for c, a, b, f in calib.family_corrections:
            if (c, a, b) in family_slots:
                vec[shm_at + 3 + family_slots.index((c, a, b))] = f
        load, cores = calib.meta.get("loadavg"), calib.meta.get("cores")
        if isinstance(load, int | float) and isinstance(cores, int) and cores > 0:
            vec[-2:] = (float(load), float(cores))
    return vec


def _unpack(vec: np.ndarray, meta: dict[str, Any]) -> Calibration | None:
    if vec[0] != 1.0:
        return None
    fix_slots, family_at, shm_at, family_slots, _ = _layout()
    native = tuple((int(vec[6 + 2 * i]), float(vec[7 + 2 * i]))
                   for i in range(len(NATIVE_BYTES)) if vec[6 + 2 * i] > 0)
    fixes = tuple((a, b, float(vec[_FIX_AT + i])) for i, (a, b) in enumerate(fix_slots)
                  if vec[_FIX_AT + i] > 0)
    natives = tuple((c, int(vec[at]), float(vec[at + 1]))
                    for j, c in enumerate(FAMILY) for k in range(len(FAMILY_BYTES))
                    if vec[at := family_at + 2 * (j * len(FAMILY_BYTES) + k)] > 0)
    family_fixes = tuple((c, a, b, float(vec[shm_at + 3 + i]))
                         for i, (c, a, b) in enumerate(family_slots)
                         if vec[shm_at + 3 + i] > 0)
    if vec[-1] > 0:
        meta = {**meta, "loadavg": float(vec[-2]), "cores": int(vec[-1])}
    return Calibration(*(float(x) for x in vec[1:6]), native=native, meta=meta,
                       corrections=fixes, natives=natives, family_corrections=family_fixes,
                       shm_sync=float(vec[shm_at]),
                       shm_copy=float(vec[shm_at + 1]), shm_reduce=float(vec[shm_at + 2]))


def calibrate(comm: MPI.Comm, *, use_cache: bool = True,
              timeout: float | None = None, budget: float | None = None,
              measure_missing: bool = True) -> Calibration | None:
    """The machine's Calibration for ``comm``'s ranks: cached, else measured (collective).
    ``budget``: seconds a measurement may take (:func:`measure`; past it
    :class:`MeasurementOverrun` on every rank, nothing cached). ``measure_missing`` False:
    only the cache is read (``BMLMPI_RECALIBRATE`` aside), and None where it holds no entry
    for these ranks (every rank alike: rank 0's reading is broadcast)."""
    timeout = timeout_from_env(timeout)
    work, req = comm.Idup()
    try:
        _wait([req], timeout, "duplicating the communicator")
        size = work.Get_size()
        hosts = _hosts(work, timeout)
        host, mpi, nodes = hosts[0], mpi_library(), len(set(hosts))
        key = _entry_key(size, nodes)
        path = cache_path(host, mpi)
        fresh = not use_cache or config.get("BMLMPI_RECALIBRATE")
        meta = {"host": host, "mpi": mpi, "ranks": size, "nodes": nodes, "cache": str(path)}
        vec = _pack(None if fresh or work.Get_rank() != 0 else _read_cache(path, key))
        _wait([work.Ibcast(vec, root=0)], timeout, "sharing the cached calibration")
        cached = _unpack(vec, {**meta, "source": "cache"})
        if cached is not None:
            return cached
        if not measure_missing and not fresh:
            return None
        measured = measure(work, timeout, budget=budget)
        calib = dataclasses.replace(measured, meta={**meta, **measured.meta,
                                                    "source": "measured"})
        if work.Get_rank() == 0:
            _write_cache(path, key, calib, host, mpi)
        return calib
    finally:
        if work != MPI.COMM_NULL:
            work.Free()


if __name__ == "__main__":
    # ``python -m bmlmpi.calibrate``, the program's earlier name, still starts it.
    from .cli.calibrate import main

    raise SystemExit(main())
