"""Runs a Schedule over mpi4py. No algorithm logic lives here: it only posts what the schedule
says, waits against a deadline and applies the reductions through :mod:`bmlmpi.kernels`.

A schedule is compiled once per signature into a :class:`Plan` (per step: the communicator and
peer of each transfer, its tag offset, where reduce-receives land in scratch). A call is a
:class:`Run`, a small state machine advanced by ``test()``; ``wait()`` drives it with a deadline
that restarts whenever a step completes, so a slow but progressing allreduce never times out and
a stuck one fails naming the step and the peers it was waiting for.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from mpi4py import MPI

from . import config
from .deferred import Deferred, Ranges, analyse
from .kernels.combine import combine_trusted, reduce_trusted
from .ops import kernel_op
from .schedules.types import (
    INPUT,
    OUTPUT,
    WORK,
    Copy,
    Schedule,
    merged_ranges,
    streams_are_independent,
)

DEFAULT_TIMEOUT: float = config.variable("BMLMPI_TIMEOUT").default
TAG_STEPS = 4096  # tag slots per call: (step·streams + stream) folded modulo this
_BYTE = MPI.BYTE
_testall = MPI.Request.Testall
#: The buffers of a run a post reads or writes, by index (:attr:`Run.bufs`): the work buffer
#: (an allreduce's result), the input, the output, the input's ranges saved before an
#: in-place run overwrites them (:meth:`Plan.saved_in_place`).
_BUFFER = {WORK: 0, INPUT: 1, OUTPUT: 2}
_SAVED = 3


def timeout_from_env(value: float | None = None, name: str = "timeout") -> float:
    """The deadline in seconds: explicit, else ``BMLMPI_TIMEOUT``, else 120 s. An explicit
    value is held to the environment parser's rule (a finite number of seconds > 0), so that
    no value that looks like a number (NaN, infinity, 0, -1) switches the deadline off."""
    if value is None:
        return config.get("BMLMPI_TIMEOUT")
    return check_seconds(value, name)


def check_seconds(value: object, name: str) -> float:
    """``value`` as seconds, refused (ValueError naming ``name``) unless finite and > 0."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}") \
            from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r} "
                         f"(no value switches the deadline off)")
    return seconds


def tag_upper_bound(comm: MPI.Comm) -> int:
    """The largest tag ``comm`` accepts (``MPI_TAG_UB``), the same on every rank.

    The standard caches ``MPI_TAG_UB`` on ``MPI_COMM_WORLD``; Open MPI gives communicators
    made by ``Split``, ``Split_type`` or ``Create`` (and duplicates of those, and
    ``MPI_COMM_SELF``) none. The bound is the library's, the same for every communicator, so
    those read ``MPI_COMM_WORLD``'s; 32767 (the least the standard allows) only where neither
    has one. Assuming 32767 where the real bound is larger leaves one tag slot per
    collective (:data:`TAG_STEPS` tags a call), and outstanding calls of one signature then
    share their tags: a receive of one can take a sibling's message."""
    for source in (comm, MPI.COMM_WORLD):
        value = source.Get_attr(MPI.TAG_UB)
        if value:
            return int(value)
    return 32767


class DeadlineExceeded(TimeoutError):
    """A wait made no progress within its deadline."""


#: Called between polls of a wait that is still waiting; may raise to end the wait (the
#: communicator's control channel reports that another rank failed the call).
Interrupt = Callable[[], None]


@dataclass(frozen=True, slots=True)
class _Post:
    comm: int        # index into the plan's communicators
    peer: int        # rank in that communicator
    world_peer: int  # rank in the allreduce communicator (for messages)
    lo: int
    hi: int
    tag: int         # offset added to the call's tag base
    scratch: int     # reduce-receive: element offset in scratch; -1 otherwise
    buffer: int = 0  # the run's buffer [lo, hi) lies in (:data:`_BUFFER`)


