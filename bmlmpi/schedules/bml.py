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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..topology.bcube import BCube, Shape
from .types import Recv, Schedule, Step, Transfer, balanced_bounds, check_arguments, compact


def _piece_weights(radices: Shape, order: Sequence[int]) -> list[int]:
    """W_j: how many pieces one unit of the j-th visited digit spans."""
    return [math.prod(radices[lv] for lv in order[j + 1:]) for j in range(len(order))]


def _bound(lo: int, hi: int, parts: int, i: int) -> int:
    """``balanced_bounds(lo, hi, parts)[i]`` without building the list: a rank's schedule
    touches O(k·Σn_l) of the N piece boundaries, so memory stays proportional to its steps."""
    q, r = divmod(hi - lo, parts)
    return lo + i * q + min(i, r)


def bml_schedule(rank: int, size: int, count: int, radices: Shape,
                 pipeline: int = 1) -> Schedule:
    """The BML schedule of ``rank`` for ``count`` elements on the BCube ``radices``, each
    reduce-scatter step in ``pipeline`` successive pieces (module docstring)."""
    if pipeline < 1:
        raise ValueError(f"pipeline must be >= 1, got {pipeline}")
    cube = BCube(tuple(radices))
    if cube.size != size:
        raise ValueError(f"shape {radices} has {cube.size} servers, not {size}")
    check_arguments(rank, size, count)
    k = cube.levels
    digits = cube.digits(rank)
    slices = balanced_bounds(0, count, max(k, 1))
    sends: list[list[Transfer]] = [[] for _ in range(2 * k)]
    recvs: list[list[Recv]] = [[] for _ in range(2 * k)]
    for e in range(k):
        order = [(e + j) % k for j in range(k)]
        weights = _piece_weights(cube.radices, order)
        s_lo, s_hi = slices[e], slices[e + 1]
        base = 0
        for w, lv in enumerate(order):
            n_l, mine = cube.radices[lv], digits[lv]
            span = weights[w]

            def rng(b: int, base: int = base, span: int = span, s_lo: int = s_lo,
                    s_hi: int = s_hi) -> tuple[int, int]:
                return (_bound(s_lo, s_hi, size, base + b * span),
                        _bound(s_lo, s_hi, size, base + (b + 1) * span))

            own_lo, own_hi = rng(mine)
            ag = 2 * k - 1 - w
            for b in range(n_l):
                if b == mine:
                    continue
                peer = cube.with_digit(rank, lv, b)
                lo, hi = rng(b)
                sends[w].append(Transfer(peer, lo, hi, stream=e, level=lv))
                recvs[w].append(Recv(peer, own_lo, own_hi, stream=e, level=lv, reduce=True))
                sends[ag].append(Transfer(peer, own_lo, own_hi, stream=e, level=lv))
                recvs[ag].append(Recv(peer, lo, hi, stream=e, level=lv, reduce=False))
            base += mine * span
    steps = [Step(tuple(s), tuple(r)) for s, r in zip(sends, recvs, strict=True)]
    if pipeline > 1:
        steps = [sub for st in steps[:k] for sub in _pieces(st, pipeline)] + steps[k:]
    return Schedule("bml", rank, size, count, compact(steps), streams=max(k, 1),
                    meta={"radices": tuple(cube.radices), "pieces": k * size,
                          "pipeline": pipeline})


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
