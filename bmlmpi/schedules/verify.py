"""Symbolic verifier: proves a set of per-rank schedules computes its collective (allreduce,
reduce-scatter, allgather, reduce, broadcast, all-to-all: :mod:`.collectives`), without MPI.

Every element of every rank's work buffer is tracked as a vector of multiplicities — entry
``j`` counts how many times rank ``j``'s input has been folded into it, one extra entry counts
garbage (what a buffer holds before anything is copied into it) — and the input position it
derives from (as an offset: work position − input position, the same for all of a segment).
Elements that no range boundary of any schedule separates behave identically, so the buffer is
compressed to the segments between consecutive boundaries; the cost is O(size · segments ·
size) integers. The inputs are copied in before step 0 and the outputs out after the last step
(:meth:`~bmlmpi.schedules.types.Schedule.input_copies`, ``output_copies``).

Checks, with a message naming the step, rank and range of the first violation:

1. structure: peers are valid ranks other than oneself, ranges lie inside ``[0, count)`` and
   are non-empty, every rank's schedule agrees on ``size`` and ``count``;
2. matching: in every step, the sends from ``a`` to ``b`` are exactly the receives ``b``
   posts from ``a``, range for range and in the same order, on the same stream and level;
3. hazards: no range a rank writes in a step (a copy-receive or a reduce target) overlaps a
   range it sends in that step; copy-receives overlap nothing else written in the step;
4. copies: inputs read inside the rank's input and write disjoint ranges of the work buffer;
   outputs write disjoint ranges of the output, only inside the collective's result regions
   (a reduce's non-root writes nothing), and cover every region;
5. result: at the end every region of every live rank's output holds, element for element,
   the input position the contract names, reduced over exactly the contract's contributors
   once each (an allreduce: each live rank's input exactly once; multiplicity vector == 1 on
   live ranks, 0 on dead ones); a reduction of two different input positions fails at once.
   Every rank holding the same result element (an allreduce's, on every rank) holds it
   computed the same way, so that its floats are bit-identical on every rank: each element
   also carries its reduction tree, in the order the executor and the kernels apply the
   operands (a reduce-receive folds into the range; the receives of one step into one range
   fold in the order :mod:`bmlmpi.execute` applies them: copy-receives first, then the
   reduce-receives grouped by range, in the order the groups first appear; a shared-memory
   reduction folds its input, then each of ``peers`` in order). Two trees are equal when
   they differ only in the order of the two operands of a node — ``a <op> b`` and
   ``b <op> a`` give the same bits for IEEE-754 sums, products, minima and maxima — but not
   when they group the operands differently: ``(x0 + x1) + x2`` and ``(x2 + x0) + x1``
   differ in their last bits. So an element reduced by one rank and copied to the others
   passes, and so does one reduced on several ranks in one identical order; the same sum
   folded from each rank's own input first fails (an allreduce in one shot, where every
   rank folds the whole buffer from its own input and every peer's segment).

Shared-memory steps (:class:`~bmlmpi.schedules.types.ShmOp`) are simulated on a second state
per rank, its segment, with these further rules:

6. a step holds messages or shared-memory operations, not both; an op's waits name live peers
   and earlier steps (or step −1: the peer has entered the call);
7. publish before read: a rank reads a range of a peer's segment only after waiting (in this
   op or an earlier one) for the peer's step that last wrote every element of it, in an
   earlier step; a range never written this call is never read;
8. no overwrite under a reader: a rank writes a range of its own segment only after waiting
   for every step in which another rank read the value there (a read in the same step is a
   race);
9. the input is read before it is overwritten: with ``sendbuf`` IN_PLACE the input is the
   result buffer, so an op that reads input elements must come before any write of the
   result there (a reduction may write the range it reads, element by element);
10. the result (the work buffer) starts undefined — a broadcast's one buffer excepted, which
   holds the root's input — : a schedule with shared-memory steps reads no element of the
   result (a send, a reduce-receive, a publish of the result) before writing it, reads its
   input only where its input copies put some (in work positions), and two writes of one
   step never overlap; at the end its output copies must meet the collective's contract
   (rule 5);
11. across calls: the segments alternate between two buffers by call parity, so a rank writes
    a buffer again two calls later; that is safe when every rank waits, in every call, on
    every peer that reads its segment (that peer has then left the previous call).

A collective that relays blocks (the all-to-all: ``counts`` is the pair matrix, rule 4's
sizes are a rank's row and column) is checked by its own rule:

12. only its copy-receives may land at another offset (:attr:`~bmlmpi.schedules.types.Recv.target`,
    inside the buffer; rule 3 holds for the landing ranges); it reduces nothing. In
    shared-memory steps (which keep every range at its position: a block lies at one work
    position in its sender's segment and its receiver's result) it is checked by rules
    10-11 as the other collectives are, each element's input position followed by its
    offset; in messages its blocks move, so no segmentation is common to all ranks: every
    element carries a label — whose input it is and its position there — from the input
    copies through every receive to the output copies, in blocks of the largest element count
    every boundary is a multiple of; every output element must hold the label the contract
    names (rank j's block for rank r, element for element), and no element outside it is
    written. Cost O(size · count / that block) integers.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from .collectives import collective as collective_record
from .types import FETCH, INPUT, OUTPUT, PUBLISH, REDUCE, WORK, Copy, Schedule


class ScheduleError(AssertionError):
    """A schedule set that does not compute a correct allreduce."""


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _check_structure(scheds: Sequence[Schedule], live: list[int]) -> tuple[int, int]:
    size = scheds[0].size
    count = scheds[0].count
    first = scheds[0]
    for s in scheds:
        if s.size != size or s.count != count:
            raise ScheduleError(f"rank {s.rank}: size/count {s.size}/{s.count} differ "
                                f"from {size}/{count}")
        if (s.collective, s.root, s.counts) != (first.collective, first.root, first.counts):
            raise ScheduleError(f"rank {s.rank}: collective {s.collective} root {s.root} "
                                f"counts {s.counts} differ from rank {first.rank}'s")
        for i, step in enumerate(s.steps):
            nsends = len(step.sends)
            for k, t in enumerate((*step.sends, *step.recvs)):
                if not (0 <= t.peer < size) or t.peer == s.rank:
                    raise ScheduleError(f"step {i} rank {s.rank}: bad peer {t.peer}")
                if t.peer not in live:
                    raise ScheduleError(f"step {i} rank {s.rank}: talks to dead rank {t.peer}")
                # [lo, hi) lies in the sender's buffer
                room = _room(s.rank if k < nsends else t.peer, t.buffer, count, s)
                if not (0 <= t.lo < t.hi <= room):
                    raise ScheduleError(f"step {i} rank {s.rank}: bad range [{t.lo},{t.hi}) "
                                        f"of the {t.buffer} buffer")
            if step.shm and (step.sends or step.recvs):
                raise ScheduleError(f"step {i} rank {s.rank}: messages and shared-memory "
                                    f"operations in one step")
            for o in step.shm:
                if o.kind not in (PUBLISH, REDUCE, FETCH):
                    raise ScheduleError(f"step {i} rank {s.rank}: unknown op {o.kind!r}")
                if not (0 <= o.lo < o.hi <= count):
                    raise ScheduleError(f"step {i} rank {s.rank}: bad range [{o.lo},{o.hi})")
                if o.kind == FETCH and len(o.peers) != 1:
                    raise ScheduleError(f"step {i} rank {s.rank}: a fetch names one owner")
                for p in (*o.peers, *(q for q, _ in o.after)):
                    if not (0 <= p < size) or p == s.rank or p not in live:
                        raise ScheduleError(f"step {i} rank {s.rank}: bad or dead peer {p}")
                for _, w in o.after:
                    if not -1 <= w < i:
                        raise ScheduleError(f"step {i} rank {s.rank}: waits on step {w}, "
                                            f"not an earlier one")
    return size, count


def _room(rank: int, buffer: str, count: int, s: Schedule) -> int:
    """Elements of ``rank``'s ``buffer`` in the call of ``s``: the work buffer's ``count``,
    the input's or output's size by the collective's contract."""
    if buffer == WORK:
        return count
    coll = collective_record(s.collective)
    size = coll.input_size if buffer == INPUT else coll.output_size
    return size(rank, count, s.root, s.counts)


