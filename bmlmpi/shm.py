"""Runs schedules with shared-memory steps (:class:`~bmlmpi.schedules.types.ShmOp`) on the
ranks of one node. No algorithm logic: the schedule says who copies, reduces and fetches which
range, and after which step of which peer; this module only does it.

The segments. :class:`NodeSegments` is one MPI-3 shared window (``MPI.Win.Allocate_shared``)
over a node communicator (ranks of ``Split_type(COMM_TYPE_SHARED)``, or a pretended node
inside one). Every rank's part holds a progress flag (one int64 on its own cache line), a
ring of call identities (on the next cache line) and two buffer images, used by alternate
calls (the verifier's rule 10: a rank writes a buffer
again only two calls later, after every reader has left the call that read it). The window
is sized for the largest signature seen: a larger one grows it on every rank at the same
call (the plans of a signature are compiled on every rank in the same call), after each rank
has finished its own earlier shared-memory calls and all have met in a bounded barrier.

Ordering. The window is in a passive-target epoch (``Lock_all``) for its whole life. A rank
that wrote segment data calls ``Win.Sync`` (a full memory barrier in the unified memory
model, on x86-64 and AArch64 alike) before it stores its new progress in its flag; a
reader that sees a peer's flag at the value it needs calls ``Win.Sync`` before it reads that
peer's data. The flag is an aligned int64 (single-copy atomic on both architectures), only
ever increased, and compared with ``>=``, so a reader never acts on a value the writer has
not published. A flag read is only a hint until the Sync that follows it. The flag holds the
call's number on the window (every rank numbers its shared-memory calls alike) times
:data:`CALL_STRIDE` plus the steps done in it, so a value names its call whatever the
number of steps each rank's calls had.

Which call. Before its first publish of a call a rank writes the call's identity into its
ring (:data:`IDENTITY_SLOTS` slots, by call number): the call's number and its tag base, the
one that keeps its messages apart (collective, signature number, call slot). A reader acts
on a peer's flag only once that peer's identity for this call equals its own; otherwise it
keeps waiting, as a message with another tag is never received, and the call ends at its
deadline. So a rank that runs another signature than its peers (one the first-call check
does not look at again) never reads their segments, nor they its: no rank returns a result
read from another call's data.

Waiting. Every wait has the communicator's deadline (restarting whenever any peer flag
this run waits for advances): past it :class:`~bmlmpi.execute.DeadlineExceeded` names the
step, the op and the peer. A waiting rank yields the core (``sched_yield``) for
``BMLMPI_SPIN`` seconds, then sleeps, as the message executor does, so ranks that outnumber
cores still run. While it waits it also tests one receive posted to every peer on the node
communicator that no one ever sends (a failure watch: ULFM completes it with an error when
that peer dies) and, under fault tolerance, whether the communicator was revoked; either is
raised as an ``MPI.Exception``, which the fault-tolerant communicator recovers from. A dead
rank's half-written slice is never read: a reader only reads what a flag published.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .execute import (
    DeadlineExceeded,
    Interrupt,
    Plan,
    Run,
    back_off,
    spin_seconds,
    wait_for,
    wait_request,
)
from .kernels.combine import combine_trusted, reduce_trusted
from .ops import kernel_op
from .schedules.types import FETCH, PUBLISH, REDUCE, Copy, Schedule, Step

#: the flag, the identity ring and padding: the buffers start on their own cache lines
FLAG_BYTES = 128
IDENTITY_AT = 64         # byte offset of the identity ring (its own cache line)
#: Identity slots per rank, indexed by call number: a peer that could overwrite the slot of
#: a call a reader still checks would be this many calls ahead of it, which no agreed run
#: allows (every call waits on the ranks that read its segment); a slot naming another call
#: counts as a mismatch, so it can only cost a deadline, never a wrong read.
IDENTITY_SLOTS = 8
#: Flag values per call: a flag is (call number) · CALL_STRIDE + steps done; a call's last
#: value is the next one's base − 1 (a wait on a peer's step −1: it left the call before).
CALL_STRIDE = 1 << 24
TAG_BITS = 31            # a tag base fits in MPI's int tag (below 2**31)
ALIGN = 4096             # buffer capacity granularity (bytes)
WATCH_TAG = 7            # the failure watch's receives (never matched: no one sends on it)
FAILURE_CHECK_S = 0.01   # how often a waiting rank looks for a failure
#: A wait first polls the flags without yielding this long, when the node's ranks do not
#: outnumber the cores: a peer running on another core publishes within microseconds, while
#: a yield on a busy machine can give the core away for a whole time slice.
BUSY_POLL_S = 50e-6
_CORES = os.cpu_count() or 1


class ShmUnavailable(ValueError):
    """The ranks of this allreduce do not share one node's memory (``algorithm="shm"``)."""


