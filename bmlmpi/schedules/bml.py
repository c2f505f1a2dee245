"""BML allreduce on a (mixed-radix) BCube — Wang et al., NeurIPS 2018, Algorithm 1 and Fig. 4.

Algorithm. The buffer is cut into k slices, one per pipeline (the paper's synchronisation
"threads" e = 0..k-1), and each slice into N pieces: k·N pieces in all. Pipeline e visits the
levels in the rotated order L_e = (e, e+1, …, e+k-1) mod k, so in every step the k pipelines use
k different levels (on BCube hardware: k different NICs of the server).

Pieces of pipeline e are numbered as a mixed-radix number whose most significant digit is the
digit of the first level visited, L_e[0]. Piece p is finally owned by the server whose digits
spell p. Because the visited digits are the most significant ones, the pieces a server holds
after w steps are one contiguous block, and every transfer is one contiguous element range.

* Reduce-scatter step w (level l = L_e[w]): the server holds partial sums of the block whose
  digits on L_e[0..w-1] equal its own. It cuts the block by digit l into n_l sub-blocks, sends
  sub-block b to the group member with digit b and reduce-receives its own sub-block from
  every member.
* Allgather: the same levels in reverse order, sending the server's fully reduced sub-block to
  every group member and copy-receiving theirs.

Pipelining (``pipeline = P > 1``). Each reduce-scatter step is cut into P successive steps:
sub-step j carries piece j of every transfer of the step (each range cut by
:func:`~bmlmpi.schedules.types.balanced_bounds` into P, identically on the sender, which cuts
the block it sends, and on the receiver, which cuts its own block), so the k pipelines still
share each sub-step, one level each; the allgather stays one step per level. The executor
gives every step of a lockstep plan the same scratch, so a piece is reduced while still in
the cache — what :func:`~bmlmpi.schedules.ring.ring_pipeline` buys ring at N = 2, where BML on
BCube(2) is the same exchange (the catalog pipelines both there, with ring's piece size).

Steps: 2k (k = number of levels; 0 for N = 1); with pipelining k·(P+1). Each server sends
and receives 2·(N−1)/N·count elements in all; pipeline e's step w moves
(n_l − 1)·N/(n_{L_e[0]}…n_{L_e[w]}) pieces. On BCube with one NIC per level, the k pipelines
overlap, so the gradient synchronisation time is 2(N−1)/(kN)·T_F — for BCube(3,2):
6+2+2+6 = 16·T_C = 8/9·T_F with T_C = T_F/18 (the paper's Fig. 4 walk-through), against
2(N−1)/N·T_F for PS or ring on a one-NIC Fat-Tree. Cost (α-β, one NIC per level):
2k·α + 2(N−1)/(kN)·count·β; pipelining adds k·(P−1)·α and saves memory traffic the model
does not see.

Uneven counts use balanced ranges (sizes differ by at most one element); empty ranges are
dropped, so small counts simply leave some pieces empty.

The rest of the collective family, on the same two halves:

* **Reduce-scatter** (:func:`bml_reduce_scatter_schedule`): the reduce-scatter half alone.
  MPI fixes the output layout — rank r receives block r, ``counts[r]`` elements, blocks in
  rank order — while BML's k pieces of rank r lie in k different slices, at the position its
  digits spell in each pipeline's own digit order, so no single piece order puts all of them
  on block r (only one pipeline's order can agree with the rank order). The pieces are
  therefore laid over the blocks (:func:`block_layout`): pipeline e's piece of rank j *is*
  sub-block e of block j (block j cut into k balanced sub-blocks), and the pieces of pipeline
  e are stored in BML's piece order. The input is copied into that order on the way in (a
  permuted copy: the same ``count`` elements the executor copies from the sendbuf anyway, in
  up to k·N ranges instead of one; neighbours that stay neighbours are merged, and with one
  level — a prime N — it is the plain copy) and rank r's k pieces are copied out into its
  recvbuf (``counts[r]`` elements, as any reduce-scatter does). Uneven ``counts`` and zeros
  simply make pieces uneven or empty. Steps k (k·P pipelined); each rank sends and receives
  (N−1)/N of the data in all, over k levels at once: (N−1)/(kN)·T_F on BCube.
* **Allgather** (:func:`bml_allgather_schedule`): the allgather half alone, on the same
  layout: the rank's block is copied into its k pieces, and after the k steps every piece is
  copied out to its block — one more pass over the ``count`` elements of the result than an
  algorithm working in the recvbuf itself (ring), the price of MPI's layout. Steps k.
* **Reduce** (:func:`bml_rooted_schedule`, ``"reduce"``): the reduce-scatter half, then the
  allgather's levels in reverse used one way, toward the root: at the step of level l, in
  every level-l group whose digits on the levels still to come equal the root's, the members
  send their reduced sub-block to the member whose level-l digit is the root's. Elementwise
  results need no block layout: the allreduce's balanced pieces. Steps 2k; the root receives
  (N−1)/N of the data over its k levels: 2(N−1)/(kN)·T_F in all, as the allreduce.
* **Broadcast** (``"bcast"``): the reduce-scatter's levels used one way from the root — in
  every group whose digits on this and the later levels are the root's, the member with the
  root's digit sends each other member its sub-block (copied, not reduced) — then the
  allgather half. Steps 2k, 2(N−1)/(kN)·T_F (van de Geijn's scatter-allgather on BCube).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..topology.bcube import BCube, Shape
from .collectives import collective as collective_record
from .types import (
    Copy,
    Recv,
    Schedule,
    Step,
    Transfer,
    balanced_bounds,
    block_offsets,
    check_arguments,
    compact,
)


def _piece_weights(radices: Shape, order: Sequence[int]) -> list[int]:
    """W_j: how many pieces one unit of the j-th visited digit spans."""
    return [math.prod(radices[lv] for lv in order[j + 1:]) for j in range(len(order))]


def _bound(lo: int, hi: int, parts: int, i: int) -> int:
    """``balanced_bounds(lo, hi, parts)[i]`` without building the list: a rank's schedule
    touches O(k·Σn_l) of the N piece boundaries, so memory stays proportional to its steps."""
    q, r = divmod(hi - lo, parts)
    return lo + i * q + min(i, r)


def _check(rank: int, size: int, count: int, radices: Shape, pipeline: int) -> BCube:
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    cube = BCube(tuple(radices))
    if cube.size != size:
        raise ValueError(f"shape {radices} has {cube.size} servers, not {size}")
    check_arguments(rank, size, count)
    return cube


def _orders(k: int) -> list[list[int]]:
    """Pipeline e's levels in the order it visits them: e, e+1, … (mod k)."""
    return [[(e + j) % k for j in range(k)] for e in range(k)]