def _check_matching(by_rank: dict[int, Schedule], nsteps: int) -> None:
    for i in range(nsteps):
        sent: dict[tuple[int, int], list] = defaultdict(list)
        recvd: dict[tuple[int, int], list] = defaultdict(list)
        for r, s in by_rank.items():
            if i >= len(s.steps):
                continue
            for t in s.steps[i].sends:
                sent[(r, t.peer)].append((t.lo, t.hi, t.stream, t.level, t.buffer))
            for t in s.steps[i].recvs:
                recvd[(t.peer, r)].append((t.lo, t.hi, t.stream, t.level, t.buffer))
        for key in set(sent) | set(recvd):
            if sent.get(key, []) != recvd.get(key, []):
                raise ScheduleError(
                    f"step {i}: {key[0]}->{key[1]} sends {sent.get(key, [])} "
                    f"but receives {recvd.get(key, [])}")


def _check_hazards(s: Schedule) -> None:
    """Rule 3, in each buffer (the input is never written)."""
    for into in {t.into for step in s.steps for t in step.recvs}:
        _check_hazards_in(s, into)


def _check_hazards_in(s: Schedule, into: str) -> None:
    for i, step in enumerate(s.steps):
        reads = [(t.lo, t.hi) for t in step.sends if t.buffer == into]
        copies = [t.target for t in step.recvs if not t.reduce and t.into == into]
        reduces = [t.target for t in step.recvs if t.reduce and t.into == into]
        for w in copies + reduces:
            for r in reads:
                if _overlap(w, r):
                    raise ScheduleError(f"step {i} rank {s.rank}: range {w} written while "
                                        f"{r} is being sent")
        for j, c in enumerate(copies):
            for other in copies[j + 1:] + reduces:
                if _overlap(c, other):
                    raise ScheduleError(f"step {i} rank {s.rank}: copy into {c} overlaps "
                                        f"another write {other}")


_GARBAGE = np.iinfo(np.int64).min  # the offset of an element no input reached