@dataclass(frozen=True, slots=True)
class _StepPlan:
    index: int       # the schedule step this is (part of)
    sends: tuple[_Post, ...]
    recvs: tuple[_Post, ...]
    # (lo, hi, scratch offsets) for each range that receives reductions
    reduces: tuple[tuple[int, int, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class _StepProgram:
    """One lane step as the blocking executor runs it: :class:`_StepPlan` with the copies of
    :mod:`bmlmpi.deferred` folded in and each message's ``Irecv``/``Isend`` bound to its
    communicator (built once per plan and kind of call, so a post unpacks tuples instead of
    looking up attributes)."""

    before_post: tuple[tuple[int, int], ...]
    # (comm.Irecv, peer, tag, lo, hi, scratch offset or -1 for a copy-receive into [lo, hi)
    # of the buffer of that index, :data:`_BUFFER`)
    recvs: tuple[tuple[Callable, int, int, int, int, int, int], ...]
    # (comm.Isend, peer, tag, lo, hi, the index of the buffer it reads)
    sends: tuple[tuple[Callable, int, int, int, int, int], ...]
    # (lo, hi, scratch offsets, one pass input <op> scratch, copies from the input first)
    reduces: tuple[tuple[int, int, tuple[int, ...], bool, tuple[tuple[int, int], ...]], ...]


def _placed_on_levels(sched: Schedule) -> bool:
    """Whether the schedule puts its transfers on named link levels (BML, its recovery).

    Such a schedule gives the streams of one step different levels on purpose (on BCube, k
    pipelines on k NICs); a stream that ran ahead would share a level with another and halve
    both (measured on the emulated BCube(3,2): 2.10 s per 32 MiB against 1.66 s in step), so
    its streams stay in step."""
    return any(t.level >= 0 for st in sched.steps for t in (*st.sends, *st.recvs))


def _flat_peer(level: int, peer: int) -> tuple[int, int]:
    return 0, peer


class Plan:
    """A schedule compiled for execution on given communicators.

    The steps are grouped into *lanes* that progress independently. When the schedule's
    streams touch disjoint ranges (:func:`~bmlmpi.schedules.types.streams_are_independent`:
    ring segments, the trees of a multi-tree) and are not placed on link levels, each stream
    is a lane: a ring segment is reduced and forwarded as soon as it lands, a tree goes on
    while another still waits. Otherwise the whole schedule is one lane and every step waits
    for all of its transfers (lockstep): BML keeps its pipelines in step so that each uses
    its own level's links.
    Each lane has its own scratch region, so lanes at different steps never share scratch.
    """

    def __init__(self, sched: Schedule, comms: list[MPI.Comm],
                 level_peer: Callable[[int, int], tuple[int, int]], first_step: int = 0):
        """``level_peer(level, world_peer) -> (comm index, peer rank in that comm)``;
        ``first_step``: the step of a larger schedule that ``sched``'s step 0 is (the message
        steps between shared-memory steps): the tags name that step, so they match a peer
        that runs the whole schedule as messages."""
        if sched.uses_shm:
            raise ValueError("a schedule with shared-memory steps runs on bmlmpi.shm")
        self.sched = sched
        self.comms = comms
        if (sched.streams > 1 and not _placed_on_levels(sched)
                and streams_are_independent(sched)):  # (never one that reads its input)
            keys = sorted({t.stream for st in sched.steps for t in (*st.sends, *st.recvs)})
        else:
            keys = [None]
        lanes = []
        base = 0
        for key in keys:
            steps, need = [], 0
            for i, st in enumerate(sched.steps):
                picked_sends = [t for t in st.sends if key is None or t.stream == key]
                picked_recvs = [t for t in st.recvs if key is None or t.stream == key]
                if key is not None and not picked_sends and not picked_recvs:
                    continue  # a lockstep plan keeps empty steps: step i stays step i
                sends = []
                for t in picked_sends:
                    ci, p = level_peer(t.level, t.peer)
                    sends.append(_Post(ci, p, t.peer, t.lo, t.hi,
                                       ((first_step + i) * sched.streams + t.stream)
                                       % TAG_STEPS, -1, _BUFFER[t.buffer]))
                recvs, groups, off = [], {}, base
                for t in picked_recvs:
                    ci, p = level_peer(t.level, t.peer)
                    # a receive is posted on the range it writes (a relayed block of an
                    # all-to-all lands at ``at``, not where its sender kept it); messages
                    # pair by tag and order, never by range
                    lo, hi = t.target
                    s_off = -1
                    if t.reduce:
                        s_off = off
                        off += hi - lo
                        groups.setdefault((lo, hi), []).append(s_off)
                    recvs.append(_Post(ci, p, t.peer, lo, hi,
                                       ((first_step + i) * sched.streams + t.stream)
                                       % TAG_STEPS, s_off, _BUFFER[t.into]))
                need = max(need, off - base)
                steps.append(_StepPlan(i, tuple(sends), tuple(recvs),
                                       tuple((lo, hi, tuple(o)) for (lo, hi), o in groups.items())))
            if steps:
                lanes.append(tuple(steps))
            base += need
        self.lanes: tuple[tuple[_StepPlan, ...], ...] = tuple(lanes)
        self.nsteps = len(sched.steps)
        self.scratch_elems = base
        self._pool: list[np.ndarray] = []
        self._work: list[np.ndarray] = []
        self._read_out: Ranges | None = None
        self._deferred: Deferred | None = None
        self._programs: dict[tuple[bool, bool], tuple[tuple[_StepProgram, ...], ...]] = {}
        self._saved: Ranges | None = None
        self._saved_pool: list[np.ndarray] = []

    def deferred(self) -> Deferred:
        """The input copies of a run with a separate input buffer (:mod:`bmlmpi.deferred`),
        worked out on the first such run."""
        if self._deferred is None:
            self._deferred = analyse(self.lanes, self.sched.count)
        return self._deferred

    def saved_in_place(self) -> Ranges:
        """The input ranges a run whose input is its output, element for element (an
        all-to-all with ``sendbuf`` IN_PLACE), must save before step 0: each range a step
        sends from the input that a receive of that step or an earlier one lands on in the
        output (the receive may complete first), and the source of each through copy that
        moves its block (made at the end, after the receives). The rest is sent from the
        input itself."""
        if self._saved is None:
            sched = self.sched
            landed: list[tuple[int, int]] = []
            saved = [(c.lo, c.hi) for c in sched.through if c.lo != c.at]
            for st in sched.steps:
                landed += [t.target for t in st.recvs if t.into == OUTPUT]
                saved += [(t.lo, t.hi) for t in st.sends if t.buffer == INPUT
                          and any(a < t.hi and t.lo < b for a, b in landed)]
            self._saved = tuple(merged_ranges(saved))
        return self._saved

    def take_saved(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A buffer for :meth:`saved_in_place`'s ranges of an input of ``n`` elements, kept
        between runs (as :meth:`take_work`)."""
        while self._saved_pool:
            b = self._saved_pool.pop()
            if b.dtype == dtype and b.size == n:
                return b
        return np.empty(n, dtype=dtype)

    def give_saved(self, b: np.ndarray) -> None:
        self._saved_pool.append(b)

    def program(self, separate_input: bool, in_place: bool = False
                ) -> tuple[tuple[_StepProgram, ...], ...]:
        """Per lane, its steps as :class:`_StepProgram` s, for a run whose input is in the
        result already (``separate_input`` False) or in its own buffer (the copies of
        :meth:`deferred`); ``in_place``: a relaying run whose input is its output, whose
        sends of :meth:`saved_in_place`'s ranges read the saved copy; built on first use."""
        prog = self._programs.get((separate_input, in_place))
        if prog is not None:
            return prog
        saved = self.saved_in_place() if in_place else ()

        def reads(p: _Post) -> int:
            if p.buffer == _BUFFER[INPUT] and any(a <= p.lo and p.hi <= b for a, b in saved):
                return _SAVED
            return p.buffer
        copies = self.deferred().lanes if separate_input else [None] * len(self.lanes)
        lanes = []
        for lane, lane_copies in zip(self.lanes, copies, strict=True):
            steps = []
            for k, sp in enumerate(lane):
                cp = None if lane_copies is None else lane_copies[k]
                recvs = tuple((self.comms[p.comm].Irecv, p.peer, p.tag, p.lo, p.hi, p.scratch,
                               p.buffer) for p in sp.recvs)
                sends = tuple((self.comms[p.comm].Isend, p.peer, p.tag, p.lo, p.hi,
                               _BUFFER[INPUT] if cp is not None and cp.send_from_input[j]
                               else reads(p))
                              for j, p in enumerate(sp.sends))
                reduces = tuple((lo, hi, offs, cp is not None and cp.combine[r],
                                 () if cp is None else cp.before_reduce[r])
                                for r, (lo, hi, offs) in enumerate(sp.reduces))
                steps.append(_StepProgram(() if cp is None else cp.before_post, recvs, sends,
                                          reduces))
            lanes.append(tuple(steps))
        prog = self._programs[(separate_input, in_place)] = tuple(lanes)
        return prog

    @classmethod
    def flat(cls, sched: Schedule, comm: MPI.Comm, first_step: int = 0) -> Plan:
        """``sched`` compiled to run every transfer, of any level, on ``comm`` itself
        (``first_step``: as in the constructor)."""
        return cls(sched, [comm], _flat_peer, first_step)

    def take_scratch(self, dtype: np.dtype) -> np.ndarray:
        while self._pool:
            s = self._pool.pop()
            if s.dtype == dtype:
                return s
        return np.empty(self.scratch_elems, dtype=dtype)

    def give_scratch(self, s: np.ndarray) -> None:
        self._pool.append(s)

    def take_work(self, dtype: np.dtype) -> np.ndarray:
        """A work buffer of the schedule's ``count`` elements (a collective whose result is
        not the whole buffer), kept between runs: a new one per call costs the kernel's page
        faults and zeroing of every page, more than the copies it holds."""
        while self._work:
            w = self._work.pop()
            if w.dtype == dtype:
                return w
        return np.empty(self.sched.count, dtype=dtype)

    def give_work(self, w: np.ndarray) -> None:
        self._work.append(w)

    def read_out(self) -> Ranges:
        """The input ranges a run with a separate input and a work buffer of its own must
        still copy at the end (:attr:`Deferred.final`): only those its output copies read.
        A reduce-scatter's untouched blocks are other ranks' and never leave the buffer."""
        if self._read_out is None:
            outs = [(c.lo, c.hi) for c in self.sched.output_copies()]
            self._read_out = tuple((max(a, lo), min(b, hi)) for a, b in self.deferred().final
                                   for lo, hi in outs if max(a, lo) < min(b, hi))
        return self._read_out


class RunObserver:
    """Watches the steps of every Run started while it is installed (:func:`observing`): for
    measurements and failure injection, without replacing the executor's methods. Override
    what you need; each is called with the run and the lane (``run.posting_step(lane)`` is
    the schedule step concerned)."""

    def post(self, run: Run, lane: int) -> None:
        """Before the lane's next step posts its receives and sends."""

    def posted(self, run: Run, lane: int) -> None:
        """The lane's step has posted its receives and sends (MPI's I-calls returned)."""

    def received(self, run: Run, lane: int) -> None:
        """The lane's step's receives completed (and, except on the blocking path of a
        one-lane plan, its sends); its reductions come next."""

    def complete(self, run: Run, lane: int) -> None:
        """The lane's step's reductions are applied (its sends may still be in flight on the
        blocking path of a one-lane plan, which completes them before the next post)."""

    def sent(self, run: Run, lane: int) -> None:
        """The blocking path of a one-lane plan: the step's sends, completed after its
        reductions, are done (before the next post)."""

    def finishing(self, run: Run) -> None:
        """Every lane is done; the run's last copies from the input come next."""

    def finished(self, run: Run) -> None:
        """The run is complete (its last copies made, ``finish`` called)."""


_observer: RunObserver | None = None


def install_observer(observer: RunObserver | None) -> RunObserver | None:
    """Install ``observer`` for every Run started from now on (the process's timeline,
    :mod:`bmlmpi.timeline`); returns the one it replaces."""
    global _observer
    previous, _observer = _observer, observer
    return previous


@contextmanager
def observing(observer: RunObserver) -> Iterator[RunObserver]:
    """Install ``observer`` for the Runs started inside the block. Unobserved runs pay one
    ``is None`` test per step."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield observer
    finally:
        _observer = previous


class RangeSum(Protocol):
    """An op that reduces a range's addends all at once instead of pairwise (the
    reproducible sum of the pipelined meet, :mod:`bmlmpi.call_formats`): given as a run's
    ``op``, every reduction of a step calls :meth:`sum_range`."""

    def sum_range(self, first: np.ndarray, scratch: np.ndarray, offsets: tuple[int, ...],
                  out: np.ndarray, start: int) -> None:
        """Write into ``out`` the reduction of ``first`` (this rank's values of the range,
        possibly ``out``'s memory) and ``scratch[o:o + n]`` for each of ``offsets`` (what the
        step's reduce-receives landed), ``start`` the range's first position."""


class Run:
    """One execution of a Plan on one buffer; advance with :meth:`test`, finish with :meth:`wait`.

    Every lane of the plan keeps its own position and outstanding requests. ``step`` is the
    first schedule step that some lane has not completed (what a lockstep executor would be
    in); ``progress`` counts completed lane steps and grows whenever anything completes.
    """

    __slots__ = ("plan", "buf", "src", "prog", "kop", "tag_base", "_label", "finish", "pos",
                 "lane_reqs", "progress", "done", "scratch", "observer", "stalled", "final",
                 "after", "bufs", "posted")

    def __init__(self, plan: Plan, buf: np.ndarray, op: str | RangeSum, tag_base: int,
                 label: str | Callable[[], str], finish: Callable[[], None] | None = None,
                 src: np.ndarray | None = None, final: Ranges | None = None,
                 io: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]
                 | None = None, posted: Callable[[], None] | None = None):
        """``op``: a kernel op's name, or a :class:`RangeSum`. ``src``: the input, when it
        is not already in ``buf``; the run then copies only
        what :mod:`bmlmpi.deferred` says is needed, and never writes ``src``. ``final``: the
        input ranges to copy at the end (default: every range no step touched). ``label``
        names the run in a timeout's message (a callable: built only then). ``io``: a
        relaying schedule's (input, output, saved input ranges or None) that its transfers
        read and land in directly (:attr:`~bmlmpi.schedules.types.Transfer.buffer`).
        ``posted``: called once, when the first step's transfers are in flight (local work
        that overlaps them: an all-to-all's own block)."""
        self.plan = plan
        self.buf = buf
        if src is not None and not buf.size:
            src = None
        self.src = src
        self.final = final
        if io is None:
            self.prog = plan.program(src is not None)
            self.bufs = (buf, src, None, None)
        else:
            self.prog = plan.program(False, io[2] is not None)
            self.bufs = (buf, *io)
        self.posted = posted
        self.kop = kernel_op(op) if isinstance(op, str) else op
        self.tag_base = tag_base
        self._label = label
        self.finish = finish
        nlanes = len(self.prog)
        self.pos = [0] * nlanes
        self.lane_reqs: list[list[MPI.Request] | None] = [None] * nlanes
        self.progress = 0
        self.done = False
        self.scratch = plan.take_scratch(buf.dtype) if plan.scratch_elems else None
        self.observer = _observer
        self.stalled: tuple[int, list[tuple[str, int]]] | None = None
        #: a run on the same tags that must complete before this one posts anything (the
        #: communicator sets it when a call's tag slot is still held: see api)
        self.after: Run | None = None

    @property
    def label(self) -> str:
        return self._label if isinstance(self._label, str) else self._label()

    def defer_behind(self, earlier: Iterable[object]) -> None:
        """Post nothing until the newest of ``earlier`` (runs started before this one, oldest
        first) that holds this run's tags on the same communicator completes: tag slots
        cycle, and two runs in flight on the same tags would take each other's messages."""
        for held in earlier:
            if (type(held) is Run and held.tag_base == self.tag_base and not held.done
                    and held.plan.comms[0] is self.plan.comms[0]):
                self.after = held

    @property
    def step(self) -> int:
        """The lowest schedule step not yet completed by every lane (``nsteps`` when done)."""
        return min((lane[p].index for lane, p in zip(self.plan.lanes, self.pos, strict=True)
                    if p < len(lane)), default=self.plan.nsteps)

    @property
    def reqs(self) -> list[MPI.Request]:
        """Every request this run has outstanding."""
        return [r for rs in self.lane_reqs if rs for r in rs]

    def sends_left(self) -> bool:
        """Whether this rank still has a send it has not posted."""
        for lane, p, rs in zip(self.plan.lanes, self.pos, self.lane_reqs, strict=True):
            first = p + (1 if rs is not None else 0)
            if any(sp.sends for sp in lane[first:]):
                return True
        return False

    def posting_step(self, lane: int) -> int:
        """The schedule step lane ``lane`` posts next."""
        return self.plan.lanes[lane][self.pos[lane]].index

    def _post(self, lane: int) -> list[MPI.Request]:
        observer = self.observer
        if observer is not None:
            observer.post(self, lane)
        sp = self.prog[lane][self.pos[lane]]
        buf, scratch, base, src, bufs = self.buf, self.scratch, self.tag_base, self.src, self.bufs
        for lo, hi in sp.before_post:
            np.copyto(buf[lo:hi], src[lo:hi])
        # Receives first so that eager messages land directly in place.
        reqs = [irecv([bufs[b][lo:hi] if s < 0 else scratch[s:s + hi - lo], _BYTE], peer,
                      base + tag)
                for irecv, peer, tag, lo, hi, s, b in sp.recvs]
        reqs += [isend([bufs[b][lo:hi], _BYTE], peer, base + tag)
                 for isend, peer, tag, lo, hi, b in sp.sends]
        self.lane_reqs[lane] = reqs
        if self.posted is not None:
            posted, self.posted = self.posted, None
            posted()
        if observer is not None:
            observer.posted(self, lane)
        return reqs

    def _complete_step(self, lane: int) -> None:
        self._reduce(lane)
        self.lane_reqs[lane] = None
        self.pos[lane] += 1
        self.progress += 1

    def _reduce(self, lane: int) -> None:
        """The reductions of the lane's step, once its receives have landed."""
        observer = self.observer
        if observer is not None:
            observer.received(self, lane)
        buf, scratch, kop, src = self.buf, self.scratch, self.kop, self.src
        sums = not isinstance(kop, str)
        # the kernels without the dispatcher's per-call checks: these are the run's own
        # slices (one dtype and length, contiguous, scratch apart from the result)
        for lo, hi, offs, one_pass, before in self.prog[lane][self.pos[lane]].reduces:
            n = hi - lo
            if sums:  # an op that sums the range's addends at once (RangeSum)
                if not one_pass:
                    for a, b in before:
                        np.copyto(buf[a:b], src[a:b])
                kop.sum_range(src[lo:hi] if one_pass else buf[lo:hi], scratch, offs,
                              buf[lo:hi], lo)
                continue
            if one_pass:  # the range still holds only the input: input op scratch, one pass
                o = offs[0]
                combine_trusted(buf[lo:hi], src[lo:hi], scratch[o:o + n], kop)
                continue
            for a, b in before:
                np.copyto(buf[a:b], src[a:b])
            reduce_trusted(buf[lo:hi], [scratch[o:o + n] for o in offs], kop)
        if observer is not None:
            observer.complete(self, lane)

    def test(self) -> bool:
        """Advance as far as possible without blocking; True once the allreduce is complete."""
        if self.done:
            return True
        if self.after is not None:
            if not self.after.done:
                return False
            self.after = None
        lanes = self.prog
        finished = True
        # Post every lane's next step before testing any, so all lanes' transfers are in
        # flight together; then let each lane run ahead as far as its own data allows.
        for i, lane in enumerate(lanes):
            if self.pos[i] < len(lane) and self.lane_reqs[i] is None:
                self._post(i)
        for i, lane in enumerate(lanes):
            while self.pos[i] < len(lane):
                if self.lane_reqs[i] is None:
                    self._post(i)
                if not _testall(self.lane_reqs[i]):
                    finished = False
                    break
                self._complete_step(i)
        if not finished:
            return False
        self._finalise()
        return True

    def drive(self, timeout: float, interrupt: Interrupt | None = None) -> None:
        """Run to completion in the calling thread (the blocking path of ``Allreduce``).

        :func:`wait_for`'s loop and deadline (restarting whenever a lane completes a step; a
        stuck run raises DeadlineExceeded naming its step and peers; yields the core while
        spinning, sleeps after ``BMLMPI_SPIN``), but a poll is one ``Testall`` per lane on its
        outstanding requests: :meth:`test`'s bookkeeping runs only once a lane's transfers are
        all done. A poll is MPI's only chance to progress a rendezvous (the peer's
        request-to-send is answered inside it), so a cheaper poll answers sooner. A plan of
        one lane (every lockstep schedule: ring and BML at N = 2) goes step by step without
        :meth:`test`."""
        if len(self.prog) == 1:
            self._drive_lane(timeout, interrupt)
            return
        if self.test():
            return
        lane_reqs = self.lane_reqs
        start = last = time.monotonic()
        mark = self.progress
        spin = spin_seconds()
        while True:
            for reqs in lane_reqs:
                if reqs is not None and _testall(reqs):
                    if self.test():
                        return
                    break
            now = time.monotonic()
            if self.progress != mark:
                mark, last = self.progress, now
            elif now - last > timeout:
                raise DeadlineExceeded(self.describe_timeout(timeout))
            if interrupt is not None:
                interrupt()
            back_off(now - start, spin)

    def _drive_lane(self, timeout: float, interrupt: Interrupt | None = None) -> None:
        """:meth:`drive` for a plan of one lane: post a step, poll until its receives are in,
        reduce, poll until its sends are done, next step. The reductions run while the peers
        may still be taking this rank's sends: a schedule never writes, in a step, a range
        that step sends (the verifier's hazard check), and the sends complete before the next
        step posts anything. The deadline restarts when a step's receives land and when its
        sends complete."""
        clock = [0.0, 0.0]  # when the first poll started, BMLMPI_SPIN (read then)
        lane = self.prog[0]
        for _ in range(self.pos[0], len(lane)):
            reqs = self._post(0)
            nrecv = len(lane[self.pos[0]].recvs)
            recvs, sends = reqs[:nrecv], reqs[nrecv:]
            if recvs and not _testall(recvs):
                self._poll(recvs, timeout, clock, interrupt)
            self._reduce(0)
            if sends and not _testall(sends):
                self._poll(sends, timeout, clock, interrupt)
            if self.observer is not None:
                self.observer.sent(self, 0)
            self.lane_reqs[0] = None
            self.pos[0] += 1
            self.progress += 1
        self._finalise()

    def _poll(self, reqs: list[MPI.Request], timeout: float, clock: list[float],
              interrupt: Interrupt | None = None) -> None:
        """Poll ``reqs`` until all are done: yielding the core for ``BMLMPI_SPIN`` seconds
        from the run's first poll, then sleeping; DeadlineExceeded after ``timeout`` s."""
        last = now = time.monotonic()
        if not clock[0]:
            clock[0], clock[1] = now, spin_seconds()
        start, spin = clock
        while not _testall(reqs):
            now = time.monotonic()
            if now - last > timeout:
                raise DeadlineExceeded(self.describe_timeout(timeout))
            if interrupt is not None:
                interrupt()
            back_off(now - start, spin)

    def _finalise(self) -> None:
        observer = self.observer
        if observer is not None:
            observer.finishing(self)
        if self.src is not None:
            src, buf = self.src, self.buf
            for lo, hi in self.plan.deferred().final if self.final is None else self.final:
                np.copyto(buf[lo:hi], src[lo:hi])
        if self.scratch is not None:
            self.plan.give_scratch(self.scratch)
            self.scratch = None
        if self.finish is not None:
            self.finish()
        self.done = True
        if observer is not None:
            observer.finished(self)

    def waiting(self) -> tuple[int, list[tuple[str, int]]]:
        """(the step, 1-based, of the lowest lane still waiting; [("recv"|"send", peer in the
        allreduce communicator), ...] of the transfers not yet complete), read without
        completing any request (``MPI_Request_get_status``): the flight recorder asks this of
        a run in progress, and of a stuck one before it is cancelled (:attr:`stalled`)."""
        if self.stalled is not None:
            return self.stalled
        step, peers = self.step + 1, []
        for lane, p, rs in zip(self.plan.lanes, self.pos, self.lane_reqs, strict=True):
            if rs is None:
                continue
            sp = lane[p]
            posts = [("recv", q) for q in sp.recvs] + [("send", q) for q in sp.sends]
            peers += [(kind, q.world_peer) for (kind, q), r in zip(posts, rs, strict=True)
                      if r != MPI.REQUEST_NULL and not r.Get_status()]
        return step, peers

    def pending(self) -> str:
        waiting = []
        for lane, p, rs in zip(self.plan.lanes, self.pos, self.lane_reqs, strict=True):
            if rs is None:
                continue
            sp = lane[p]
            posts = [("recv from", q) for q in sp.recvs] + [("send to", q) for q in sp.sends]
            waiting += [f"step {sp.index + 1}: {kind} rank {q.world_peer} [{q.lo}:{q.hi})"
                        for (kind, q), r in zip(posts, rs, strict=True)
                        if r != MPI.REQUEST_NULL and not r.Test()]
        if not waiting:
            # every request of the step completed between the last poll and this report
            return "no request (the step's transfers completed as the deadline passed)"
        return ", ".join(waiting[:8]) + (" ..." if len(waiting) > 8 else "")

    def cancel(self, bound: float = 1.0) -> list[MPI.Request]:
        """Cancel the run's outstanding requests and let the cancellations complete (up to
        ``bound`` s), so that no receive writes the result buffer after the run is given up;
        returns the requests still not complete (sends a late peer has not taken, receives
        MPI had matched already), which the caller keeps alive with their buffers."""
        reqs = [r for r in self.reqs if r != MPI.REQUEST_NULL]
        for r in reqs:
            try:
                r.Cancel()
            except MPI.Exception:
                pass
        left = reqs

        def settled() -> bool:
            nonlocal left
            left = [r for r in left if not request_done(r)]
            return not left
        poll_until(settled, bound)
        return left

    def describe_timeout(self, timeout: float) -> str:
        self.stalled = self.waiting()
        msg = (f"{self.label}: step {self.step + 1} of {self.plan.nsteps} made no progress "
               f"in {timeout:g} s; waiting for: {self.pending()}")
        self.cancel()
        return msg


def wait_request(req: MPI.Request, timeout: float, what: str) -> None:
    """Wait for one MPI request; after ``timeout`` s raise DeadlineExceeded saying
    "``what`` within ``timeout`` s" (``what`` names what did not happen)."""
    wait_for(req.Test, timeout, lambda t: f"{what} within {t:g} s")


def request_done(req: MPI.Request) -> bool:
    """Whether ``req`` completed (an error completes it too: nothing is left to wait for)."""
    try:
        return req.Test()
    except MPI.Exception:
        return True


_spin_cache: tuple[str | None, float] | None = None


def spin_seconds() -> float:
    """``BMLMPI_SPIN``, parsed again only when its text changed (read once per blocking call)."""
    global _spin_cache
    raw = config.text("BMLMPI_SPIN")
    cached = _spin_cache
    if cached is not None and cached[0] == raw:
        return cached[1]
    value = config.get("BMLMPI_SPIN")
    _spin_cache = (raw, value)
    return value


def back_off(elapsed: float, spin: float) -> None:
    """Between two polls of a wait that has lasted ``elapsed`` seconds: yield the core while
    ``elapsed`` < ``spin`` (``BMLMPI_SPIN``: MPI progresses only inside a poll, and an
    oversubscribed peer must get to run), then sleep up to 1 ms, longer as the wait grows,
    so long waits cost no CPU. The one back-off of every bmlmpi wait."""
    if elapsed < spin:
        os.sched_yield()
    else:
        time.sleep(min(1e-3, elapsed * 0.02))


class Pacer:
    """The back-off of a progress thread polling calls on others' behalf (the buckets'
    thread, the torch backend's driver): it never spins, since the thread it serves computes
    on the same cores. After a poll that saw progress it polls again at once (a zero sleep
    that only yields); while nothing progresses it sleeps ``first`` seconds, doubling up to
    ``cap``. :func:`back_off` is the other one: a caller waiting on its own call."""

    __slots__ = ("first", "cap", "idle")

    def __init__(self, first: float, cap: float):
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first <= cap, got {first}, {cap}")
        self.first = first
        self.cap = cap
        self.idle = 0.0

    def pause(self, progressed: bool) -> None:
        self.idle = 0.0 if progressed else min(self.cap, self.idle * 2 or self.first)
        time.sleep(self.idle)


def poll_until(test: Callable[[], bool], seconds: float, spin: float | None = None) -> bool:
    """Poll ``test`` with :func:`back_off` between polls until it is true (True) or
    ``seconds`` have passed (False): for bounded waits that end without an error. ``spin``:
    how long to yield before sleeping (default ``BMLMPI_SPIN``; 0 where a poll is costly)."""
    if test():
        return True
    start = time.monotonic()
    spin = spin_seconds() if spin is None else spin
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            return test()
        back_off(now - start, spin)
        if test():
            return True


def wait_for(test: Callable[[], bool], timeout: float, describe: Callable[[float], str],
             progress: Callable[[], object] = lambda: None,
             interrupt: Interrupt | None = None, busy: float = 0.0,
             error: Callable[[str], BaseException] = DeadlineExceeded) -> None:
    """Poll ``test`` until it is true; raise ``error(describe(timeout))`` (DeadlineExceeded)
    after ``timeout`` s in which ``progress()`` did not change.

    MPI makes progress only inside its calls (a shared-memory rendezvous copy happens in the
    receiver's Test), so the first ``BMLMPI_SPIN`` seconds (default 0.05) poll continuously,
    yielding the core between polls so an oversubscribed peer can run; after that the poll
    sleeps up to 1 ms between tests, so long waits (slow links, missing peers) cost no CPU.
    ``busy``: for this long after each progress the poll does not even yield (a shared-memory
    run whose peers have cores of their own, :data:`bmlmpi.shm.BUSY_POLL_S`).
    """
    if test():
        return
    start = last = time.monotonic()
    mark = progress()
    spin = spin_seconds()
    while not test():
        now = time.monotonic()
        cur = progress()
        if cur != mark:
            mark, last = cur, now
        elif now - last > timeout:
            raise error(describe(timeout))
        if interrupt is not None:
            interrupt()
        if now - last >= busy:
            back_off(now - start, spin)


def collective_run(plan: Plan, inp: np.ndarray | None, out: np.ndarray | None, op: str,
                   tag_base: int, label: str | Callable[[], str],
                   finish: Callable[[], None] | None = None,
                   dtype: np.dtype | None = None) -> Run:
    """A :class:`Run` of any collective's schedule, with its input and output copies
    (:meth:`~bmlmpi.schedules.types.Schedule.input_copies`, ``output_copies``).

    ``inp``: this rank's input buffer (None where it has none: a broadcast's non-roots);
    ``out``: its output buffer (None where it has none: a reduce's non-roots). The schedule
    runs on ``out`` itself when its output is the identity over a buffer of ``count`` elements
    (allreduce, allgather, broadcast), else on a new work buffer (a reduce-scatter's block is
    copied out of it after the last step, a non-root of a reduce keeps nothing). An input
    copied whole into the work buffer is left to the Run's deferred copies
    (:mod:`bmlmpi.deferred`: only the ranges the schedule needs before it writes them); other
    input copies are made before step 0 (a copy of memory onto itself is skipped: an
    in-place allgather's slot, a broadcast root's buffer). A relaying schedule that reads its
    input or lands in its output directly runs as :func:`_direct_run`."""
    sched = plan.sched
    if sched.through or sched.uses_io:
        return _direct_run(plan, inp, out, op, tag_base, label, finish, dtype)
    count = sched.count
    identity = (Copy(0, count, 0),) if count else ()
    outs = sched.output_copies()
    if out is not None and out.size == count and outs == identity:
        work, outs = out, ()
    else:
        work = plan.take_work(dtype if dtype is not None else
                              (out.dtype if out is not None else inp.dtype))
    src = None
    if inp is not None:
        ins = sched.input_copies()
        if ins == identity and inp.size == count and not np.may_share_memory(inp, work):
            src = inp
        else:
            for c in ins:
                piece, dest = inp[c.lo:c.hi], work[c.at:c.at + c.n]
                if not (piece.ctypes.data == dest.ctypes.data and piece.size == dest.size):
                    np.copyto(dest, piece)
    if work is out:
        return Run(plan, work, op, tag_base, label, finish, src=src)

    def copied_out() -> None:
        for c in outs:
            np.copyto(out[c.at:c.at + c.n], work[c.lo:c.hi])
        plan.give_work(work)
        if finish is not None:
            finish()

    return Run(plan, work, op, tag_base, label, copied_out, src=src,
               final=None if src is None else plan.read_out())


def _direct_run(plan: Plan, inp: np.ndarray, out: np.ndarray, op: str, tag_base: int,
                label: str | Callable[[], str], finish: Callable[[], None] | None,
                dtype: np.dtype | None) -> Run:
    """:func:`collective_run` of a schedule whose transfers read ``inp`` and land in ``out``
    themselves (a relaying collective's first and last hops): only the relayed pieces go
    through the work buffer (its input copies before step 0, its output copies after the
    last), and the through copies move the own block. With the input the output itself
    (``sendbuf`` IN_PLACE: the same memory, element for element), a receive could land on a
    block not yet sent: the ranges :meth:`Plan.saved_in_place` names are copied aside
    first and sent, or moved at the end, from there. Any other overlap copies the input.
    The own block (the through copies) is copied once the first step has posted."""
    sched = plan.sched
    work = plan.take_work(dtype if dtype is not None else out.dtype)
    in_place = np.may_share_memory(inp, out)
    if in_place and not (inp.ctypes.data == out.ctypes.data and inp.dtype == out.dtype
                         and inp.strides == out.strides):
        inp, in_place = inp.copy(), False
    for c in sched.input_copies():
        np.copyto(work[c.at:c.at + c.n], inp[c.lo:c.hi])
    saved = None
    def copy_own() -> None:
        for c in sched.through:
            np.copyto(out[c.at:c.at + c.n], inp[c.lo:c.hi])

    own = None
    if in_place:
        saved = plan.take_saved(inp.dtype, inp.size)
        for lo, hi in plan.saved_in_place():
            np.copyto(saved[lo:hi], inp[lo:hi])
    elif sched.through and plan.lanes:
        own = copy_own
    else:  # no step (one rank): nothing to overlap
        copy_own()

    def copied_out() -> None:
        if saved is not None:
            for c in sched.through:
                if c.lo != c.at:
                    np.copyto(out[c.at:c.at + c.n], saved[c.lo:c.hi])
            plan.give_saved(saved)
        for c in sched.output_copies():
            np.copyto(out[c.at:c.at + c.n], work[c.lo:c.hi])
        plan.give_work(work)
        if finish is not None:
            finish()

    # the own block is copied while the first step's messages are in flight: a peer takes
    # them (a shared-memory rendezvous copies in the receiver's poll) meanwhile
    return Run(plan, work, op, tag_base, label, copied_out, io=(inp, out, saved),
               posted=own)