Bound = Callable[[int, int], int]  # (pipeline e, piece boundary i) -> element offset


def _halves(rank: int, cube: BCube, bound: Bound, first: str | None, second: str | None,
            root: int = 0) -> tuple[list[Step], list[Step]]:
    """BML's two halves for ``rank``: ``first`` the k steps in the levels' order —
    ``"rs"`` the reduce-scatter (every member reduces its own sub-block from every other),
    ``"scatter"`` the root's data split out the same way (the holder, whose digits on this
    and the later levels are the root's, sends each member its sub-block) — and ``second``
    the k steps in reverse — ``"ag"`` the allgather, ``"gather"`` its one-way form toward
    the root (members send their sub-block to the one whose digit is the root's). None
    leaves a half out."""
    k = cube.levels
    digits, at_root = cube.digits(rank), cube.digits(root)
    f_s: list[list[Transfer]] = [[] for _ in range(k)]
    f_r: list[list[Recv]] = [[] for _ in range(k)]
    s_s: list[list[Transfer]] = [[] for _ in range(k)]
    s_r: list[list[Recv]] = [[] for _ in range(k)]
    for e, order in enumerate(_orders(k)):
        weights = _piece_weights(cube.radices, order)
        base = 0
        for w, lv in enumerate(order):
            n_l, mine = cube.radices[lv], digits[lv]
            span = weights[w]

            def rng(b: int, e: int = e, base: int = base, span: int = span) -> tuple[int, int]:
                return bound(e, base + b * span), bound(e, base + (b + 1) * span)

            own = rng(mine)
            ag = k - 1 - w
            # the rooted halves involve, at level lv, the groups whose later digits are the root's
            on_path = all(digits[x] == at_root[x] for x in order[w + 1:])
            holder = at_root[lv]
            for b in range(n_l):
                if b == mine:
                    continue
                peer = cube.with_digit(rank, lv, b)
                theirs = rng(b)
                if first == "rs":
                    f_s[w].append(Transfer(peer, *theirs, stream=e, level=lv))
                    f_r[w].append(Recv(peer, *own, stream=e, level=lv, reduce=True))
                elif first == "scatter" and on_path:
                    if mine == holder:
                        f_s[w].append(Transfer(peer, *theirs, stream=e, level=lv))
                    elif b == holder:
                        f_r[w].append(Recv(peer, *own, stream=e, level=lv))
                if second == "ag":
                    s_s[ag].append(Transfer(peer, *own, stream=e, level=lv))
                    s_r[ag].append(Recv(peer, *theirs, stream=e, level=lv))
                elif second == "gather" and on_path:
                    if mine == holder:
                        s_r[ag].append(Recv(peer, *theirs, stream=e, level=lv))
                    elif b == holder:
                        s_s[ag].append(Transfer(peer, *own, stream=e, level=lv))
            base += mine * span
    one = [Step(tuple(s), tuple(r)) for s, r in zip(f_s, f_r, strict=True)] if first else []
    two = [Step(tuple(s), tuple(r)) for s, r in zip(s_s, s_r, strict=True)] if second else []
    return one, two