class _Trees:
    """The reduction trees of elements, as ids (rule 5's order): rank ``j``'s input is leaf
    ``j``, garbage leaf ``size``; a node is one ``a <op> b``, the same id for ``b <op> a``
    (the operands of one operation commute bit for bit) but another id for any other
    grouping (floating-point reductions do not associate). Ids are interned, so equal trees
    have equal ids."""

    def __init__(self, size: int):
        self.size = size
        self.ids: dict[int, int] = {}            # lo << 32 | hi  ->  node id
        self.nodes: list[tuple[int, int]] = []   # node id − size − 1  ->  (lo, hi)

    def leaves(self, rank: int, n: int) -> np.ndarray:
        return np.full(n, rank, dtype=np.int64)

    def garbage(self, n: int) -> np.ndarray:
        return np.full(n, self.size, dtype=np.int64)

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The trees ``a[k] <op> b[k]``, element for element."""
        keys = (np.minimum(a, b) << 32) | np.maximum(a, b)
        if len(keys) and (keys == keys[0]).all():  # the common case: one tree over a range
            return np.full(len(keys), self._node(int(keys[0])), dtype=np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        out = np.empty(len(uniq), dtype=np.int64)
        for k, key in enumerate(uniq.tolist()):
            out[k] = self._node(key)
        return out[inv.reshape(-1)]

    def _node(self, key: int) -> int:
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = self.size + 1 + len(self.nodes)
            self.nodes.append((key >> 32, key & 0xFFFFFFFF))
        return got

    def fold(self, parts: list[np.ndarray]) -> np.ndarray:
        """``((parts[0] <op> parts[1]) <op> parts[2]) ...``: a kernel's one pass over several
        sources (``reduce_many_into``) and a step's reduce-receives into one range."""
        acc = parts[0]
        for p in parts[1:]:
            acc = self.combine(acc, p)
        return acc

    def text(self, tree: int, room: int = 80) -> str:
        """``tree`` written out (``x3`` rank 3's input, ``+`` the op), cut short after
        about ``room`` characters."""
        if tree < self.size:
            return f"x{tree}"
        if tree == self.size:
            return "garbage"
        if room <= 0:
            return "..."
        a, b = self.nodes[tree - self.size - 1]
        if b > self.size:  # a fold reads ((x0+x1)+x2): the later-made operand first
            a, b = b, a
        left = self.text(a, room - 4)
        return f"({left}+{self.text(b, room - 4 - len(left))})"


def _executor_order(recvs) -> list:
    """A step's receives in the order the executor applies them (:mod:`bmlmpi.execute`):
    the copy-receives, then the reduce-receives grouped by range, each group folded in the
    order of its receives, the groups in the order they first appear."""
    groups: dict[tuple[int, int], list] = {}
    for t in recvs:
        if t.reduce:
            groups.setdefault((t.lo, t.hi), []).append(t)
    return [t for t in recvs if not t.reduce] + [t for g in groups.values() for t in g]


class _SameEverywhere:
    """Rule 5's last part: every rank that holds a result element (the same input position,
    reduced over the same contributors) holds the same reduction tree there."""

    def __init__(self, trees: _Trees):
        self.trees = trees
        self.pieces: dict[tuple[int, ...], list[tuple[int, int, int, int]]] = defaultdict(list)

    def add(self, who: tuple[int, ...], lo: int, hi: int, tree: int, rank: int) -> None:
        """Rank ``rank`` holds input positions ``[lo, hi)`` reduced over ``who`` as ``tree``."""
        if len(who) > 1:  # a copy of one rank's input is the same bits everywhere
            self.pieces[who].append((lo, hi, tree, rank))

    def check(self) -> None:
        for who, pieces in self.pieces.items():
            lo, hi, tree, rank = np.array(pieces, dtype=np.int64).T
            cuts = np.unique(np.concatenate([lo, hi]))
            first, last = np.searchsorted(cuts, lo), np.searchsorted(cuts, hi)
            # one row per (piece, interval between cuts it covers)
            span = last - first
            row_piece = np.repeat(np.arange(len(lo)), span)
            start = np.repeat(np.cumsum(span) - span, span)
            interval = np.repeat(first, span) + np.arange(len(row_piece)) - start
            order = np.lexsort((rank[row_piece], interval))
            interval, row_piece = interval[order], row_piece[order]
            head = np.flatnonzero(np.r_[True, interval[1:] != interval[:-1]])
            ref = np.repeat(row_piece[head], np.diff(np.r_[head, len(interval)]))
            bad = np.flatnonzero(tree[row_piece] != tree[ref])
            if len(bad):
                k, p, q = int(bad[0]), int(row_piece[bad[0]]), int(ref[bad[0]])
                r, r0 = int(rank[p]), int(rank[q])
                raise ScheduleError(
                    f"rank {r}: result elements from input position {int(cuts[interval[k]])} "
                    f"(ranks {list(who)}) are reduced in another order than rank {r0} "
                    f"reduces them, so their floats would differ in the last bits: "
                    f"{self.trees.text(int(tree[p]))} on rank {r}, "
                    f"{self.trees.text(int(tree[q]))} on rank {r0}; reduce each element on "
                    f"one rank and copy it, or in one order everywhere")


