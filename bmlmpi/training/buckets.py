"""``GradientBuckets``: fused, overlapped gradient allreduces for data-parallel training.

Created once per model with its gradient arrays in forward order::

    buckets = bmlmpi.GradientBuckets(grads, comm=bmlmpi.Communicator(MPI.COMM_WORLD),
                                     op=bmlmpi.AVG, plan="ibatch")
    # backward pass, last layer first:
    ...; buckets.mark_ready(i); ...
    # next forward pass, layer by layer (results are in place in grads[i]):
    buckets.wait(i); apply the update of layer i; compute layer i ...
    buckets.wait()            # or everything at once

Buckets and plans: :mod:`bmlmpi.training.plans` (``layer``, ``single``, ``threshold``,
``ibatch``). A bucket's allreduce starts as soon as all its arrays are marked ready and every
bucket before it in the plan's start order has started: all ranks must start the same
allreduces in the same order (bmlmpi matches them by call order), so a bucket ready early on one
rank waits for its predecessors. Buckets that the plan reduces after the backward pass (the
forward overlap) start once every array is marked ready.

Fusion. Each bucket runs one allreduce per dtype among its arrays. Where those arrays lie one
after another in one writable C-contiguous block (:func:`flat_arena` makes such a block), the
allreduce runs in place on that slice of the block; otherwise the arrays are copied into a
flat buffer before the allreduce and back after it.

Progress. bmlmpi's allreduce advances only inside ``Test``/``Wait`` of its requests, so a
progress thread polls the requests in flight (every ``poll_interval`` seconds, sleeping in
between so that it costs little while the caller computes, and at once again after a bucket
completed: :class:`bmlmpi.execute.Pacer`). numpy's compiled loops release
the GIL, so the allreduce advances while the caller's thread computes. The MPI library is
initialised by mpi4py with ``MPI_THREAD_MULTIPLE`` (its default; the Open MPI wheel grants it,
``MPI.Query_thread() == MPI.THREAD_MULTIPLE``); every call into the communicator is made under
this object's lock, since a :class:`bmlmpi.Communicator` is not thread-safe. **The
communicator handed to GradientBuckets must not be used by the caller while buckets are in
flight** (after ``wait()`` it may be).

Registration is checked once across ranks at construction: the same number of arrays, each
of the same shape and dtype, in the same order, the same op and plan. A mismatch raises
:class:`RegistrationMismatch` on every rank (the check is an allreduce of a hash, with the
communicator's deadline), never a hang.

Deadlines: ``wait`` raises :class:`bmlmpi.DeadlineExceeded` when no bucket completes and no
allreduce in flight advances a step (``Request.run.progress``, bmlmpi's own rule: a slow but
progressing allreduce never times out, e.g. a 25 MiB bucket on a 100 Mbit/s link) for
``timeout`` seconds (default: the communicator's). An error in the progress thread (a failed
allreduce) is raised by the next ``wait`` or ``mark_ready``.

Fault tolerance: with ``bmlmpi.Communicator(comm, fault_tolerant=True)`` the allreduces in
flight survive the death of ranks (the communicator recovers inside ``Test``, called by the
progress thread). Buckets that completed earlier in the iteration still hold the dead rank's
contribution, so when the membership changed during an iteration, every bucket of that
iteration is reduced again over the survivors, from a copy of its input kept for this purpose
(only on a fault-tolerant communicator): after ``wait()`` every array holds the exact reduction
over the survivors. ``revised`` lists the arrays whose result a ``wait(i)`` had already
returned before such a re-reduction; ``failed`` the original ranks lost so far.
With ``compression`` the contract is a direct compressed call's on that communicator
(:mod:`bmlmpi.compression.layer`): no re-reduction (it would apply the error feedback twice,
and no input copy is kept); a rank failing makes the compressed call in flight, the same
bucket on every survivor (compressed calls run one after another in the same order), raise
:class:`bmlmpi.ft.FaultToleranceError`, which the next ``wait`` or ``mark_ready`` raises on
every survivor; that bucket's arrays hold their input, the buckets completed before hold the
sums with the dead rank's input, and the communicator must not be used again (end the rank
with ``bmlmpi.ft.finish``).

Profiling (``plan="ibatch"`` without a ``profile``): the first iteration runs the ``single``
plan as a warm-up; the next three are profiled with the same plan: backward times from the gaps
between ``mark_ready`` calls, forward times from the gaps between one ``wait(i)`` returning and
the next ``wait(i+1)`` being called (so the caller should wait layer by layer in the forward
pass; otherwise the forward times are taken as zero and only the backward overlap is planned).
At the first ``mark_ready`` of the fifth iteration the ranks agree on the profile (each layer's
median over the three iterations, then the maximum over ranks: one allreduce) and switch to the
iBatch plan; the startup and per-byte times come
from the cost model or, with ``cost="measured"``, from allreduces timed on the communicator
right then (:mod:`bmlmpi.training.costs`; the way to plan on a network the calibration cache
does not describe, such as the emulated testbed).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from ..execute import Pacer
from .costs import COSTS
from .ibatch import Batching, Profile
from .plans import PLANS, make_plan, start_order

PROFILE_WARMUP = 1      # iterations before the profiled ones
PROFILE_ITERATIONS = 3  # profiled iterations; each layer's median is kept (a loaded machine)


class RegistrationMismatch(ValueError):
    """Ranks registered different gradient arrays (count, shapes, dtypes, order), op or plan."""


def flat_arena(shapes: Sequence[Sequence[int]], dtype: Any = np.float64
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One flat block and views into it, one per shape, laid out back to back: gradient arrays
    that GradientBuckets reduces in place, without fusion copies."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    flat = np.zeros(sum(sizes), dtype=dtype)
    views, off = [], 0
    for s, n in zip(shapes, sizes, strict=True):
        views.append(flat[off:off + n].reshape(tuple(s)))
        off += n
    return flat, views


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _arena_view(members: list[np.ndarray]) -> np.ndarray | None:
    """A flat view over ``members`` when they lie back to back in one writable C-contiguous
    block (in order), else None. Empty arrays hold no bytes and may sit anywhere."""
    members = [a for a in members if a.nbytes]
    if not members:
        return None
    root = _root(members[0])
    if not (root.flags.c_contiguous and root.flags.writeable):
        return None
    pos = _address(members[0])
    for a in members:
        if _root(a) is not root or _address(a) != pos:
            return None
        pos += a.nbytes
    offset = _address(members[0]) - _address(root)
    raw = root.reshape(-1).view(np.uint8)
    nbytes = pos - _address(members[0])
    return raw[offset:offset + nbytes].view(members[0].dtype)


@dataclass
class _Group:
    """The arrays of one dtype in one bucket and the buffer their allreduce runs on."""

    members: list[int]
    buffer: np.ndarray
    in_place: bool
    saved: np.ndarray | None = None


@dataclass
class _Bucket:
    index: int
    first: int
    end: int
    groups: list[_Group]
    ready: int = 0
    started: bool = False
    done: bool = True
    handed_out: bool = False
    start_time: float = 0.0
    requests: list[Any] = field(default_factory=list)
    steps: int = 0         # _steps_done(requests) at the last poll


def _steps_done(requests: list[Any]) -> int:
    """Steps completed so far by these allreduces (``Request.run.progress``, which grows
    whenever a step of the exchange completes; 0 while a request has no run, e.g. during a
    fault-tolerant recovery or between a compressed call's stages)."""
    total = 0
    for r in requests:
        run = r.run
        if run is not None:
            total += run.progress
    return total


class GradientBuckets:
    """Fused, overlapped allreduces of a model's gradient arrays (module docstring).

    ``grads``: the gradient arrays in forward order (any dtypes and shapes, C-contiguous,
    writable). ``comm``: a :class:`bmlmpi.Communicator` or an mpi4py communicator (wrapped in
    one; default ``MPI.COMM_WORLD``). ``op``: default ``bmlmpi.AVG``. ``plan``: ``layer``,
    ``single``, ``threshold`` or ``ibatch`` (or a :class:`~bmlmpi.training.ibatch.Batching`).
    ``fusion_bytes``: the threshold plan's cap (default ``BMLMPI_FUSION_BYTES``, 25 MiB).
    ``profile``: the ibatch plan's :class:`~bmlmpi.training.ibatch.Profile` (default: measured).
    ``fusion``: ``"auto"`` (in place where the arrays form one block, else copies) or
    ``"copy"`` (always copies). ``cost``: where the measured ibatch plan takes its startup and
    per-byte times, ``"model"`` (the cost model) or ``"measured"`` (allreduces timed on ``comm``
    during the re-plan: :mod:`bmlmpi.training.costs`). ``timeout``: seconds a wait may go
    without a bucket completing.
    ``compression``: a :mod:`bmlmpi.compression` compressor or spec (``"fp16"``,
    ``"tdf:PHI:D:P"``); each group's allreduce is then compressed with error feedback kept per
    group of arrays (moved along when the ibatch plan regroups them); on a fault-tolerant
    communicator a rank failing makes every survivor raise
    :class:`bmlmpi.ft.FaultToleranceError` (module docstring).
    ``reproducible``: each group's allreduce in reproducible mode (docs/reproducible.md; None:
    the communicator's own): its bits depend on the gradients alone for a given bucket layout,
    whatever the algorithm, the order of the ranks or a survivors' re-reduction (a value's
    block of the format lies in its bucket, so a plan that regroups the arrays, such as
    ibatch's after profiling, may change the low bits); with ``compression`` refused on
    every rank.
    """

    def __init__(self, grads: Sequence[np.ndarray], comm: Any = None, op: Any = None,
                 plan: str | Batching = "threshold", *, fusion_bytes: int | None = None,
                 profile: Profile | None = None, fusion: str = "auto",
                 timeout: float | None = None, poll_interval: float = 2e-4,
                 cost: str = "model", compression: Any = None,
                 reproducible: bool | None = None):
        from .. import AVG, Communicator
        if comm is None:
            comm = MPI.COMM_WORLD
        if isinstance(comm, MPI.Comm):
            comm = Communicator(comm)
        self.comm = comm
        self.op = AVG if op is None else op
        self.grads = list(grads)
        if fusion not in ("auto", "copy"):
            raise ValueError(f"fusion must be 'auto' or 'copy', got {fusion!r}")
        self._fusion = fusion
        self.cost = cost   # checked in _check_arrays, so that every rank raises
        self.timeout = float(comm.timeout if timeout is None else timeout)
        self.poll_interval = poll_interval
        self.fault_tolerant = comm.fault_tolerant
        # compression hook: each group's allreduce goes through bmlmpi.compression, its
        # error-feedback memory kept per group of registered arrays (key: member indices)
        from ..compression import parse
        self.compression = parse(compression)
        self.reproducible = reproducible
        # a failure is recovered by re-reducing the iteration's buckets from a copy of their
        # input, except under a compressor with memory (module docstring)
        self._rereduce = self.fault_tolerant and (self.compression is None
                                                  or self.compression.identity)
        self._lock = threading.Lock()          # every call into the communicator
        self._cond = threading.Condition()     # bucket state between the two threads
        self._error: BaseException | None = None
        self._completions = 0
        self._steps = 0                        # step completions seen by the progress thread
        self._thread: threading.Thread | None = None
        self._stop = False
        plan_name = plan if isinstance(plan, str) else "custom"
        problem = self._check_arrays(plan_name)
        self._check_registration(plan, plan_name, fusion_bytes, problem)
        self.nbytes = [a.nbytes for a in self.grads]
        self.plan_name = plan_name
        self._profile_given = profile
        self._profiles: list[tuple[list[float], list[float]]] = []
        self._timeline: list[tuple[str, int, float, float]] = []
        self.record_timeline = False
        self._marks = [0.0] * len(self.grads)
        self._wait_exit = [None] * len(self.grads)
        self._wait_entry = [None] * len(self.grads)
        self._iteration = 0
        self._marked = [False] * len(self.grads)
        self._n_marked = 0
        self.revised: set[int] = set()
        self._members_at_start: Any = None
        self.profile: Profile | None = profile
        self._buckets: list[_Bucket] = []
        if plan_name == "ibatch" and profile is None:
            self._install(make_plan("single", self.nbytes))
        else:
            self._install(plan if isinstance(plan, Batching) else
                          make_plan(plan_name, self.nbytes, fusion_bytes=fusion_bytes,
                                    profile=profile))

    # -- set-up ---------------------------------------------------------------------------
    def _check_arrays(self, plan_name: str) -> str | None:
        """This rank's objection to its arguments, or None (raised after the collective check
        so that every rank raises)."""
        if not self.grads:
            return "GradientBuckets needs at least one gradient array"
        if plan_name not in (*PLANS, "custom"):
            return f"unknown plan {plan_name!r}; plans: {', '.join(PLANS)}"
        if self.cost not in COSTS:
            return f"cost must be one of {', '.join(COSTS)}, got {self.cost!r}"
        wanted = self.comm.reproducible if self.reproducible is None else self.reproducible
        if wanted and self.compression is not None:
            return ("compression in reproducible mode: a compressor rounds each rank's values, "
                    "so no exact sum is left to reproduce (reproducible=False)")
        for i, a in enumerate(self.grads):
            if not isinstance(a, np.ndarray):
                return f"gradient {i} is a {type(a).__name__}, not a numpy array"
            if not a.flags.c_contiguous or not a.flags.writeable:
                return f"gradient {i} must be C-contiguous and writable"
        return None

    def _signature(self, plan: str | Batching, fusion_bytes: int | None) -> tuple:
        from ..ops import op_name
        arrays = tuple((tuple(a.shape), a.dtype.str) for a in self.grads
                       if isinstance(a, np.ndarray))
        return (arrays, op_name(self.op), plan if isinstance(plan, str) else
                (plan.ends, plan.split), fusion_bytes,
                None if self.compression is None else self.compression.name,
                self.comm.reproducible if self.reproducible is None else self.reproducible)

    def _check_registration(self, plan, plan_name, fusion_bytes, problem) -> None:
        sig = self._signature(plan, fusion_bytes)
        digest = hashlib.blake2b(repr(sig).encode(), digest_size=8).digest()
        h = int.from_bytes(digest, "little") >> 1
        vec = np.array([h, -h, 1 if problem else 0], dtype=np.int64)
        out = np.empty_like(vec)
        # bmlmpi's allreduce keeps the communicator's deadline: a rank that never registers
        # makes the others raise DeadlineExceeded instead of hanging
        self.comm.Allreduce(vec, out, MPI.MAX)
        if problem:
            raise RegistrationMismatch(problem)
        if out[2]:
            raise RegistrationMismatch("another rank rejected its gradient arrays (see its "
                                       "error); GradientBuckets is not created on any rank")
        if out[0] != -out[1]:
            everyone = self.comm.comm.allgather(sig)
            lines = []
            for r, s in enumerate(everyone):
                arrays = ", ".join(f"{shape}:{np.dtype(dt)}" for shape, dt in s[0][:8])
                more = f" (+{len(s[0]) - 8} more)" if len(s[0]) > 8 else ""
                lines.append(f"rank {r}: {len(s[0])} arrays [{arrays}{more}] op={s[1]} "
                             f"plan={s[2]} fusion_bytes={s[3]}")
            raise RegistrationMismatch("ranks registered different gradient arrays, op or "
                                       "plan: " + "; ".join(lines))

    def _install(self, plan: Batching) -> None:
        n = len(self.grads)
        old_keys = [tuple(g.members) for b in self._buckets for g in b.groups]
        if not plan.ends or plan.ends[-1] != n:
            raise ValueError(f"the plan {plan.ends} does not cover the {n} arrays")
        self.plan = plan
        self._buckets = []
        self._bucket_of = [0] * n
        for b, (first, end) in enumerate(plan.buckets):
            groups: dict[str, list[int]] = {}
            for i in range(first, end):
                groups.setdefault(self.grads[i].dtype.str, []).append(i)
                self._bucket_of[i] = b
            made = [self._make_group(m) for m in groups.values()]
            self._buckets.append(_Bucket(b, first, end, made))
        if self.compression is not None and old_keys:
            self.compression.regroup(old_keys, [tuple(g.members) for b in self._buckets
                                                for g in b.groups],
                                     [a.size for a in self.grads])
        self._order = start_order(plan)
        self._next_start = 0   # position in _order of the next bucket to start
        self._deferred_from = sum(1 for b in self._buckets if b.first >= plan.split)

    def _make_group(self, members: list[int]) -> _Group:
        arrays = [self.grads[i] for i in members]
        view = _arena_view(arrays) if self._fusion == "auto" else None
        if view is not None:
            group = _Group(members, view, True)
        else:
            total = sum(a.size for a in arrays)
            group = _Group(members, np.empty(total, dtype=arrays[0].dtype), False)
        if self._rereduce:
            group.saved = np.empty_like(group.buffer)   # for a re-reduction over survivors
        return group

    # -- the iteration --------------------------------------------------------------------
    def mark_ready(self, i: int) -> None:
        """Array ``i`` holds this iteration's gradient; its bucket starts once complete."""
        self._raise_error()
        n = len(self.grads)
        if not 0 <= i < n:
            raise IndexError(f"array index {i} out of range for {n} arrays")
        now = time.perf_counter()
        if self._n_marked == n:
            self._new_iteration(i, now)
        if self._marked[i]:
            raise RuntimeError(f"array {i} was marked ready twice in one iteration")
        bucket = self._buckets[self._bucket_of[i]]
        with self._cond:
            if not bucket.done:
                raise RuntimeError(f"array {i} marked ready while its bucket from the previous "
                                   f"iteration is still being reduced: wait({i}) first")
        self._marks[i] = now
        self._marked[i] = True
        self._n_marked += 1
        bucket.ready += 1
        if self._n_marked == 1:
            self._members_at_start = self._membership()
        self._start_ready()

    def _new_iteration(self, first: int, now: float) -> None:
        with self._cond:
            busy = [b.index for b in self._buckets if not b.done]
        if busy:
            # their results are still to be written into the arrays the caller now refills
            raise RuntimeError(f"a new iteration began (mark_ready({first})) while buckets "
                               f"{busy} of the previous one are still being reduced: wait() "
                               f"for them first")
        self._iteration += 1
        if (self.plan_name == "ibatch" and self._profile_given is None
                and PROFILE_WARMUP < self._iteration <= PROFILE_WARMUP + PROFILE_ITERATIONS):
            self._profiles.append(self._measured_profile(first, now))
            if self._iteration == PROFILE_WARMUP + PROFILE_ITERATIONS:
                self._replan()
        self._marked = [False] * len(self.grads)
        self._n_marked = 0
        self._wait_entry = [None] * len(self.grads)
        self._wait_exit = [None] * len(self.grads)
        self.revised = set()
        for b in self._buckets:
            b.ready = 0
            b.started = False
            b.handed_out = False
        self._next_start = 0

    def _start_ready(self) -> None:
        all_ready = self._n_marked == len(self.grads)
        while self._next_start < len(self._order):
            b = self._buckets[self._order[self._next_start]]
            if b.ready < b.end - b.first:
                return
            if self._next_start >= self._deferred_from and not all_ready:
                return
            self._start(b)
            self._next_start += 1

    def _member_slices(self, g: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(each member array, flat; its range of the group's fused buffer), in order."""
        off = 0
        for i in g.members:
            a = self.grads[i].reshape(-1)
            yield a, g.buffer[off:off + a.size]
            off += a.size

    def _start(self, bucket: _Bucket) -> None:
        for g in bucket.groups:
            if not g.in_place:
                for a, part in self._member_slices(g):
                    part[:] = a
            if g.saved is not None:
                np.copyto(g.saved, g.buffer)
        t0 = time.perf_counter()
        with self._cond:
            bucket.done = False
            bucket.started = True
            bucket.start_time = t0
        self._launch(bucket)
        self._ensure_thread()

    def _launch(self, bucket: _Bucket) -> None:
        reqs = []
        with self._lock:
            for g in bucket.groups:
                if self.compression is None:
                    reqs.append(self.comm.Iallreduce(MPI.IN_PLACE, g.buffer, self.op,
                                                     reproducible=self.reproducible))
                else:
                    reqs.append(self.comm.compression.start(
                        MPI.IN_PLACE, g.buffer, self.op, self.compression,
                        key=tuple(g.members)))
        with self._cond:
            bucket.requests = reqs
            bucket.steps = 0
            self._cond.notify_all()

    def _finish(self, bucket: _Bucket) -> None:
        """Copy a reduced bucket back into the arrays (progress thread)."""
        for g in bucket.groups:
            if not g.in_place:
                for a, part in self._member_slices(g):
                    a[:] = part

    def wait(self, i: int | None = None) -> None:
        """Block until array ``i``'s bucket (default: every bucket) is reduced; the results
        are then in the registered arrays."""
        entry = time.perf_counter()
        if i is None:
            if 0 < self._n_marked < len(self.grads):
                missing = [j for j in range(len(self.grads)) if not self._marked[j]]
                raise RuntimeError(f"wait(): arrays {missing[:10]} were not marked ready "
                                   f"this iteration, so their buckets cannot start")
            targets = [b for b in self._buckets if b.started]
        else:
            if not 0 <= i < len(self.grads):
                raise IndexError(f"array index {i} out of range for {len(self.grads)} arrays")
            b = self._buckets[self._bucket_of[i]]
            if not b.started and b.ready:
                raise RuntimeError(f"wait({i}): its bucket has not started: arrays "
                                   f"{b.first}..{b.end - 1} and every bucket started before "
                                   f"it must be marked ready first")
            targets = [b]
            self._wait_entry[i] = entry
        self._wait_until(lambda: all(b.done for b in targets))
        if self._rereduce and all(b.done for b in self._buckets) \
                and self._n_marked == len(self.grads):
            self._settle_failures()
        for b in targets:
            b.handed_out = True
        if i is not None:
            self._wait_exit[i] = time.perf_counter()

    def done(self, i: int | None = None) -> bool:
        """Whether array ``i``'s bucket (default: every started bucket) is reduced, without
        blocking (the progress thread advances the allreduces)."""
        self._raise_error()
        with self._cond:
            if i is None:
                return all(b.done for b in self._buckets)
            return self._buckets[self._bucket_of[i]].done

    def _wait_until(self, predicate) -> None:
        with self._cond:
            last = time.monotonic()
            seen = (self._completions, self._steps)
            while not predicate():
                self._raise_error_locked()
                self._cond.wait(0.05)
                if (self._completions, self._steps) != seen:
                    seen, last = (self._completions, self._steps), time.monotonic()
                elif time.monotonic() - last > self.timeout:
                    from .. import DeadlineExceeded
                    busy = [b.index for b in self._buckets if b.started and not b.done]
                    raise DeadlineExceeded(
                        f"GradientBuckets (rank {self.comm.rank}): no bucket completed or "
                        f"advanced in {self.timeout:g} s; buckets in flight: {busy}")
            self._raise_error_locked()

    # -- progress thread ------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._progress_loop, daemon=True,
                                            name="bmlmpi-buckets-progress")
            self._thread.start()

    def _progress_loop(self) -> None:
        pacer = Pacer(self.poll_interval, self.poll_interval)
        try:
            while True:
                with self._cond:
                    while not self._stop and not any(b.requests for b in self._buckets):
                        self._cond.wait()
                    if self._stop:
                        return
                    busy = [b for b in self._buckets if b.requests]
                completed = False
                for b in sorted(busy, key=lambda b: b.start_time):
                    with self._lock:
                        finished = all(r.Test() for r in b.requests)
                        steps = _steps_done(b.requests)
                    if steps != b.steps:
                        with self._cond:
                            b.steps = steps
                            self._steps += 1
                    if finished:
                        completed = True
                        self._finish(b)
                        end = time.perf_counter()
                        with self._cond:
                            b.requests = []
                            b.done = True
                            self._completions += 1
                            if self.record_timeline:
                                self._timeline.append(("comm", b.index, b.start_time, end))
                            self._cond.notify_all()
                pacer.pause(completed)
        except BaseException as exc:   # handed to the caller's next wait
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _raise_error(self) -> None:
        with self._cond:
            self._raise_error_locked()

    def _raise_error_locked(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the progress thread (after waiting for the buckets in flight)."""
        try:
            if self._error is None and any(b.started and not b.done for b in self._buckets):
                self.wait()
        finally:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join(timeout=self.timeout)
                self._thread = None

    def __enter__(self) -> GradientBuckets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fault tolerance ------------------------------------------------------------------
    def _membership(self) -> Any:
        return (self.comm.failed, self.comm.size)

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(self.comm.failed)

    def _settle_failures(self) -> None:
        """If ranks were lost during this iteration, reduce every bucket of it again over the
        survivors from its saved input (in start order: the same calls on every survivor)."""
        while self._members_at_start is not None and self._membership() != self._members_at_start:
            self._members_at_start = self._membership()
            for pos in range(self._next_start):
                b = self._buckets[self._order[pos]]
                if b.handed_out:
                    self.revised.update(range(b.first, b.end))
                for g in b.groups:
                    np.copyto(g.buffer, g.saved)
                with self._cond:
                    b.done = False
                    b.start_time = time.perf_counter()
                self._launch(b)
            self._wait_until(lambda: all(b.done for b in self._buckets))

    # -- profiling and the iBatch plan -----------------------------------------------------
    def _measured_profile(self, first: int, now: float) -> tuple[list[float], list[float]]:
        n = len(self.grads)
        marks = self._marks
        backward = [0.0] * n
        for i in range(n - 1):
            backward[i] = max(marks[i] - marks[i + 1], 0.0)
        forward = [0.0] * n
        exits, entries = self._wait_exit, self._wait_entry
        if all(x is not None for x in exits) and all(x is not None for x in entries):
            for i in range(n - 1):
                forward[i] = max(entries[i + 1] - exits[i], 0.0)
            if first == n - 1:
                # the last layer's forward and backward run back to back before its mark
                top = max(now - exits[n - 1], 0.0)
                forward[n - 1] = backward[n - 1] = top / 2
        return forward, backward

    def _replan(self) -> None:
        from .costs import comm_cost, measured_cost
        vec = np.median(np.array([f + b for f, b in self._profiles], dtype=np.float64), axis=0)
        agreed = np.empty_like(vec)
        with self._lock:
            self.comm.Allreduce(vec, agreed, MPI.MAX)
        n = len(self.grads)
        with self._lock:   # no bucket is in flight here: the timed calls run alone
            startup, per_byte = (measured_cost if self.cost == "measured" else
                                 comm_cost)(self.comm, self.grads)
        self.profile = Profile(tuple(agreed[:n]), tuple(agreed[n:]), tuple(self.nbytes),
                               startup, per_byte)
        self._install(make_plan("ibatch", self.nbytes, profile=self.profile))

    # -- inspection -----------------------------------------------------------------------
    @property
    def buckets(self) -> list[tuple[int, int]]:
        """(first, end) array ranges of the buckets, forward order."""
        return self.plan.buckets

    def timeline(self) -> list[tuple[str, int, float, float]]:
        """(kind, bucket, start, end) of each allreduce recorded (``record_timeline = True``),
        ``time.perf_counter`` seconds."""
        with self._cond:
            return list(self._timeline)

    def __repr__(self) -> str:
        return (f"GradientBuckets({len(self.grads)} arrays, plan={self.plan_name!r}, "
                f"buckets={self.buckets})")


__all__ = ["GradientBuckets", "RegistrationMismatch", "flat_arena"]