class NodeSegments:
    """The shared window of one node communicator: flags and two buffer images per rank.

    Collective over ``comm`` (the node communicator, which it owns and frees). ``revoked``:
    a callable that is true once the allreduce communicator was revoked (fault tolerance)."""

    def __init__(self, comm: MPI.Comm, timeout: float,
                 revoked: Callable[[], bool] | None = None,
                 interrupt: Interrupt | None = None):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self.revoked = revoked
        self.capacity = 0               # bytes of one buffer image
        self.calls = 0                  # shared-memory calls started (numbers them, parity)
        self.generation = 0
        self.win: MPI.Win | None = None
        self.queue: list[ShmRun] = []   # runs started, oldest first; the head owns the window
        self.broken: str | None = None  # why the window can no longer be used
        self._views: dict[tuple, list[np.ndarray]] = {}
        self._bytes: list[np.ndarray] = []
        self._flags: list[np.ndarray] = []
        self._identities: list[np.ndarray] = []
        self.watch = [comm.Irecv([np.empty(1, np.uint8), MPI.BYTE], q, WATCH_TAG)
                      if q != self.rank else MPI.REQUEST_NULL for q in range(self.size)]
        # Allocate_shared blocks without a deadline: every rank of the node meets first
        try:
            met(comm, timeout, "bmlmpi shm: not every rank of the node came to make the "
                               "shared window", interrupt)
        except BaseException:
            self.abandon()
            comm.Free()
            raise
        self._allocate(ALIGN)

    # -- the window -----------------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # each rank's part on its own pages
        try:
            win = MPI.Win.Allocate_shared(FLAG_BYTES + 2 * capacity, 1, info, self.comm)
        finally:
            info.Free()
        win.Set_errhandler(MPI.ERRORS_RETURN)
        win.Lock_all(MPI.MODE_NOCHECK)
        parts = []
        for q in range(self.size):
            mem, _ = win.Shared_query(q)
            parts.append(np.frombuffer(mem, dtype=np.uint8, count=FLAG_BYTES + 2 * capacity))
        self.win, self.capacity, self._bytes = win, capacity, parts
        self._flags = [p[:8].view(np.int64) for p in parts]
        self._identities = [p[IDENTITY_AT:IDENTITY_AT + 8 * IDENTITY_SLOTS].view(np.int64)
                            for p in parts]
        self._views.clear()
        self.generation += 1
        # a fresh window (made or grown at the same call on every rank, after each finished
        # its earlier calls): every flag says "left call `calls`", every identity slot names
        # no call, once all have written theirs; the bounded barrier makes sure no one reads
        # a flag not yet set
        self._flags[self.rank][0] = (self.calls + 1) * CALL_STRIDE - 1
        self._identities[self.rank][:] = -1
        win.Sync()
        wait_request(self.comm.Ibarrier(), self.timeout,
                     "bmlmpi shm: not every rank of the node joined the window's set-up")
        win.Sync()

    def ensure(self, nbytes: int) -> None:
        """Make each buffer image hold ``nbytes``: collective on every rank at the same call
        (where a signature's plan is compiled). Finishes this rank's own shared-memory calls
        first, so none of them runs on a window being replaced."""
        if nbytes <= self.capacity:
            return
        while self.queue:
            self.queue[0].drive(self.timeout)
        capacity = -(-nbytes // ALIGN) * ALIGN
        wait_request(self.comm.Ibarrier(), self.timeout,
                     "bmlmpi shm: not every rank of the node joined growing the window")
        self._release_window()
        self._allocate(capacity)

    def _release_window(self) -> None:
        if self.win is not None:
            self._views.clear()
            self._bytes, self._flags, self._identities = [], [], []
            win, self.win = self.win, None
            win.Unlock_all()
            win.Free()

    def buffers(self, parity: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """Every rank's buffer image ``parity`` as ``count`` elements of ``dtype``."""
        key = (parity, dtype, count)
        views = self._views.get(key)
        if views is None:
            off = FLAG_BYTES + parity * self.capacity
            views = [p[off:off + count * dtype.itemsize].view(dtype) for p in self._bytes]
            self._views[key] = views
        return views

    # -- the flags ------------------------------------------------------------------------
    def publish(self, value: int) -> None:
        """Make this rank's segment writes visible, then raise its flag to ``value``."""
        self.win.Sync()
        self._flags[self.rank][0] = value

    def flag(self, q: int) -> int:
        return int(self._flags[q][0])

    def enter(self, call: int, identity: int) -> None:
        """Record this rank's identity for shared-memory call ``call``; visible to the others
        with the call's first :meth:`publish` (whose Sync orders it before the flag)."""
        self._identities[self.rank][call % IDENTITY_SLOTS] = identity

    def runs(self, q: int, call: int, identity: int) -> bool:
        """Whether node rank ``q`` runs call ``call`` as ``identity`` (read after the
        :meth:`acquire` that follows seeing its flag in that call or past it)."""
        return int(self._identities[q][call % IDENTITY_SLOTS]) == identity

    def identity_of(self, q: int, call: int) -> int:
        return int(self._identities[q][call % IDENTITY_SLOTS])

    def acquire(self) -> None:
        """After seeing the flags it needs: order the data reads after them."""
        self.win.Sync()

    def check_failure(self) -> None:
        """Raise ``MPI.Exception`` if a peer of the node died (its watch receive completed
        with an error) or the allreduce communicator was revoked."""
        for req in self.watch:
            if req != MPI.REQUEST_NULL:
                req.Test()  # raises MPI.Exception (ERRORS_RETURN) when the peer failed
        if self.revoked is not None and self.revoked():
            raise MPI.Exception(MPI.ERR_REVOKED if hasattr(MPI, "ERR_REVOKED")
                                else MPI.ERR_OTHER)

    def free(self) -> None:
        """Collective: free the window and the node communicator. ``Win.Free`` blocks
        without a deadline, so the node's ranks meet first in a bounded barrier; a rank that
        does not come makes the others drop the window without the collective and raise
        :class:`~bmlmpi.execute.DeadlineExceeded`."""
        if self.win is not None:
            try:
                met(self.comm, self.timeout, "bmlmpi shm: not every rank of the node came "
                                             "to free the shared window")
            except DeadlineExceeded:
                self.abandon()
                raise
        for req in self.watch:
            if req != MPI.REQUEST_NULL:
                try:
                    req.Cancel()
                    req.Wait()
                except MPI.Exception:
                    pass
        self.watch = []
        self._release_window()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()

    def abandon(self) -> None:
        """Drop the window without the collective free (a peer is dead: it cannot join).
        Open MPI removes the window's backing file once all ranks have mapped it, so
        nothing stays in /dev/shm; the mapping goes with the process."""
        self.queue.clear()
        self._views.clear()
        self._bytes, self._flags, self._identities = [], [], []
        self.win = None
        self.watch = []


@dataclass(frozen=True, slots=True)
class _Op:
    kind: str
    lo: int
    hi: int
    peers: tuple[int, ...]            # node-local ranks
    after: tuple[tuple[int, int], ...]  # (node-local rank, flag value above the run's base)
    from_result: bool
    publish: bool
    step: int                          # the schedule step (for messages)
    to_result: bool = True
    in_shift: int = 0                  # work position − input position of its input reads


class ShmPlan:
    """A schedule with shared-memory steps compiled for one node's segments: runs of
    consecutive shared-memory steps, and between them the message steps as a
    :class:`~bmlmpi.execute.Plan` on ``comm`` (the hierarchical node tier's inter-node
    allreduce)."""

    lanes: tuple = ()  # no message lanes of its own (the api's kernel warm-up looks here)

    def __init__(self, sched: Schedule, comm: MPI.Comm, node: NodeSegments | None,
                 local: dict[int, int], itemsize: int):
        self.sched = sched
        self.node = node
        self.nsteps = len(sched.steps)
        self.phases: list[tuple[str, object]] = []
        writes_segment = []
        i = 0
        steps = sched.steps
        result_span = (sched.count, 0)
        while i < len(steps):
            if steps[i].sends or steps[i].recvs:
                result_span = (0, sched.count)
                j = i
                while j < len(steps) and not steps[j].shm:
                    j += 1
                sub = Schedule(sched.algorithm, sched.rank, sched.size, sched.count,
                               tuple(Step(s.sends, s.recvs) for s in steps[i:j]),
                               streams=sched.streams)
                # tags by the schedule's own step numbers: a rank of a one-rank node may
                # run the same steps as a plain message plan
                self.phases.append(("msg", (i, j, Plan.flat(sub, comm, i))))
                i = j
                continue
            ops = []
            for o in steps[i].shm:
                reads_input = o.kind == REDUCE or (o.kind == PUBLISH and o.source == "input")
                ops.append(_Op(o.kind, o.lo, o.hi, tuple(local[p] for p in o.peers),
                               tuple((local[p], s + 1) for p, s in o.after),
                               o.source == "result", o.publish, i, o.to_result,
                               _input_shift(sched, o.lo, o.hi) if reads_input else 0))
                if o.kind == FETCH or (o.kind == REDUCE and o.to_result) or (
                        o.kind == PUBLISH and o.source == "result"):
                    result_span = (min(result_span[0], o.lo), max(result_span[1], o.hi))
            writes_segment.append(any(o.kind == PUBLISH or o.publish for o in ops))
            self.phases.append(("shm", (i, tuple(ops), writes_segment[-1])))
            i += 1
        #: the range of work positions the result is read or written at
        self.result_span = result_span
        # the same on every rank of the node, whatever its own ops (growing the window is
        # collective): a rank with nothing to publish may still fetch
        if self.nsteps >= CALL_STRIDE:
            raise ValueError(f"a shared-memory schedule of {self.nsteps} steps exceeds the "
                             f"{CALL_STRIDE} a call's flag values can count")
        self.segment_elems = sched.count if sched.size > 1 and any(st.shm for st in steps) \
            else 0
        if node is not None and self.segment_elems:
            node.ensure(self.segment_elems * itemsize)

    def start_collective(self, inp: np.ndarray | None, out: np.ndarray | None, op: str,
                         tag_base: int, label: str | Callable[[], str],
                         finish: Callable[[], None] | None = None,
                         dtype: np.dtype | None = None) -> ShmRun:
        """A run of any collective's schedule on the user's input and output buffers (as
        :func:`bmlmpi.execute.collective_run` does for messages; :mod:`bmlmpi.executors`
        picks between the two): the result is ``out``
        itself when the schedule's output is the identity over it, or ``out`` shifted when
        the schedule reads and writes the result only inside its one output copy (a
        reduce-scatter's block) and ``out`` shares no memory with ``inp``; otherwise a work
        buffer copied out at the end. The input is read through the input copies."""
        sched = self.sched
        count = sched.count
        outs = sched.output_copies()
        identity = (Copy(0, count, 0),) if count else ()
        shift, copy_out = 0, ()
        lo, hi = self.result_span
        if out is not None and out.size == count and outs == identity:
            res = out
        elif (out is not None and len(outs) == 1 and outs[0].lo <= lo and hi <= outs[0].hi
              and (inp is None or not np.may_share_memory(inp, out))):
            res, shift = out, outs[0].lo - outs[0].at
        else:
            # a result this rank never reads nor writes (a reduce's non-root) needs no
            # buffer: an empty one, instead of a new allocation of the whole count per call
            used = lo < hi or bool(outs)
            res = np.empty(count if used else 0, dtype if dtype is not None else
                           (out.dtype if out is not None else inp.dtype))
            copy_out = outs
        if not copy_out:
            run = ShmRun(self, res, op, tag_base, label, finish, inp)
        else:
            def copied_out() -> None:
                for c in copy_out:
                    np.copyto(out[c.at:c.at + c.n], res[c.lo:c.hi])
                if finish is not None:
                    finish()
            run = ShmRun(self, res, op, tag_base, label, copied_out, inp)
        run.rshift = shift
        return run


def met(comm: MPI.Comm, timeout: float, what: str, interrupt: Interrupt | None = None) -> None:
    """A barrier bounded by ``timeout`` before a blocking collective that has no deadline of
    its own (a split, a window's allocation or free): once every rank of ``comm`` passed it,
    none can be missing from that call. ``interrupt`` is polled while waiting (it raises when
    another rank refused the call)."""
    wait_for(comm.Ibarrier().Test, timeout, lambda t: f"{what} within {t:g} s",
             interrupt=interrupt)


def _input_shift(sched: Schedule, lo: int, hi: int) -> int:
    """Work position − input position for an op reading the input at ``[lo, hi)``: the
    input copy that holds the range (a schedule's ops never straddle two)."""
    for c in sched.input_copies():
        if c.at <= lo and hi <= c.at + c.n:
            return c.at - c.lo
    raise ValueError(f"shared-memory op reads input [{lo}, {hi}) outside every input copy "
                     f"of the schedule")


class ShmRun:
    """One execution of a :class:`ShmPlan`: the interface of :class:`~bmlmpi.execute.Run`
    (``test``, ``drive``, ``progress``, ``step``, ``describe_timeout``, ``cancel``)."""

    def __init__(self, plan: ShmPlan, buf: np.ndarray, op: str, tag_base: int,
                 label: str | Callable[[], str], finish: Callable[[], None] | None = None,
                 src: np.ndarray | None = None):
        self.plan = plan
        self.buf = buf
        self.src = buf if src is None else src
        self.kop = kernel_op(op)
        self.op = op
        self.tag_base = tag_base
        self._label = label
        self.finish = finish
        self.node = plan.node
        self.phase = 0       # index into plan.phases
        self.op_index = 0    # next op of the current shared-memory step
        self.sub: Run | None = None
        self.progress = 0
        self.done = False
        self.base = -1       # the flag value of this call's start, once it took the window
        self.call = 0        # this run's number among the window's shared-memory calls
        #: the call's identity on the window: its number and its tag base (module docstring)
        self.identity = -1
        self.matched: set[int] = set()  # node ranks seen to run this same call
        self.mismatch: int | None = None  # the identity a peer runs instead, while waiting
        self.segs: list[np.ndarray] | None = None
        self.waiting: tuple[int, int, int] | None = None  # (step, op, peer) while blocked
        self._last_flags: tuple[int, ...] = ()
        self.parity = 0
        self.rshift = 0      # work position − position in ``buf`` (a reduce-scatter's block)
        if self.node is not None:
            self.parity = self.node.calls % 2
            self.node.calls += 1
            self.call = self.node.calls
            self.identity = (self.call << TAG_BITS) | (tag_base & ((1 << TAG_BITS) - 1))
            self.node.queue.append(self)
        self._checked = time.monotonic()

    @property
    def label(self) -> str:
        return self._label if isinstance(self._label, str) else self._label()

    @property
    def step(self) -> int:
        if self.phase >= len(self.plan.phases):
            return self.plan.nsteps
        kind, data = self.plan.phases[self.phase]
        if kind == "shm":
            return data[0]
        return data[0] + (self.sub.step if self.sub is not None else 0)

    @property
    def reqs(self) -> list[MPI.Request]:
        return self.sub.reqs if self.sub is not None else []

    def _take_window(self) -> bool:
        node = self.node
        if node is None:
            return True
        if self.base >= 0:
            return True
        if node.broken is not None:
            raise RuntimeError(f"bmlmpi shm: this node's shared window is unusable since "
                               f"{node.broken}; build a new Communicator")
        if node.queue[0] is not self:
            return False
        self.base = self.call * CALL_STRIDE
        node.enter(self.call, self.identity)
        if self.plan.segment_elems:
            self.segs = node.buffers(self.parity, self.buf.dtype, self.plan.segment_elems)
        return True

    def _ready(self, o: _Op) -> bool:
        """Whether every peer ``o`` waits for has done its step of this same call (``s``
        above 0: its flag at the step, and its identity this call's) or has left the call
        before (``s`` 0: a wait on step −1)."""
        node = self.node
        base = self.base
        for q, s in o.after:
            if node.flag(q) < (base + s if s else base - 1):
                self.waiting = (o.step, self.op_index, q)
                return False
        if o.after:
            node.acquire()
            for q, s in o.after:
                if s and q not in self.matched:
                    if not node.runs(q, self.call, self.identity):
                        # another call's data: never read, as a message with another tag
                        # is never received; the call waits out its deadline
                        self.waiting = (o.step, self.op_index, q)
                        self.mismatch = node.identity_of(q, self.call)
                        return False
                    self.matched.add(q)
        self.waiting = None
        self.mismatch = None
        return True

    def _do(self, o: _Op) -> None:
        lo, hi = o.lo, o.hi
        buf, segs = self.buf, self.segs
        at, into = lo - self.rshift, hi - self.rshift
        if o.kind == PUBLISH:
            np.copyto(segs[self.node.rank][lo:hi],
                      buf[at:into] if o.from_result else self.src[lo - o.in_shift:hi - o.in_shift])
        elif o.kind == REDUCE:
            src = self.src[lo - o.in_shift:hi - o.in_shift]
            out = buf[at:into] if o.to_result else segs[self.node.rank][lo:hi]
            if not o.peers:
                if src.ctypes.data != out.ctypes.data:  # in place: the input is there already
                    np.copyto(out, src)
            else:
                combine_trusted(out, src, segs[o.peers[0]][lo:hi], self.kop)
                if len(o.peers) > 1:
                    reduce_trusted(out, [segs[q][lo:hi] for q in o.peers[1:]], self.kop)
                if o.publish and o.to_result:
                    np.copyto(segs[self.node.rank][lo:hi], out)
        else:
            np.copyto(buf[at:into], segs[o.peers[0]][lo:hi])

    def test(self) -> bool:
        """Advance without blocking; True once complete."""
        if self.done:
            return True
        if not self._take_window():
            return False
        phases = self.plan.phases
        node = self.node
        while self.phase < len(phases):
            kind, data = phases[self.phase]
            if kind == "shm":
                index, ops, writes = data
                while self.op_index < len(ops):
                    o = ops[self.op_index]
                    if o.after and not self._ready(o):
                        now = time.monotonic()
                        if now - self._checked > FAILURE_CHECK_S:
                            self._checked = now
                            node.check_failure()
                        return False
                    self._do(o)
                    self.op_index += 1
                if writes:
                    node.publish(self.base + index + 1)
                self.op_index = 0
            else:
                start, stop, plan = data
                if self.sub is None:
                    if node is not None:  # nobody waits on this rank during its messages
                        node.publish(self.base + start)
                    self.sub = Run(plan, self.buf, self.op, self.tag_base, self._label)
                before = self.sub.progress
                finished = self.sub.test()
                self.progress += self.sub.progress - before
                if not finished:
                    return False
                self.sub = None
            self.phase += 1
            self.progress += 1
        self._finalise()
        return True

    def _finalise(self) -> None:
        node = self.node
        if node is not None:
            node.publish(self.base + CALL_STRIDE - 1)  # left the call: the next one's base − 1
            node.queue.pop(0)
        if self.finish is not None:
            self.finish()
        self.done = True

    def drive(self, timeout: float, interrupt: Callable[[], None] | None = None) -> None:
        """Run to completion in the calling thread, with the deadline restarting whenever
        this run or a peer flag it waits for moves; polite waits (module docstring).
        ``interrupt`` is called between polls (it raises to abandon the run, as in
        :meth:`bmlmpi.execute.Run.drive`)."""
        if self.test():
            return
        start = last = time.monotonic()
        mark = (self.progress, self._flag_marks())
        spin = spin_seconds()
        busy = self.busy
        while not self.test():
            now = time.monotonic()
            cur = (self.progress, self._flag_marks())
            if cur != mark:
                mark, last = cur, now
            elif now - last > timeout:
                raise DeadlineExceeded(self.describe_timeout(timeout))
            if interrupt is not None:
                interrupt()
            if now - last >= busy:
                back_off(now - start, spin)

    @property
    def busy(self) -> float:
        """How long a wait polls without yielding (:data:`BUSY_POLL_S` where the node's
        ranks do not outnumber the cores, else 0)."""
        node = self.node
        return BUSY_POLL_S if node is not None and node.size <= _CORES else 0.0

    def _flag_marks(self) -> tuple[int, ...]:
        node = self.node
        if node is None or self.waiting is None:
            return ()
        return (node.flag(self.waiting[2]),)

    def sends_left(self) -> bool:
        """Whether this rank still has something to give the others: a segment write (a
        publish, a reduction the others fetch) or a message it has not done yet."""
        for k in range(self.phase, len(self.plan.phases)):
            kind, data = self.plan.phases[k]
            if kind == "msg":
                if k > self.phase or self.sub is None or self.sub.sends_left():
                    return True
                continue
            _, ops, _ = data
            first = self.op_index if k == self.phase else 0
            if any(o.kind == PUBLISH or o.publish for o in ops[first:]):
                return True
        return False

    def pending(self) -> str:
        if self.sub is not None:
            return self.sub.pending()
        if self.base < 0 and self.node is not None:
            return "an earlier shared-memory allreduce of this rank"
        if self.waiting is None:
            return "nothing"
        step, _, q = self.waiting
        if self.mismatch is not None:
            mask = (1 << TAG_BITS) - 1
            return (f"step {step + 1}: node rank {q} runs another call on the shared window "
                    f"(tag base {self.mismatch & mask} at call {self.mismatch >> TAG_BITS}, "
                    f"this one {self.identity & mask} at call {self.call}: another "
                    f"collective, signature or call), whose data this call never reads")
        got = self.node.flag(q) - self.base
        if got < 0:
            return (f"step {step + 1}: node rank {q} to reach this call (it has not left an "
                    f"earlier one)")
        return (f"step {step + 1}: node rank {q} to publish its step (its flag is at step "
                f"{got} of this call)")

    def cancel(self, bound: float = 1.0) -> list[MPI.Request]:
        """Give the run up: cancel its messages (:meth:`bmlmpi.execute.Run.cancel`, returning
        the requests still not complete) and release the node's window, marked broken (its
        flags no longer count steps every rank agrees on: a later shared-memory call on it
        raises instead of reading stale data)."""
        left = self.sub.cancel(bound) if self.sub is not None else []
        node = self.node
        if node is not None and not self.done and self in node.queue:
            node.queue.remove(self)
            node.broken = f"{self.label} was given up"
        return left

    def describe_timeout(self, timeout: float) -> str:
        msg = (f"{self.label}: shared-memory step {self.step + 1} of {self.plan.nsteps} made "
               f"no progress in {timeout:g} s; waiting for: {self.pending()}")
        self.cancel()
        return msg




class NodeTier:
    """This rank's node within an allreduce communicator: which ranks share its memory, and
    (made on first use) their :class:`NodeSegments`. Collective over ``comm``.

    ``nodes`` (:class:`bmlmpi.topology.nodes.Nodes`) says which ranks the library treats as
    one node (MPI placement, or ``BMLMPI_RANKS_PER_NODE``). ``fits`` is agreed by all ranks:
    every such node lies inside one ``Split_type(COMM_TYPE_SHARED)`` group, so its ranks can
    share a window. ``one_node``: the whole communicator is one node that shares memory."""

    def __init__(self, comm: MPI.Comm, nodes, timeout: float,
                 interrupt: Interrupt | None = None):
        self.comm = comm
        self.timeout = timeout
        self.interrupt = interrupt
        rank = comm.Get_rank()
        # Split_type and Split block without a deadline: a rank that is absent (it refused
        # its arguments while this one's signature was agreed) would hang them, so every
        # rank meets first in a bounded barrier that also reads the call's notices
        met(comm, timeout, "bmlmpi shm: not every rank came to find its node (its node tier)",
            interrupt)
        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        try:
            real = set(MPI.Group.Translate_ranks(shared.Get_group(),
                                                 list(range(shared.Get_size())),
                                                 comm.Get_group()))
        finally:
            shared.Free()
        g = nodes.node_of(rank)
        self.members = list(nodes.members[g])
        ok = np.array([0 if set(self.members) <= real else 1], dtype=np.int64)
        agreed = np.empty_like(ok)
        wait_request(comm.Iallreduce(ok, agreed, MPI.MAX), timeout,
                     "bmlmpi shm: not every rank joined the node check")
        self.fits = not agreed[0]
        self.one_node = nodes.count == 1 and len(real) == comm.Get_size()
        self.node_count = nodes.count
        self.segments: NodeSegments | None = None
        self._node_comm: MPI.Comm | None = None
        if self.fits:  # collective over comm: every rank splits, a rank alone included
            node_comm = comm.Split(g, rank)
            if node_comm.Get_size() > 1:
                self._node_comm = node_comm
            else:
                node_comm.Free()

    def _segments(self) -> NodeSegments | None:
        """The node's window, made on first use: collective over the node only."""
        if self.segments is None and self._node_comm is not None:
            node_comm, self._node_comm = self._node_comm, None  # the segments own it now
            self.segments = NodeSegments(node_comm, self.timeout, self._revoked,
                                         self.interrupt)
        return self.segments

    def _revoked(self) -> bool:
        try:
            return bool(self.comm.Is_revoked())
        except (AttributeError, NotImplementedError, MPI.Exception):
            return False

    def require_one_node(self) -> None:
        """Raise :class:`ShmUnavailable` (on every rank alike) unless ``one_node``."""
        if not self.one_node:
            where = (f"BMLMPI_RANKS_PER_NODE / placement make {self.node_count} nodes"
                     if self.node_count > 1 else "its ranks do not all share one node's memory")
            raise ShmUnavailable(f"algorithm 'shm' reduces within one node, but this "
                                 f"communicator spans several ({where}); use 'hierarchical' "
                                 f"(its node tier runs in shared memory) or another algorithm")

    def bind(self, sched: Schedule, itemsize: int) -> ShmPlan:
        """``sched`` (shared-memory steps on this rank's node) compiled to run here;
        collective (the first one makes the window, a larger one grows it)."""
        return ShmPlan(sched, self.comm, self._segments(),
                       {g: i for i, g in enumerate(self.members)}, itemsize)

    def free(self) -> None:
        """Collective over the node: free the window and the node communicator (a window
        whose run was given up is dropped instead: the others may never come to free it)."""
        if self.segments is not None:
            if self.segments.broken is None:
                self.segments.free()
            else:
                self.segments.abandon()
            self.segments = None
        if self._node_comm is not None:
            self._node_comm.Free()
            self._node_comm = None

    def abandon(self) -> None:
        """Forget the window without a collective (a member died)."""
        if self.segments is not None:
            self.segments.abandon()
            self.segments = None


__all__ = ["NodeSegments", "NodeTier", "ShmPlan", "ShmRun", "ShmUnavailable"]
