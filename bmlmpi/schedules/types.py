"""Schedule data types: what every algorithm returns and everything else consumes.

A :class:`Schedule` is the plan of ONE rank for one collective (allreduce by default) over a
communicator of ``size`` ranks, run on a *work buffer* of ``count`` elements. It is a sequence
of :class:`Step` s; inside a step every transfer is in flight at once (non-blocking sends and
receives, waited on together), and the reductions of the step are applied when all of its
transfers have completed.

How data enters and leaves the work buffer (:class:`Copy` lists, local, no messages):
``inputs`` are copied from the rank's input buffer (``sendbuf``; for a broadcast the root's
``buf``) into the work buffer before step 0, ``outputs`` from the work buffer into the rank's
output buffer (``recvbuf``) after the last step. ``None`` (every allreduce schedule) means the
identity over ``[0, count)`` both ways: the work buffer is the recvbuf, filled from the sendbuf.
The other collectives' schedules name their copies explicitly (:mod:`.collectives` gives each
collective's plain layout): a reduce-scatter copies rank r's block out of the work buffer into
its small recvbuf, an allgather copies the rank's sendbuf into its block, and an algorithm
whose pieces do not fall on MPI's fixed block layout (BML) permutes the input on the way in or
the result on the way out.

Conventions every algorithm follows (the verifier checks them):

* ``peer`` is a rank of the communicator the allreduce runs on, never the rank itself.
* An element range ``[lo, hi)`` indexes the flat buffer of ``count`` elements; the same
  range is sent by one side and received by the other (an allreduce never moves data to
  another offset). Empty ranges are never emitted. The one exception is a collective that
  relays blocks (the all-to-all, :mod:`.collectives`): there a copy-receive names the
  sender's range ``[lo, hi)`` and lands it at ``at`` in its own buffer
  (:attr:`Recv.target`), since a block passing through a rank sits where that rank has room,
  not where its sender kept it.
* Between one sender and one receiver, the sends of a step are listed in the same order as
  the matching receives, so MPI's non-overtaking rule pairs them with a single tag per
  (call, step, stream).
* ``stream`` names the independent pipeline a transfer belongs to (BML's "thread" e,
  a ring segment, a multi-tree index); it only feeds the tag.
* ``level`` names the link level (BCube digit) the transfer uses; -1 means "no particular
  level" (the whole communicator). The executor sends level-l transfers over the level-l
  digit communicator; the cost model routes them over level-l links.
* A receive either ``reduce`` s the incoming data into its range (several receives of one
  step may reduce into the same range) or copies it there. A range written in a step (a
  receive's :attr:`~Recv.target`) is never read by a send of the same step.
* ``buffer`` names the buffer a transfer's ``[lo, hi)`` lies in on its sender, and
  :attr:`Recv.into` the one a receive lands in: the work buffer (:data:`WORK`, every
  collective's), or, for a collective that relays blocks, the sender's input
  (:data:`INPUT`: a block sent on its first hop straight from the user's ``sendbuf``) and the
  receiver's output (:data:`OUTPUT`: a block landing on its last hop straight in the user's
  ``recvbuf``). Such a schedule copies only what it relays through the work buffer;
  :attr:`Schedule.through` copies a rank's own block from its input to its output. The
  input is never written; with ``sendbuf`` IN_PLACE it is the output, and the executor
  saves the input ranges a receive would overwrite before their send
  (:func:`bmlmpi.execute.saved_in_place`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: The buffers a transfer's range lies in (module docstring): the work buffer, the sender's
#: input, the receiver's output.
WORK, INPUT, OUTPUT = "work", "input", "output"


@dataclass(frozen=True, slots=True)
class Transfer:
    """One message: ``[lo, hi)`` of the flat buffer, to or from ``peer``."""

    peer: int
    lo: int
    hi: int
    stream: int = 0
    level: int = -1
    buffer: str = WORK  # where [lo, hi) lies on the sender: WORK or (relaying) INPUT

    @property
    def n(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class Recv(Transfer):
    """A receive; ``reduce`` adds the data into the range, otherwise it overwrites it.

    ``[lo, hi)`` is the range the sender sends (what matches the two sides); ``at`` is where
    a copy-receive of a relaying collective lands it in this rank's buffer (None: at ``lo``,
    the same offset, as every other collective does); ``into``: the buffer it lands in, the
    work buffer or (a relaying collective's last hop) the output."""

    reduce: bool = False
    at: int | None = None
    into: str = WORK

    @property
    def target(self) -> tuple[int, int]:
        """The range of this rank's buffer the receive writes."""
        if self.at is None:
            return self.lo, self.hi
        return self.at, self.at + self.hi - self.lo


#: The kinds of :class:`ShmOp`.
PUBLISH, REDUCE, FETCH = "publish", "reduce", "fetch"


@dataclass(frozen=True, slots=True)
class ShmOp:
    """One operation on the shared-memory segments of the ranks of one node.

    Every rank owns a segment that holds an image of the flat buffer (element ``i`` of the
    buffer at element ``i`` of the segment); the others read it, only its owner writes it.

    * ``publish``: copy ``[lo, hi)`` of this rank's input (``source="input"``) or of its
      result (``source="result"``) into its own segment;
    * ``reduce``: result ``[lo, hi)`` = this rank's input ``<op>`` every ``peers``' segment
      ``[lo, hi)``, in one pass; with ``publish`` the result is written into the own segment
      too, for the peers to fetch; with ``to_result`` False (and ``publish``) it goes into the
      own segment only (a reduce's non-root keeps no result); without ``peers`` it is a copy
      of the input into the result;
    * ``fetch``: copy ``[lo, hi)`` of ``peers[0]``'s segment into this rank's result.

    ``after`` lists ``(peer, step)``: before the op, wait until ``peer`` has completed its
    step ``step`` (an earlier step), or with ``step`` −1 until ``peer`` has entered this call
    (left the previous one: what a rank that reads nothing of a peer waits for before it
    writes its segment again). The verifier proves these waits order every read after the
    write it needs and every overwrite after the reads of the old value.

    Ranges are work-buffer positions; the input is read through the schedule's input copies
    (an allgather's contribution sits at its block), the result is the work buffer.
    """

    kind: str
    lo: int
    hi: int
    peers: tuple[int, ...] = ()
    after: tuple[tuple[int, int], ...] = ()
    source: str = "input"
    publish: bool = False
    to_result: bool = True

    @property
    def n(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class Copy:
    """A local copy of ``[lo, hi)`` of one buffer to ``[at, at + hi - lo)`` of another."""

    lo: int
    hi: int
    at: int

    @property
    def n(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class Step:
    """Messages (``sends``/``recvs``) or shared-memory operations (``shm``, run in order)."""

    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Recv, ...] = ()
    shm: tuple[ShmOp, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.sends and not self.recvs and not self.shm


@dataclass(frozen=True, slots=True)
class Schedule:
    """The plan of ``rank`` for a ``collective`` on a work buffer of ``count`` elements over
    ``size`` ranks.

    ``participants`` lists the ranks that contribute input (all ranks when ``None``); a
    recovery schedule after failures names only the survivors. ``root``: the root of a reduce
    or broadcast. ``counts``: the block of each rank of a reduce-scatter or allgather (rank j's
    block is ``[sum(counts[:j]), sum(counts[:j+1]))`` of the work buffer, MPI's layout), the
    ``size × size`` pair matrix of an all-to-all (:mod:`.collectives`), ``None`` for the
    other collectives. ``inputs``/``outputs``: the module docstring. ``through``: copies from
    the input straight into the output (``[lo, hi)`` of the input to ``at`` in the output),
    made outside the steps: a relaying collective's own block.
    """

    algorithm: str
    rank: int
    size: int
    count: int
    steps: tuple[Step, ...]
    streams: int = 1
    participants: tuple[int, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    collective: str = "allreduce"
    root: int = 0
    counts: tuple[int, ...] | None = None
    inputs: tuple[Copy, ...] | None = None
    outputs: tuple[Copy, ...] | None = None
    through: tuple[Copy, ...] = ()

    def input_copies(self) -> tuple[Copy, ...]:
        """The copies into the work buffer before step 0 (``inputs``, identity when None)."""
        if self.inputs is not None:
            return self.inputs
        return (Copy(0, self.count, 0),) if self.count else ()

    def output_copies(self) -> tuple[Copy, ...]:
        """The copies out of the work buffer after the last step (identity when None)."""
        if self.outputs is not None:
            return self.outputs
        return (Copy(0, self.count, 0),) if self.count else ()

    @property
    def nsteps(self) -> int:
        return len(self.steps)

    def sent_elements(self) -> int:
        return sum(t.n for s in self.steps for t in s.sends)

    def received_elements(self) -> int:
        return sum(t.n for s in self.steps for t in s.recvs)

    @property
    def uses_shm(self) -> bool:
        """Whether any step works on shared-memory segments (:class:`ShmOp`)."""
        return any(s.shm for s in self.steps)

    @property
    def uses_io(self) -> bool:
        """Whether a transfer reads the input or lands in the output directly (a relaying
        collective's first or last hop), not through the work buffer."""
        return any(t.buffer != WORK for s in self.steps for t in s.sends) or any(
            t.into != WORK for s in self.steps for t in s.recvs)


def streams_are_independent(sched: Schedule) -> bool:
    """True when the element ranges each stream of ``sched`` touches on this rank (sent,
    received or reduced into, over all steps) are disjoint from every other stream's.

    Then a stream's transfers read and write only that stream's data, so an executor may run
    each stream through its own steps at its own pace (one stream's step s+1 while another is
    still in step s) and every message still carries the value the lockstep order gives it:
    matching is by (step, stream) tag, and no other stream can change the data in between.
    """
    if sched.streams <= 1:
        return True
    if sched.uses_io:
        return False  # ranges of different buffers: not comparable as one space
    spans: dict[int, list[tuple[int, int]]] = {}
    for st in sched.steps:
        for t in st.sends:
            spans.setdefault(t.stream, []).append((t.lo, t.hi))
        for t in st.recvs:
            spans.setdefault(t.stream, []).append(t.target)
    merged = []
    for stream, ranges in spans.items():
        ranges.sort()
        lo, hi = ranges[0]
        for a, b in ranges[1:]:
            if a > hi:
                merged.append((lo, hi, stream))
                lo, hi = a, b
            else:
                hi = max(hi, b)
        merged.append((lo, hi, stream))
    merged.sort()
    return all(merged[i][1] <= merged[i + 1][0] for i in range(len(merged) - 1))


def check_arguments(rank: int, size: int, count: int, segments: int = 1) -> None:
    """The checks every schedule function makes of its arguments, with the same messages."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    if count < 0:
        raise ValueError(f"negative count {count}")
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")


def merged_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges sorted, with ranges that touch joined into one."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def balanced_bounds(lo: int, hi: int, parts: int) -> list[int]:
    """Cut ``[lo, hi)`` into ``parts`` contiguous ranges whose sizes differ by at most one.

    Returns the ``parts + 1`` boundaries. The larger ranges come first, so a count smaller
    than ``parts`` leaves the trailing ranges empty.
    """
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    n = hi - lo
    q, r = divmod(n, parts)
    bounds = [lo]
    for i in range(parts):
        bounds.append(bounds[-1] + q + (1 if i < r else 0))
    return bounds


def block_offsets(counts: Sequence[int]) -> list[int]:
    """The ``len(counts) + 1`` boundaries of blocks of ``counts`` elements laid end to end."""
    out = [0]
    for c in counts:
        if c < 0:
            raise ValueError(f"negative block count {c} in {tuple(counts)}")
        out.append(out[-1] + c)
    return out


def compact(steps: list[Step]) -> tuple[Step, ...]:
    """Drop empty transfers and, when a rank has nothing to do in a step, keep the step anyway.

    Steps stay aligned across ranks (step i of every rank is the same logical step), which
    the tags and the verifier rely on; only zero-length transfers are removed.
    """
    out = []
    for s in steps:
        out.append(Step(tuple(t for t in s.sends if t.hi > t.lo),
                        tuple(t for t in s.recvs if t.hi > t.lo),
                        tuple(o for o in s.shm if o.hi > o.lo)))
    return tuple(out)