def _balanced(count: int, size: int, k: int) -> Bound:
    """The allreduce's layout: k balanced slices, each cut into N balanced pieces."""
    slices = balanced_bounds(0, count, max(k, 1))
    return lambda e, i: _bound(slices[e], slices[e + 1], size, i)


def bml_schedule(rank: int, size: int, count: int, radices: Shape,
                 pipeline: int = 1) -> Schedule:
    """The BML schedule of ``rank`` for ``count`` elements on the BCube ``radices``, each
    reduce-scatter step in ``pipeline`` successive pieces (module docstring)."""
    cube = _check(rank, size, count, radices, pipeline)
    k = cube.levels
    rs, ag = _halves(rank, cube, _balanced(count, size, k), "rs", "ag")
    steps = _pipelined(rs, pipeline) + ag
    return Schedule("bml", rank, size, count, compact(steps), streams=max(k, 1),
                    meta={"radices": tuple(cube.radices), "pieces": k * size,
                          "pipeline": pipeline})


def _pipelined(steps: list[Step], pipeline: int) -> list[Step]:
    if pipeline <= 1:
        return steps
    return [sub for st in steps for sub in _pieces(st, pipeline)]


# -- MPI's block layout --------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockLayout:
    """BML's pieces laid over MPI's blocks (module docstring): pipeline e's piece owned by rank
    j is sub-block e of block j; ``bounds[e]`` are pipeline e's N+1 piece boundaries in the
    work buffer, in BML's piece order; ``piece[e][j]`` is the piece rank j owns there."""

    sub: tuple[tuple[int, ...], ...]     # sub[j]: the k+1 sub-block boundaries of block j
    bounds: tuple[tuple[int, ...], ...]  # bounds[e]: N+1 piece boundaries of pipeline e
    piece: tuple[tuple[int, ...], ...]   # piece[e][j]

    def bound(self, e: int, i: int) -> int:
        return self.bounds[e][i]

    def slot(self, e: int, j: int) -> tuple[int, int]:
        """Where rank j's pipeline-e piece lies in the work buffer."""
        p = self.piece[e][j]
        return self.bounds[e][p], self.bounds[e][p + 1]


@functools.lru_cache(maxsize=32)
def block_layout(radices: Shape, counts: tuple[int, ...]) -> BlockLayout:
    """The layout of BML's pieces over the blocks ``counts`` on the BCube ``radices``."""
    cube = BCube(tuple(radices))
    k, size = max(cube.levels, 1), cube.size
    if len(counts) != size:
        raise ValueError(f"need {size} block counts, got {len(counts)}")
    off = block_offsets(counts)
    sub = tuple(tuple(balanced_bounds(off[j], off[j + 1], k)) for j in range(size))
    bounds, piece, at = [], [], 0
    for order in (_orders(cube.levels) or [[]]):
        weights = _piece_weights(cube.radices, order)
        index = tuple(sum(cube.digit(j, lv) * wt for lv, wt in zip(order, weights, strict=True))
                      for j in range(size))
        owner = [0] * size
        for j, p in enumerate(index):
            owner[p] = j
        e = len(bounds)
        b = [at]
        for p in range(size):
            j = owner[p]
            at += sub[j][e + 1] - sub[j][e]
            b.append(at)
        bounds.append(tuple(b))
        piece.append(index)
    return BlockLayout(sub, tuple(bounds), tuple(piece))


def _merged(copies: list[Copy]) -> tuple[Copy, ...]:
    """``copies`` without empty ones, neighbours that continue each other joined."""
    out: list[Copy] = []
    for c in sorted((c for c in copies if c.hi > c.lo), key=lambda c: c.lo):
        if out and out[-1].hi == c.lo and out[-1].at + out[-1].n == c.at:
            out[-1] = Copy(out[-1].lo, c.hi, out[-1].at)
        else:
            out.append(c)
    return tuple(out)


