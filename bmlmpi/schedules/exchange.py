"""Block routes to all-to-all schedules: the layout every relaying algorithm shares. MPI-free.

An all-to-all algorithm (:mod:`.pairwise`, :mod:`.bruck`, :mod:`.bcube_exchange`) only says
where each block goes: it cuts block (s → d) of the pair matrix into pieces and gives each
piece a *route*, its hops (step, next holder, link level, stream) from s to d. This module
turns the routes of every piece into every rank's
:class:`~bmlmpi.schedules.types.Schedule`, all ranks at once:

* Rank x's work buffer holds area 0, x's own pieces (its input copies, one
  :class:`~bmlmpi.schedules.types.Copy` per run), then one area per step for the pieces x
  receives in that step. A piece stays where it landed until it leaves, and no area is
  reused, so no step writes a range that a send of the same step reads, by construction.
  The price is memory: the work buffer holds every piece that passes through the rank once
  (less what the next point sends and lands straight);
  ``count`` is the largest such total over the ranks (every rank's schedule has the same
  ``count``).
* Inside an area the pieces are ordered by piece index (a pipeline's pieces together), their
  next hop (step and peer), the rank they came from, the rest of their route, then (source,
  destination): what a later step sends to one peer lies together, a message received is
  cut only where its pieces go on to different peers, and the pieces that arrived (no hop
  left) lie in source order, so the output copies into the packed column are few. (Of the
  orders tried, this one gave the fewest transfers for Bruck and the pipelined BCube
  exchange; ``tests/unit/test_alltoall_schedules.py`` pins the counts the algorithm
  modules quote.)
* Straight from and to the user's buffers: a piece's first hop may be sent from the
  sender's input (its row, :data:`~bmlmpi.schedules.types.INPUT`) and its last hop land in
  the receiver's output (its column, :data:`~bmlmpi.schedules.types.OUTPUT`), saving the
  input copy into area 0 and the output copy out of the last area. Each message (step,
  sender, receiver) takes the most direct of the four ways (first hops from the input or
  not, last hops into the output or not) that gives it the fewest transfers; the pieces
  that then stay in no work buffer lose their places there, and the areas close up. A
  piece with no hop (a rank's own block) is a through copy, input to output. Every
  message of :mod:`.pairwise` goes straight (no work buffer at all); :mod:`.bruck` and
  :mod:`.bcube_exchange` go straight where the pieces of a message continue each other in
  the user's buffers as well as in the work buffer.
* The pieces a rank sends one peer in a step are listed in the receiver's landing order;
  consecutive pieces contiguous on both sides make one transfer. The send names the
  sender's range, the receive lands it at its own offset
  (:attr:`~bmlmpi.schedules.types.Recv.target`). Pieces that are not contiguous are several
  transfers to the same peer in the same step, posted together: one step's latency, one
  message overhead each (the cost model's ``msg_overhead``).

Empty blocks (a zero in an ``Alltoallv`` matrix) and empty pieces have no route and cost
nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .collectives import column, pair_size, row
from .types import INPUT, OUTPUT, WORK, Copy, Recv, Schedule, Step, Transfer, block_offsets


@dataclass(frozen=True, slots=True)
class Hop:
    """One hop of a piece: in ``step`` it moves from its holder to rank ``to``."""

    step: int
    to: int
    level: int = -1
    stream: int = 0


#: ``route(source, destination, piece) -> hops``, each hop from the previous holder.
Route = Callable[[int, int, int], Sequence[Hop]]


def _merged_copies(pairs: list[tuple[int, int, int]]) -> tuple[Copy, ...]:
    """(source offset, target offset, n) moves, sorted by target, joined where both sides
    continue each other."""
    out: list[list[int]] = []
    for lo, at, n in sorted(pairs, key=lambda p: p[1]):
        if out and out[-1][1] == lo and out[-1][2] + out[-1][1] - out[-1][0] == at:
            out[-1][1] += n
        else:
            out.append([lo, lo + n, at])
    return tuple(Copy(lo, hi, at) for lo, hi, at in out)


def exchange_schedules(algorithm: str, size: int, pairs: Sequence[int], pieces: int,
                       route: Route, nsteps: int, streams: int = 1) -> tuple[Schedule, ...]:
    """Every rank's all-to-all schedule for the pair matrix ``pairs`` (``size × size``,
    row-major: ``pairs[s·size + d]`` elements from s to d), each block cut into ``pieces``
    balanced pieces (larger first, empty ones dropped), piece p of block (s → d) routed by
    ``route(s, d, p)`` within ``nsteps`` steps."""
    if pair_size(pairs) != size:
        raise ValueError(f"{len(pairs)} pair counts for {size} ranks")
    if pieces < 1:
        raise ValueError(f"pieces must be >= 1, got {pieces}")
    # every piece: (source, destination, index, elements, offset in the source's row,
    # offset in the destination's column) and its holders: (rank, area) per hop
    held: dict[tuple[int, int], list] = defaultdict(list)  # (rank, area) -> [(key, piece)]
    routes = []
    into_columns = [block_offsets(column(pairs, d)) for d in range(size)]
    for s in range(size):
        sends = block_offsets(row(pairs, s))
        for d in range(size):
            n = pairs[s * size + d]
            into = into_columns[d][s]
            q, extra = divmod(n, pieces)
            start = 0
            for p in range(pieces):
                m = q + (1 if p < extra else 0)
                if not m:
                    continue
                hops = tuple(route(s, d, p))
                holder, last = s, -1
                for h in hops:
                    if h.to == holder or not 0 <= h.to < size or h.step <= last \
                            or h.step >= nsteps:
                        raise ValueError(f"{algorithm}: bad route {hops} for piece {p} of "
                                         f"block {s} -> {d}")
                    holder, last = h.to, h.step
                if holder != d:
                    raise ValueError(f"{algorithm}: piece {p} of block {s} -> {d} ends at "
                                     f"rank {holder}")
                piece = (s, d, p, m, sends[d] + start, into + start, hops)
                path = tuple((h.step, h.to) for h in hops)
                held[(s, 0)].append(((p, path[:1], -1, path[1:], s, d), len(routes), 0))
                for j, (step, x) in enumerate(path, 1):
                    key = (p, path[j:j + 1], path[j - 2][1] if j > 1 else s, path[j + 1:], s, d)
                    held[(x, step + 1)].append((key, len(routes), j))
                routes.append(piece)
                start += m
    # offsets: each rank's areas in step order, each area sorted by its key
    offset: dict[tuple[int, int], int] = {}  # (piece, holding) -> work offset
    used = [0] * size
    for x, a in sorted(held):
        for _, i, j in sorted(held[(x, a)]):
            offset[(i, j)] = used[x]
            used[x] += routes[i][3]
    # each message (step, sender, receiver) reads its first hops from the sender's input or
    # its work buffer and lands its last hops in the receiver's output or its work buffer:
    # straight from and to the user's buffers wherever that costs no more transfers
    moves: dict[tuple[int, int, int], list] = defaultdict(list)
    for i, (s, _, _, m, _, _, hops) in enumerate(routes):
        holder = s
        for j, h in enumerate(hops):
            moves[(h.step, holder, h.to)].append((i, j, m, h.level, h.stream))
            holder = h.to
    direct: dict[tuple[int, int, int], tuple[bool, bool]] = {}
    for key, parts in moves.items():
        direct[key] = min(_MODES, key=lambda mode: (
            len(_runs(_placed(parts, routes, offset, *mode))), _MODES.index(mode)))
    in_work: set[tuple[int, int]] = set()  # (piece, holding) kept in a work buffer
    for (step, a, b), parts in moves.items():
        from_input, into_output = direct[(step, a, b)]
        for i, j, *_ in parts:
            if j > 0 or not from_input:
                in_work.add((i, j))
            if j + 1 < len(routes[i][6]) or not into_output:
                in_work.add((i, j + 1))
    # offsets again, for the pieces that stay in a work buffer only
    offset = {}
    used = [0] * size
    for x, a in sorted(held):
        for _, i, j in sorted(held[(x, a)]):
            if (i, j) in in_work:
                offset[(i, j)] = used[x]
                used[x] += routes[i][3]
    count = max(used, default=0)
    inputs: dict[int, list] = defaultdict(list)
    outputs: dict[int, list] = defaultdict(list)
    through: dict[int, list] = defaultdict(list)
    for i, (s, d, _, m, from_row, into_column, hops) in enumerate(routes):
        if not hops:
            through[s].append((from_row, into_column, m))
            continue
        if (i, 0) in offset:
            inputs[s].append((from_row, offset[(i, 0)], m))
        if (i, len(hops)) in offset:
            outputs[d].append((offset[(i, len(hops))], into_column, m))
    sends: dict[tuple[int, int], list] = defaultdict(list)
    recvs: dict[tuple[int, int], list] = defaultdict(list)
    for (step, a, b), parts in sorted(moves.items()):
        placed = _placed(parts, routes, offset, *direct[(step, a, b)])
        for into, at, buffer, lo, m, level, stream in _runs(placed):
            sends[(a, step)].append(Transfer(b, lo, lo + m, stream, level, buffer))
            recvs[(b, step)].append(Recv(a, lo, lo + m, stream, level, buffer, at=at,
                                         into=into))
    out = []
    for x in range(size):
        steps = tuple(Step(tuple(sends.get((x, i), ())), tuple(recvs.get((x, i), ())))
                      for i in range(nsteps))
        out.append(Schedule(algorithm, x, size, count, steps, streams=streams,
                            collective="alltoall", counts=tuple(pairs),
                            inputs=_merged_copies(inputs[x]),
                            outputs=_merged_copies(outputs[x]),
                            through=_merged_copies(through[x])))
    return tuple(out)


#: (first hops from the input, last hops into the output), most direct first: a message
#: takes the first of the fewest transfers.
_MODES = ((True, True), (True, False), (False, True), (False, False))


def _placed(parts: list, routes: list, offset: dict, from_input: bool,
            into_output: bool) -> list[tuple]:
    """A message's pieces ``(piece, hop, n, level, stream)`` placed: (receiver's buffer,
    offset there, sender's buffer, offset there, n, level, stream), in the receiver's
    order."""
    out = []
    for i, j, m, level, stream in parts:
        _, _, _, _, from_row, into_column, hops = routes[i]
        if j == 0 and from_input:
            buffer, lo = INPUT, from_row
        else:
            buffer, lo = WORK, offset[(i, j)]
        if j + 1 == len(hops) and into_output:
            into, at = OUTPUT, into_column
        else:
            into, at = WORK, offset[(i, j + 1)]
        out.append((into, at, buffer, lo, m, level, stream))
    return sorted(out)


def _runs(placed: list[tuple]) -> list[list]:
    """The placed pieces joined into transfers where they continue each other on both
    sides, in the same buffers, level and stream."""
    runs: list[list] = []
    for into, at, buffer, lo, m, level, stream in placed:
        last = runs[-1] if runs else None
        if last and (last[0], last[2], last[5], last[6]) == (into, buffer, level, stream) \
                and last[1] + last[4] == at and last[3] + last[4] == lo:
            last[4] += m
        else:
            runs.append([into, at, buffer, lo, m, level, stream])
    return runs


__all__ = ["Hop", "Route", "exchange_schedules"]