def _check_landing(s: Schedule, relays: bool) -> None:
    """Rule 12: only a relaying collective's copy-receives land elsewhere, inside the buffer;
    such a collective reduces nothing."""
    for i, step in enumerate(s.steps):
        if relays and any(o.peers and o.kind == REDUCE for o in step.shm):
            raise ScheduleError(f"step {i} rank {s.rank}: reduces from the segments of "
                                f"ranks {list(step.shm[0].peers)}, but {s.collective} "
                                f"reduces nothing")
        if not relays and (s.through or any(t.buffer != WORK for t in step.sends)
                           or any(t.into != WORK for t in step.recvs)):
            raise ScheduleError(f"step {i} rank {s.rank}: sends from its input or receives "
                                f"into its output: only a collective that relays blocks "
                                f"(all-to-all) moves data between them without its work "
                                f"buffer")
        for t in step.recvs:
            if relays and t.reduce:
                raise ScheduleError(f"step {i} rank {s.rank}: reduces [{t.lo},{t.hi}) from "
                                    f"rank {t.peer}, but {s.collective} reduces nothing")
            if t.at is None:
                continue
            if not relays and t.at != t.lo:
                raise ScheduleError(f"step {i} rank {s.rank}: receives [{t.lo},{t.hi}) from "
                                    f"rank {t.peer} at {t.at}: only a collective that relays "
                                    f"blocks (all-to-all) moves data to another offset")
            lo, hi = t.target
            room = _room(s.rank, t.into, s.count, s)
            if not (0 <= lo and hi <= room):
                raise ScheduleError(f"step {i} rank {s.rank}: receives [{t.lo},{t.hi}) at "
                                    f"[{lo},{hi}), outside [0,{room}) of its {t.into} buffer")


def _relay_unit(scheds, regions: dict[int, list]) -> int:
    """The largest element count every range, landing, copy and result region is a multiple
    of: blocks of that many elements move as one, so the simulation tracks those blocks."""
    unit = 0
    for s in scheds:
        for step in s.steps:
            for t in (*step.sends, *step.recvs):
                unit = math.gcd(unit, t.lo, t.hi)
            for t in step.recvs:
                unit = math.gcd(unit, *t.target)
        for c in (*s.input_copies(), *s.output_copies(), *s.through):
            unit = math.gcd(unit, c.lo, c.hi, c.at)
    for regs in regions.values():
        for lo, hi, _, at in regs:
            unit = math.gcd(unit, lo, hi, at)
    return unit or 1