def bml_reduce_scatter_schedule(rank: int, size: int, counts: Sequence[int], radices: Shape,
                                pipeline: int = 1) -> Schedule:
    """BML's reduce-scatter half as MPI's reduce-scatter (block r to rank r, ``counts``
    uneven or zero allowed): the input copied into BML's piece order, BML's k steps, rank r's
    k pieces copied out into its recvbuf (module docstring)."""
    counts = tuple(int(c) for c in counts)
    count = sum(counts)
    cube = _check(rank, size, count, radices, pipeline)
    lay = block_layout(tuple(cube.radices), counts)
    rs, _ = _halves(rank, cube, lay.bound, "rs", None)
    kk = len(lay.bounds)
    mine = lay.sub[rank][0]
    inputs = _merged([Copy(lay.sub[j][e], lay.sub[j][e + 1], lay.slot(e, j)[0])
                      for j in range(size) for e in range(kk)])
    outputs = _merged([Copy(*lay.slot(e, rank), lay.sub[rank][e] - mine) for e in range(kk)])
    return Schedule("bml", rank, size, count, compact(_pipelined(rs, pipeline)),
                    streams=kk, meta={"radices": tuple(cube.radices), "pipeline": pipeline},
                    collective="reduce_scatter", counts=counts, inputs=inputs,
                    outputs=outputs)


def bml_allgather_schedule(rank: int, size: int, counts: Sequence[int],
                           radices: Shape) -> Schedule:
    """BML's allgather half as MPI's allgather(v): the rank's block copied into its k pieces,
    BML's k steps in reverse, every piece copied out to its block (module docstring)."""
    counts = tuple(int(c) for c in counts)
    count = sum(counts)
    cube = _check(rank, size, count, radices, 1)
    lay = block_layout(tuple(cube.radices), counts)
    _, ag = _halves(rank, cube, lay.bound, None, "ag")
    kk = len(lay.bounds)
    mine = lay.sub[rank][0]
    inputs = _merged([Copy(lay.sub[rank][e] - mine, lay.sub[rank][e + 1] - mine,
                           lay.slot(e, rank)[0]) for e in range(kk)])
    outputs = _merged([Copy(*lay.slot(e, j), lay.sub[j][e])
                       for j in range(size) for e in range(kk)])
    return Schedule("bml", rank, size, count, compact(ag), streams=kk,
                    meta={"radices": tuple(cube.radices)}, collective="allgather",
                    counts=counts, inputs=inputs, outputs=outputs)


def bml_rooted_schedule(collective: str, rank: int, size: int, count: int, radices: Shape,
                        root: int, pipeline: int = 1) -> Schedule:
    """BML's reduce (``collective="reduce"``: the reduce-scatter, then the allgather's levels
    gathering toward ``root``) or broadcast (``"bcast"``: ``root``'s data scattered over the
    levels, then the allgather), on the allreduce's layout (module docstring)."""
    cube = _check(rank, size, count, radices, pipeline)
    if not 0 <= root < size:
        raise ValueError(f"root {root} outside [0, {size})")
    k = cube.levels
    bound = _balanced(count, size, k)
    if collective == "reduce":
        one, two = _halves(rank, cube, bound, "rs", "gather", root)
        one = _pipelined(one, pipeline)
    elif collective == "bcast":
        one, two = _halves(rank, cube, bound, "scatter", "ag", root)
    else:
        raise ValueError(f"BML's rooted schedules are reduce and bcast, not {collective!r}")
    coll = collective_record(collective)
    return Schedule("bml", rank, size, count, compact(one + two), streams=max(k, 1),
                    meta={"radices": tuple(cube.radices), "pipeline": pipeline},
                    collective=collective, root=root,
                    inputs=coll.plain_inputs(rank, count, root, None),
                    outputs=coll.plain_outputs(rank, count, root, None))


def _pieces(step: Step, parts: int) -> list[Step]:
    """``step`` as ``parts`` successive steps, the j-th moving piece j of every transfer."""
    def cut(t, j):
        b = balanced_bounds(t.lo, t.hi, parts)
        return replace(t, lo=b[j], hi=b[j + 1])
    return [Step(tuple(cut(t, j) for t in step.sends), tuple(cut(t, j) for t in step.recvs))
            for j in range(parts)]


def bml_schedules(size: int, count: int, radices: Shape, pipeline: int = 1) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model on small N)."""
    return [bml_schedule(r, size, count, radices, pipeline) for r in range(size)]
