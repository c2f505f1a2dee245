"""Runs a Schedule over mpi4py. No algorithm logic lives here: it only posts what the schedule
says, waits against a deadline and applies the reductions through :mod:`bmlmpi.kernels`.

A schedule is compiled once per signature into a :class:`Plan` (per step: the communicator and
peer of each transfer, its tag offset, where reduce-receives land in scratch). A call is a
:class:`Run`, a small state machine advanced by ``test()``; ``wait()`` drives it with a deadline
that restarts whenever a step completes, so a slow but progressing allreduce never times out and
a stuck one fails naming the step and the peers it was waiting for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from . import kernels
from .ops import kernel_op
from .schedules.types import Schedule

DEFAULT_TIMEOUT = 120.0
TAG_STEPS = 4096  # tag slots per call: (step·streams + stream) folded modulo this


def timeout_from_env(value: float | None = None) -> float:
    """The deadline in seconds: explicit, else ``BMLMPI_TIMEOUT``, else 120 s."""
    if value is not None:
        return float(value)
    env = os.environ.get("BMLMPI_TIMEOUT")
    return float(env) if env else DEFAULT_TIMEOUT


class DeadlineExceeded(TimeoutError):
    """A wait made no progress within its deadline."""


@dataclass(frozen=True, slots=True)
class _Post:
    comm: int        # index into the plan's communicators
    peer: int        # rank in that communicator
    world_peer: int  # rank in the allreduce communicator (for messages)
    lo: int
    hi: int
    tag: int         # offset added to the call's tag base
    scratch: int     # reduce-receive: element offset in scratch; -1 otherwise


@dataclass(frozen=True, slots=True)
class _StepPlan:
    sends: tuple[_Post, ...]
    recvs: tuple[_Post, ...]
    # (lo, hi, scratch offsets) for each range that receives reductions
    reduces: tuple[tuple[int, int, tuple[int, ...]], ...]


class Plan:
    """A schedule compiled for execution on given communicators."""

    def __init__(self, sched: Schedule, comms: list[MPI.Comm],
                 level_peer: Callable[[int, int], tuple[int, int]]):
        """``level_peer(level, world_peer) -> (comm index, peer rank in that comm)``."""
        self.sched = sched
        self.comms = comms
        steps = []
        scratch_need = 0
        for i, st in enumerate(sched.steps):
            sends = []
            for t in st.sends:
                ci, p = level_peer(t.level, t.peer)
                sends.append(_Post(ci, p, t.peer, t.lo, t.hi,
                                   (i * sched.streams + t.stream) % TAG_STEPS, -1))
            recvs, groups, off = [], {}, 0
            for t in st.recvs:
                ci, p = level_peer(t.level, t.peer)
                s_off = -1
                if t.reduce:
                    s_off = off
                    off += t.hi - t.lo
                    groups.setdefault((t.lo, t.hi), []).append(s_off)
                recvs.append(_Post(ci, p, t.peer, t.lo, t.hi,
                                   (i * sched.streams + t.stream) % TAG_STEPS, s_off))
            scratch_need = max(scratch_need, off)
            steps.append(_StepPlan(tuple(sends), tuple(recvs),
                                   tuple((lo, hi, tuple(o)) for (lo, hi), o in groups.items())))
        self.steps = tuple(steps)
        self.scratch_elems = scratch_need
        self._pool: list[np.ndarray] = []

    def take_scratch(self, dtype: np.dtype) -> np.ndarray:
        while self._pool:
            s = self._pool.pop()
            if s.dtype == dtype:
                return s
        return np.empty(self.scratch_elems, dtype=dtype)

    def give_scratch(self, s: np.ndarray) -> None:
        self._pool.append(s)


class Run:
    """One execution of a Plan on one buffer; advance with :meth:`test`, finish with :meth:`wait`."""

    def __init__(self, plan: Plan, buf: np.ndarray, op: str, tag_base: int, label: str,
                 finish: Callable[[], None] | None = None):
        self.plan = plan
        self.buf = buf
        self.kop = kernel_op(op)
        self.tag_base = tag_base
        self.label = label
        self.finish = finish
        self.step = 0
        self.reqs: list[MPI.Request] | None = None
        self.done = False
        self.scratch = plan.take_scratch(buf.dtype) if plan.scratch_elems else None

    def _post(self) -> None:
        sp = self.plan.steps[self.step]
        comms = self.plan.comms
        buf, scratch = self.buf, self.scratch
        reqs = []
        # Receives first so that eager messages land directly in place.
        for p in sp.recvs:
            tag = self.tag_base + p.tag
            n = p.hi - p.lo
            view = buf[p.lo:p.hi] if p.scratch < 0 else scratch[p.scratch:p.scratch + n]
            reqs.append(comms[p.comm].Irecv([view, MPI.BYTE], p.peer, tag))
        for p in sp.sends:
            tag = self.tag_base + p.tag
            reqs.append(comms[p.comm].Isend([buf[p.lo:p.hi], MPI.BYTE], p.peer, tag))
        self.reqs = reqs

    def _complete_step(self) -> None:
        sp = self.plan.steps[self.step]
        buf, scratch = self.buf, self.scratch
        for lo, hi, offs in sp.reduces:
            n = hi - lo
            srcs = [scratch[o:o + n] for o in offs]
            if len(srcs) == 1:
                kernels.reduce_into(buf[lo:hi], srcs[0], self.kop)
            else:
                kernels.reduce_many_into(buf[lo:hi], srcs, self.kop)
        self.reqs = None
        self.step += 1

    def test(self) -> bool:
        """Advance as far as possible without blocking; True once the allreduce is complete."""
        if self.done:
            return True
        nsteps = len(self.plan.steps)
        while self.step < nsteps:
            if self.reqs is None:
                self._post()
            if not MPI.Request.Testall(self.reqs):
                return False
            self._complete_step()
        self._finalise()
        return True

    def _finalise(self) -> None:
        if self.scratch is not None:
            self.plan.give_scratch(self.scratch)
            self.scratch = None
        if self.finish is not None:
            self.finish()
        self.done = True

    def pending(self) -> str:
        if self.reqs is None:
            return "nothing"
        sp = self.plan.steps[self.step]
        posts = [("recv from", p) for p in sp.recvs] + [("send to", p) for p in sp.sends]
        waiting = [f"{kind} rank {p.world_peer} [{p.lo}:{p.hi})"
                   for (kind, p), r in zip(posts, self.reqs, strict=True)
                   if r != MPI.REQUEST_NULL and not r.Test()]
        return ", ".join(waiting[:8]) + (" ..." if len(waiting) > 8 else "")

    def cancel(self) -> None:
        for r in self.reqs or ():
            if r != MPI.REQUEST_NULL:
                try:
                    r.Cancel()
                except MPI.Exception:
                    pass

    def describe_timeout(self, timeout: float) -> str:
        msg = (f"{self.label}: step {self.step + 1} of {len(self.plan.steps)} made no progress "
               f"in {timeout:g} s; waiting for: {self.pending()}")
        self.cancel()
        return msg


def _spin_seconds() -> float:
    return float(os.environ.get("BMLMPI_SPIN", "0.05"))


def wait_for(test: Callable[[], bool], timeout: float, describe: Callable[[float], str],
             progress: Callable[[], object] = lambda: None) -> None:
    """Poll ``test`` until it is true; raise DeadlineExceeded after ``timeout`` s without progress.

    MPI makes progress only inside its calls (a shared-memory rendezvous copy happens in the
    receiver's Test), so the first ``BMLMPI_SPIN`` seconds (default 0.05) poll continuously,
    yielding the core between polls so an oversubscribed peer can run; after that the poll
    sleeps up to 1 ms between tests, so long waits (slow links, missing peers) cost no CPU.
    """
    if test():
        return
    start = last = time.monotonic()
    mark = progress()
    spin = _spin_seconds()
    while not test():
        now = time.monotonic()
        cur = progress()
        if cur != mark:
            mark, last = cur, now
        elif now - last > timeout:
            raise DeadlineExceeded(describe(timeout))
        if now - start < spin:
            os.sched_yield()
        else:
            time.sleep(min(1e-3, (now - start) * 0.02))