def _simulate_relays(by_rank: dict[int, Schedule], live: list[int], count: int, nsteps: int,
                     coll) -> None:
    """Rule 12's result check: every element carries a label, (the rank whose input it is,
    its position there), from the input copies through every copy-receive to the output
    copies; each rank's output must hold, element for element, the label its contract names,
    and nothing outside the contract's regions."""
    first = by_rank[live[0]]
    regions = {r: coll.regions(r, live, count, first.root, first.counts) for r in live}
    unit = _relay_unit(by_rank.values(), regions)
    n = count // unit
    owner = {r: np.full(n, -1, dtype=np.int64) for r in live}  # -1: nothing copied in yet
    where = {r: np.full(n, -1, dtype=np.int64) for r in live}
    for r in live:
        for c in by_rank[r].input_copies():
            owner[r][c.at // unit:(c.at + c.n) // unit] = r
            where[r][c.at // unit:(c.at + c.n) // unit] = np.arange(c.lo // unit, c.hi // unit)
    got_owner, got_where = {}, {}  # each rank's output: -2 never written
    for r in live:
        size = coll.output_size(r, count, by_rank[r].root, by_rank[r].counts) // unit
        got_owner[r] = np.full(size, -2, dtype=np.int64)
        got_where[r] = np.full(size, -1, dtype=np.int64)
    for i in range(nsteps):
        # a range written in a step is sent by no one in it (rule 3), so each receive reads
        # its sender's range as the step found it, whatever the order they are applied in
        for r in live:
            s = by_rank[r]
            if i >= len(s.steps):
                continue
            for t in s.steps[i].recvs:
                lo, hi = t.target
                a, b = t.lo // unit, t.hi // unit
                if t.buffer == INPUT:  # the sender's input: its own elements, unchanged
                    them, there = np.full(b - a, t.peer, dtype=np.int64), np.arange(a, b)
                else:
                    them, there = owner[t.peer][a:b], where[t.peer][a:b]
                into_owner, into_where = ((got_owner[r], got_where[r]) if t.into == OUTPUT
                                          else (owner[r], where[r]))
                into_owner[lo // unit:hi // unit] = them
                into_where[lo // unit:hi // unit] = there
    for r in live:
        s = by_rank[r]
        for c in s.output_copies():
            got_owner[r][c.at // unit:(c.at + c.n) // unit] = owner[r][c.lo // unit:c.hi // unit]
            got_where[r][c.at // unit:(c.at + c.n) // unit] = where[r][c.lo // unit:c.hi // unit]
        for c in s.through:
            got_owner[r][c.at // unit:(c.at + c.n) // unit] = r
            got_where[r][c.at // unit:(c.at + c.n) // unit] = np.arange(c.lo // unit,
                                                                        c.hi // unit)
    for r in live:
        s = by_rank[r]
        size = coll.output_size(r, count, s.root, s.counts) // unit
        want_owner = np.full(size, -2, dtype=np.int64)
        want_where = np.full(size, -1, dtype=np.int64)
        for lo, hi, (j,), at in regions[r]:
            want_owner[lo // unit:hi // unit] = j
            want_where[lo // unit:hi // unit] = np.arange(at // unit, (at + hi - lo) // unit)
        bad = np.flatnonzero((got_owner[r] != want_owner) | (got_where[r] != want_where))
        if bad.size:
            k = int(bad[0])
            def label(o: int, w: int) -> str:
                return {-2: "nothing (never written)", -1: "garbage (never copied in)"}.get(
                    o, f"rank {o}'s input element {w * unit}")
            raise ScheduleError(
                f"rank {r}: output element {k * unit} holds "
                f"{label(int(got_owner[r][k]), int(got_where[r][k]))}, expected "
                f"{label(int(want_owner[k]), int(want_where[k]))}")


def _check_copies(s: Schedule, what: str, copies: tuple[Copy, ...], src_size: int,
                  dst_size: int) -> None:
    written: list[tuple[int, int]] = []
    for c in copies:
        if not (0 <= c.lo < c.hi <= src_size) or not (0 <= c.at and c.at + c.n <= dst_size):
            raise ScheduleError(f"rank {s.rank}: {what} copy [{c.lo},{c.hi}) -> {c.at} outside "
                                f"{src_size} -> {dst_size} elements")
        written.append((c.at, c.at + c.n))
    written.sort()
    for a, b in zip(written, written[1:], strict=False):
        if _overlap(a, b):
            raise ScheduleError(f"rank {s.rank}: {what} copies write {a} and {b} twice")


def _check_output_writes(s: Schedule) -> None:
    """Each element of the output is written once: by an output copy, a through copy or a
    receive into the output (rule 12)."""
    writes = sorted([(c.at, c.at + c.n) for c in (*s.output_copies(), *s.through)]
                    + [t.target for st in s.steps for t in st.recvs if t.into == OUTPUT])
    for a, b in zip(writes, writes[1:], strict=False):
        if _overlap(a, b):
            raise ScheduleError(f"rank {s.rank}: output elements {a} and {b} written twice")


def verify(scheds: Sequence[Schedule], live: Sequence[int] | None = None) -> None:
    """Raise :class:`ScheduleError` unless ``scheds`` (one per live rank) compute their
    collective (``Schedule.collective``; an allreduce unless it says otherwise).

    ``live`` lists the ranks that take part and contribute input; by default all ranks.
    """
    if not scheds:
        raise ScheduleError("no schedules")
    live_l = sorted(live) if live is not None else list(range(scheds[0].size))
    by_rank = {s.rank: s for s in scheds}
    if sorted(by_rank) != live_l:
        raise ScheduleError(f"schedules for ranks {sorted(by_rank)}, expected {live_l}")
    coll = collective_record(scheds[0].collective)
    root, counts = scheds[0].root, scheds[0].counts
    # the counts first: the structure check sizes the input and output by them
    problem = coll.counts_problem(scheds[0].size, scheds[0].count, counts)
    if problem:
        raise ScheduleError(problem)
    size, count = _check_structure(scheds, live_l)
    for s in scheds:
        _check_landing(s, coll.relays)
    if coll.rooted and not 0 <= root < size:
        raise ScheduleError(f"{coll.name}: root {root} outside [0, {size})")
    nsteps = max(len(s.steps) for s in scheds)
    _check_matching(by_rank, nsteps)
    for s in scheds:
        _check_hazards(s)
        _check_copies(s, "input", s.input_copies(),
                      coll.input_size(s.rank, count, root, counts), count)
        _check_copies(s, "output", s.output_copies(), count,
                      coll.output_size(s.rank, count, root, counts))
        _check_copies(s, "through", s.through, coll.input_size(s.rank, count, root, counts),
                      coll.output_size(s.rank, count, root, counts))
        _check_output_writes(s)
    if any(s.uses_shm for s in scheds):
        _ShmSimulation(by_rank, live_l, size, count, nsteps, coll).run()
        return
    if coll.relays:
        _simulate_relays(by_rank, live_l, count, nsteps, coll)
        return

    cuts = {0, count}
    for s in scheds:
        for step in s.steps:
            for t in (*step.sends, *step.recvs):
                cuts.add(t.lo)
                cuts.add(t.hi)
        for c in s.input_copies():
            cuts.update((c.at, c.at + c.n))
        for c in s.output_copies():
            cuts.update((c.lo, c.hi))
    edges = np.array(sorted(cuts))
    nseg = len(edges) - 1

    def segs(lo: int, hi: int) -> slice:
        return slice(int(np.searchsorted(edges, lo)), int(np.searchsorted(edges, hi)))

    trees = _Trees(size)
    state, shift, tree = {}, {}, {}
    for r in live_l:
        state[r] = np.zeros((nseg, size + 1), dtype=np.int64)
        state[r][:, size] = 1
        shift[r] = np.full(nseg, _GARBAGE, dtype=np.int64)
        tree[r] = trees.garbage(nseg)
        for c in by_rank[r].input_copies():
            sl = segs(c.at, c.at + c.n)
            state[r][sl] = 0
            state[r][sl, r] = 1
            shift[r][sl] = c.at - c.lo
            tree[r][sl] = r
    for i in range(nsteps):
        # A step's receives read what the senders held before it: every range received is
        # read (copied) first, then the receives are applied in the executor's order.
        arrivals = []
        for r in live_l:
            s = by_rank[r]
            if i >= len(s.steps):
                continue
            for t in _executor_order(s.steps[i].recvs):
                sl = segs(t.lo, t.hi)
                arrivals.append((r, t, sl, state[t.peer][sl].copy(), shift[t.peer][sl].copy(),
                                 tree[t.peer][sl].copy()))
        for r, t, sl, their_state, their_shift, their_tree in arrivals:
            tree[r][sl] = (trees.combine(tree[r][sl], their_tree) if t.reduce
                           else their_tree)
            if t.reduce:
                mine, theirs = shift[r][sl], their_shift
                clean = (mine != _GARBAGE) & (theirs != _GARBAGE)
                if (clean & (mine != theirs)).any():
                    raise ScheduleError(
                        f"step {i} rank {r}: reduces [{t.lo},{t.hi}) from rank {t.peer} "
                        f"into data of other input positions")
                shift[r][sl] = np.where(clean, mine, _GARBAGE)
                state[r][sl] += their_state
            else:
                state[r][sl] = their_state
                shift[r][sl] = their_shift
    same = _SameEverywhere(trees)
    for r in live_l:
        _check_result(by_rank[r], coll.regions(r, live_l, count, root, counts), state[r],
                      shift[r], edges, size, tree[r], same)
    same.check()


def _check_result(s: Schedule, regions: list, state: np.ndarray, shift: np.ndarray,
                  edges: np.ndarray, size: int, tree: np.ndarray,
                  same: _SameEverywhere) -> None:
    """The output of ``s`` (its copies out of the work buffer) against the contract; the
    reduction trees of its result elements go to ``same``."""
    starts = [reg[0] for reg in regions]
    covered = [0] * len(regions)
    for c in s.output_copies():
        first, last = int(np.searchsorted(edges, c.lo)), int(np.searchsorted(edges, c.hi))
        for seg in range(first, last):
            a, b = int(edges[seg]) - c.lo + c.at, int(edges[seg + 1]) - c.lo + c.at
            j = bisect.bisect_right(starts, a) - 1
            while a < b:
                if j < 0 or j >= len(regions) or a >= regions[j][1]:
                    raise ScheduleError(f"rank {s.rank}: writes output [{a},{b}) outside the "
                                        f"{s.collective} result")
                out_lo, out_hi, who, in_at = regions[j]
                upto = min(b, out_hi)
                want = np.zeros(size + 1, dtype=np.int64)
                want[list(who)] = 1
                if (state[seg] != want).any():
                    whom = (f"rank {who[0]}'s data" if len(who) == 1 else
                            f"each live rank exactly once (ranks {list(who)})")
                    raise ScheduleError(
                        f"rank {s.rank}: elements [{a},{upto}) of the output hold "
                        f"contributions {state[seg][:size].tolist()} (garbage "
                        f"{int(state[seg][size])}), expected {whom}")
                if c.lo - c.at - int(shift[seg]) != in_at - out_lo:
                    raise ScheduleError(
                        f"rank {s.rank}: output [{a},{upto}) holds input positions from "
                        f"{a + c.lo - c.at - int(shift[seg])}, expected from "
                        f"{in_at + a - out_lo}")
                same.add(who, in_at + a - out_lo, in_at + upto - out_lo, int(tree[seg]),
                         s.rank)
                covered[j] += upto - a
                a, j = upto, j + 1
    for (out_lo, out_hi, who, _), got in zip(regions, covered, strict=True):
        if got != out_hi - out_lo:
            raise ScheduleError(f"rank {s.rank}: output [{out_lo},{out_hi}) (ranks {list(who)}) "
                                f"written for {got} of {out_hi - out_lo} elements: expected "
                                f"each live rank exactly once everywhere")


class _ShmSimulation:
    """Rules 4-11 for schedules with shared-memory steps: every rank's result (its work
    buffer), input use and segment, step by step (module docstring). Each tracked element
    holds a multiplicity vector and the offset (work position − input position) of the input
    positions it derives from, as the message simulation does."""

    def __init__(self, by_rank: dict[int, Schedule], live: list[int], size: int, count: int,
                 nsteps: int, coll):
        self.by_rank, self.live, self.size, self.nsteps = by_rank, live, size, nsteps
        self.coll, self.count = coll, count
        cuts = {0, count}
        for s in by_rank.values():
            for step in s.steps:
                for t in (*step.sends, *step.recvs, *step.shm):
                    if t.hi > t.lo:
                        cuts.update((t.lo, t.hi))
            for c in s.input_copies():
                cuts.update((c.at, c.at + c.n))
            for c in s.output_copies():
                cuts.update((c.lo, c.hi))
        self.edges = np.array(sorted(cuts))
        nseg = len(self.edges) - 1
        self.unit = {r: np.eye(size, dtype=np.int64)[r] for r in live}
        self.out = {r: np.zeros((nseg, size), dtype=np.int64) for r in live}
        self.out_shift = {r: np.full(nseg, _GARBAGE, dtype=np.int64) for r in live}
        self.out_written = {r: np.zeros(nseg, dtype=bool) for r in live}
        self.seg = {r: np.zeros((nseg, size), dtype=np.int64) for r in live}
        self.seg_shift = {r: np.full(nseg, _GARBAGE, dtype=np.int64) for r in live}
        self.seg_step = {r: np.full(nseg, -1, dtype=np.int64) for r in live}  # last write
        # the reduction trees (rule 5) of the result and the segment
        self.trees = _Trees(size)
        self.out_tree = {r: self.trees.garbage(nseg) for r in live}
        self.seg_tree = {r: self.trees.garbage(nseg) for r in live}
        # the input in work positions: where the input copies put it, and its offset there
        self.inp_shift = {r: np.full(nseg, _GARBAGE, dtype=np.int64) for r in live}
        for r in live:
            for c in by_rank[r].input_copies():
                sl = self.segs(c.at, c.at + c.n)
                self.inp_shift[r][sl.start:sl.stop] = c.at - c.lo
            if coll.name == "bcast":  # one buffer: the root's result is its input
                have = self.inp_shift[r] != _GARBAGE
                self.out[r][have] = self.unit[r]
                self.out_shift[r][have] = self.inp_shift[r][have]
                self.out_written[r][have] = True
                self.out_tree[r][have] = r
        # per rank's segment element: the (reader, step) reads of its current value
        self.readers: dict[int, list[list[tuple[int, int]]]] = {
            r: [[] for _ in range(nseg)] for r in live}
        self.seen = {r: {} for r in live}  # r -> peer -> highest step waited for
        self.waited_on = {r: set() for r in live}
        self.read_by = {r: set() for r in live}

    def segs(self, lo: int, hi: int) -> range:
        e = self.edges
        return range(int(np.searchsorted(e, lo)), int(np.searchsorted(e, hi)))

    def where(self, i: int, r: int, lo: int, hi: int) -> str:
        return f"step {i} rank {r} [{lo},{hi})"

    def combine(self, i: int, r: int, lo: int, hi: int, parts: list) -> tuple:
        """The reduction of ``parts`` ((multiplicities, offsets, trees) of one range), folded
        in their order."""
        total = sum(p[0] for p in parts)
        shift = parts[0][1].copy()
        for _, other, _ in parts[1:]:
            if (other != shift).any():
                raise ScheduleError(f"{self.where(i, r, lo, hi)}: reduces data of other "
                                    f"input positions")
        return total, shift, self.trees.fold([p[2] for p in parts])

    def read_segment(self, i: int, r: int, p: int, lo: int, hi: int) -> tuple:
        sl = self.segs(lo, hi)
        steps = self.seg_step[p][sl.start:sl.stop]
        if (steps < 0).any():
            raise ScheduleError(f"{self.where(i, r, lo, hi)}: reads rank {p}'s segment "
                                f"where {p} never published it")
        need = int(steps.max())
        if need >= i or self.seen[r].get(p, -1) < need:
            raise ScheduleError(f"{self.where(i, r, lo, hi)}: reads rank {p}'s segment "
                                f"before its owner published it (in step {need}; waited "
                                f"for step {self.seen[r].get(p, -1)})")
        for k in sl:
            self.readers[p][k].append((r, i))
        self.read_by[p].add(r)
        return (self.seg[p][sl.start:sl.stop].copy(), self.seg_shift[p][sl.start:sl.stop].copy(),
                self.seg_tree[p][sl.start:sl.stop].copy())

    def read_input(self, i: int, r: int, lo: int, hi: int, op_pos: tuple[int, int]) -> tuple:
        sl = self.segs(lo, hi)
        shift = self.inp_shift[r][sl.start:sl.stop]
        if (shift == _GARBAGE).any():
            raise ScheduleError(f"{self.where(i, r, lo, hi)}: reads input where the rank's "
                                f"input copies put none")
        for k in sl:
            w = self.input_clobbered[r][k]
            if w is not None and w < op_pos:
                raise ScheduleError(f"{self.where(i, r, lo, hi)}: reads the input after the "
                                    f"result overwrote it (in place it is the same buffer)")
        return (np.broadcast_to(self.unit[r], (len(sl), self.size)).copy(), shift.copy(),
                self.trees.leaves(r, len(sl)))

    def write_out(self, i: int, r: int, lo: int, hi: int, value: tuple,
                  op_pos: tuple[int, int], step_writes: list) -> None:
        for a, b in step_writes:
            if a < hi and lo < b:
                raise ScheduleError(f"{self.where(i, r, lo, hi)}: two writes of the result "
                                    f"in one step overlap")
        step_writes.append((lo, hi))
        sl = self.segs(lo, hi)
        (self.out[r][sl.start:sl.stop], self.out_shift[r][sl.start:sl.stop],
         self.out_tree[r][sl.start:sl.stop]) = value
        self.out_written[r][sl.start:sl.stop] = True
        for k in sl:
            if self.input_clobbered[r][k] is None:
                self.input_clobbered[r][k] = op_pos

    def read_out(self, i: int, r: int, lo: int, hi: int, what: str) -> tuple:
        sl = self.segs(lo, hi)
        if not self.out_written[r][sl.start:sl.stop].all():
            raise ScheduleError(f"{self.where(i, r, lo, hi)}: {what} reads the result "
                                f"before anything was written there")
        return (self.out[r][sl.start:sl.stop].copy(),
                self.out_shift[r][sl.start:sl.stop].copy(),
                self.out_tree[r][sl.start:sl.stop].copy())

    def write_segment(self, i: int, r: int, lo: int, hi: int, value: tuple) -> None:
        for k in self.segs(lo, hi):
            for q, j in self.readers[r][k]:
                if j >= i or self.seen[r].get(q, -1) < j:
                    raise ScheduleError(f"{self.where(i, r, lo, hi)}: overwrites its segment "
                                        f"while rank {q} may still read it (step {j})")
            self.readers[r][k] = []
        sl = self.segs(lo, hi)
        (self.seg[r][sl.start:sl.stop], self.seg_shift[r][sl.start:sl.stop],
         self.seg_tree[r][sl.start:sl.stop]) = value
        self.seg_step[r][sl.start:sl.stop] = i

    def run(self) -> None:
        self.input_clobbered = {r: [None] * (len(self.edges) - 1) for r in self.live}
        for i in range(self.nsteps):
            pending_msgs = []
            for r in self.live:
                s = self.by_rank[r]
                if i >= len(s.steps):
                    continue
                step = s.steps[i]
                if step.shm:
                    self.shm_step(i, r, step.shm)
                elif step.sends or step.recvs:
                    for t in step.sends:
                        self.read_out(i, r, t.lo, t.hi, "a send")
                    pending_msgs.append((r, step))
            snapshot = {r: (self.out[r].copy(), self.out_shift[r].copy(),
                            self.out_tree[r].copy()) for r in self.live}
            for r, step in pending_msgs:
                writes: list = []
                for t in _executor_order(step.recvs):
                    sl = self.segs(t.lo, t.hi)
                    incoming = tuple(a[sl.start:sl.stop] for a in snapshot[t.peer])
                    if t.reduce:
                        mine = self.read_out(i, r, t.lo, t.hi, "a reduce-receive")
                        total = self.combine(i, r, t.lo, t.hi, [mine, incoming])
                        (self.out[r][sl.start:sl.stop], self.out_shift[r][sl.start:sl.stop],
                         self.out_tree[r][sl.start:sl.stop]) = total
                        for k in sl:
                            if self.input_clobbered[r][k] is None:
                                self.input_clobbered[r][k] = (i, -1)
                    else:
                        self.write_out(i, r, t.lo, t.hi, incoming, (i, -1), writes)
        for r in self.live:
            for q in self.read_by[r]:
                if q not in self.waited_on[r]:
                    raise ScheduleError(f"rank {r} never waits on rank {q}, which reads its "
                                        f"segment: the next call but one could overwrite "
                                        f"what {q} still reads")
        s0 = self.by_rank[self.live[0]]
        same = _SameEverywhere(self.trees)
        for r in self.live:
            s = self.by_rank[r]
            state = np.concatenate([self.out[r], (~self.out_written[r])[:, None]
                                    .astype(np.int64)], axis=1)
            _check_result(s, self.coll.regions(r, self.live, self.count, s0.root, s0.counts),
                          state, self.out_shift[r], self.edges, self.size, self.out_tree[r],
                          same)
        same.check()

    def shm_step(self, i: int, r: int, ops) -> None:
        writes: list = []
        for n, o in enumerate(ops):
            pos = (i, n)
            for p, w in o.after:
                self.seen[r][p] = max(self.seen[r].get(p, -1), w)
                self.waited_on[r].add(p)
            if o.kind == PUBLISH:
                if o.source == "input":
                    value = self.read_input(i, r, o.lo, o.hi, pos)
                else:
                    value = self.read_out(i, r, o.lo, o.hi, "a publish")
                self.write_segment(i, r, o.lo, o.hi, value)
            elif o.kind == REDUCE:
                parts = [self.read_input(i, r, o.lo, o.hi, pos)]
                parts += [self.read_segment(i, r, p, o.lo, o.hi) for p in o.peers]
                total = self.combine(i, r, o.lo, o.hi, parts)
                if not (o.to_result or o.publish):
                    raise ScheduleError(f"{self.where(i, r, o.lo, o.hi)}: a reduction that "
                                        f"writes neither the result nor the segment")
                if o.to_result:
                    self.write_out(i, r, o.lo, o.hi, total, pos, writes)
                if o.publish:
                    self.write_segment(i, r, o.lo, o.hi, total)
            else:
                value = self.read_segment(i, r, o.peers[0], o.lo, o.hi)
                self.write_out(i, r, o.lo, o.hi, value, pos, writes)
