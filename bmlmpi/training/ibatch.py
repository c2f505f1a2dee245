"""iBatch: batch communication and computation so that one hides the other. MPI-free.

Source: Wang, Pi, Zhou, "Scalable Distributed DL Training: Batching Communication and
Computation" (iBatch).

The paper (a parameter server). A worker pulls the parameters of layers 1..L from the servers
and computes the forward pass layer by layer. Each communication costs a startup time T_s plus
a transfer time T_t^i per layer; the forward computation of layer i takes C^i. The layers are cut
into batches [l_{k-1}+1, l_k]; the pull of batch k+1 runs while batch k computes. When

    (5)  T_s + sum(T_t over batch k+1) >= sum(C over batch k)      for 0 < k < N

holds, the computation always waits for the communication, and the time is

    (4)  EXE = N·T_s + sum(T_t over all layers) + sum(C over the last batch).

Two greedy algorithms pick the cuts — Algorithm 1 front to back, Algorithm 2 back to front —
and the better of the two is kept: :func:`greedy_front`, :func:`greedy_back`,
:func:`paper_time`, :func:`exhaustive_paper` (all 2^(L-1) batchings, for the tests).
Each greedy step is O(L) (O(L²) for the first), so a plan costs O(L²).

From pull to allreduce. Data-parallel training with an allreduce has no pull: a layer's
gradient is ready during the *backward* pass (layer L first), and the next iteration's forward
pass needs layer 1's reduced gradient first. Both of the paper's overlaps exist:

* **Backward overlap** (the layers [m, L) at the back of the model, the order DDP and Horovod
  bucket in): a bucket's allreduce starts once its lowest layer's gradient is ready and runs
  while the backward pass computes the layers in front of it. In backward order each batch
  computes first and communicates after — the pull pipeline run backwards in time. Reversing
  time turns it into the paper's problem on the same layers in forward order, with C = the
  *backward* times: under (5) (the allreduce of a batch covers the backward computation of the
  batch in front of it) the phase takes sum(C of the last batch) + N·T_s + sum(T_t), Eq. 4.
* **Forward overlap** (the layers [0, m) at the front): their buckets are held until the whole
  backward pass is done and then started front first; the next forward pass computes batch k
  while batch k+1 is reduced — the paper's problem as written, with C = the *forward* times.
  It needs the caller to ``wait(i)`` for layer i just before using it in the forward pass.

Starting a front bucket during the backward pass buys nothing: layer 0's gradient is the last
one ready and with one communication channel any bucket queued before it delays the forward
pass. :func:`ibatch_plan` tries every split m, runs both greedy algorithms on each phase (four
candidates per split) and keeps the batching whose simulated iteration
(:func:`iteration_time`: backward, bucket allreduces one after another in start order, next
forward) is shortest; :func:`exhaustive_plan` searches every batching and split, for the tests.
The simulation assumes one communication channel (bmlmpi's communicator progresses the
allreduces in flight oldest first; their concurrency is not modelled).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

Ends = tuple[int, ...]   # the last layer of each batch, 1-based (the paper's l_1 .. l_N = L)


@dataclass(frozen=True)
class Profile:
    """Per-layer costs in seconds, layers in forward order: ``forward``/``backward`` compute
    times, ``nbytes`` of each layer's gradient, and the communication's ``startup`` (T_s) and
    ``per_byte`` times (T_t^i = nbytes[i]·per_byte)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    nbytes: tuple[int, ...]
    startup: float
    per_byte: float

    def __post_init__(self) -> None:
        n = len(self.nbytes)
        if len(self.forward) != n or len(self.backward) != n:
            raise ValueError(f"profile lengths differ: forward {len(self.forward)}, backward "
                             f"{len(self.backward)}, nbytes {n}")
        values = [*self.forward, *self.backward, self.startup, self.per_byte]
        if any(not (v >= 0) for v in values) or any(b < 0 for b in self.nbytes):
            raise ValueError("profile times and sizes must be >= 0")

    @property
    def transfer(self) -> tuple[float, ...]:
        return tuple(b * self.per_byte for b in self.nbytes)


# -- the paper's problem (one phase) ---------------------------------------------------------------

def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def paper_time(ends: Ends, compute: Sequence[float], transfer: Sequence[float],
               startup: float) -> float:
    """Eq. 4: N·T_s + all transfer + the last batch's computation."""
    last_start = ends[-2] if len(ends) > 1 else 0
    return len(ends) * startup + sum(transfer) + sum(compute[last_start:])


def feasible(ends: Ends, compute: Sequence[float], transfer: Sequence[float],
             startup: float) -> bool:
    """Constraint (5): each batch's communication covers the previous batch's computation."""
    starts = (0, *ends[:-1])
    return all(startup + sum(transfer[starts[k + 1]:ends[k + 1]])
               >= sum(compute[starts[k]:ends[k]]) for k in range(len(ends) - 1))


def pipeline_time(ends: Ends, compute: Sequence[float], transfer: Sequence[float],
                  startup: float) -> float:
    """The pull pipeline simulated: communications back to back, batch k computes once its
    communication and batch k-1's computation are done. Equals Eq. 4 when (5) holds."""
    comm_end = compute_end = 0.0
    start = 0
    for end in ends:
        comm_end += startup + sum(transfer[start:end])
        compute_end = max(compute_end, comm_end) + sum(compute[start:end])
        start = end
    return compute_end


def _check(compute: Sequence[float], transfer: Sequence[float]) -> int:
    if len(compute) != len(transfer):
        raise ValueError(f"{len(compute)} compute times but {len(transfer)} transfer times")
    return len(compute)


def greedy_front(compute: Sequence[float], transfer: Sequence[float], startup: float) -> Ends:
    """Algorithm 1: l_1 and l_2 first (the largest first batch whose computation the second
    batch's communication covers, ties to the cheaper first communication), then each next
    cut where the communication exceeds the previous batch's computation by the least."""
    n = _check(compute, transfer)
    if n <= 1:
        return (n,) if n else ()
    C, T = _prefix(compute), _prefix(transfer)
    pairs = [(l1, l2) for l1 in range(1, n) for l2 in range(l1 + 1, n + 1)
             if startup + T[l2] - T[l1] >= C[l1]]
    if not pairs:
        return (n,)
    # line 4: most computation in batch 1; line 5: least communication in batch 1; then the
    # second cut as the later steps choose it (least slack)
    l1, l2 = min(pairs, key=lambda p: (-C[p[0]], startup + T[p[0]],
                                       startup + T[p[1]] - T[p[0]] - C[p[0]]))
    ends = [l1, l2]
    while ends[-1] < n:
        prev_start = ends[-2] if len(ends) > 1 else 0
        prev, covered = ends[-1], C[ends[-1]] - C[prev_start]
        slack = {x: startup + T[x] - T[prev] - covered for x in range(prev + 1, n + 1)}
        ok = [x for x, s in slack.items() if s >= 0]
        if not ok:
            # the rest cannot cover the previous batch: it joins that batch (which keeps (5)
            # for the batch before it, its communication only growing)
            ends[-1] = n
            break
        ends.append(min(ok, key=slack.__getitem__))
    return tuple(ends)


def greedy_back(compute: Sequence[float], transfer: Sequence[float], startup: float) -> Ends:
    """Algorithm 2: l_{N-1} and l_{N-2} first (the most computation in batch N-1 that the last
    batch's communication covers, ties to the least computation in the last batch), then each
    earlier cut where the communication exceeds the computation it covers by the least."""
    n = _check(compute, transfer)
    if n <= 1:
        return (n,) if n else ()
    C, T = _prefix(compute), _prefix(transfer)
    pairs = [(a, b) for b in range(1, n) for a in range(0, b)
             if startup + T[n] - T[b] >= C[b] - C[a]]
    if not pairs:
        return (n,)
    a, b = min(pairs, key=lambda p: (-(C[p[1]] - C[p[0]]), C[n] - C[p[1]]))
    cuts = [n, b, a]   # l_N, l_{N-1}, l_{N-2}, ... from the back
    while cuts[-1] > 0:
        nxt, cur = cuts[-2], cuts[-1]
        comm = startup + T[nxt] - T[cur]
        slack = {x: comm - (C[cur] - C[x]) for x in range(0, cur)}
        ok = [x for x, s in slack.items() if s >= 0]
        # nothing is covered (one layer computes longer than the communication after it):
        # the cut that misses by least; (5) fails there and the caller prices it as it runs
        cuts.append(min(ok, key=slack.__getitem__) if ok else max(slack, key=slack.__getitem__))
    return tuple(reversed(cuts[:-1]))


def all_batchings(n: int):
    """Every batching of n layers (2^(n-1) of them), as ends."""
    for mask in range(1 << max(n - 1, 0)):
        yield tuple(i for i in range(1, n) if mask >> (i - 1) & 1) + (n,)


def greedy_paper(compute: Sequence[float], transfer: Sequence[float], startup: float) -> Ends:
    """The better of Algorithms 1 and 2 by Eq. 4 among those satisfying (5); the single batch
    (always feasible) when neither does."""
    n = _check(compute, transfer)
    candidates = [e for e in (greedy_front(compute, transfer, startup),
                              greedy_back(compute, transfer, startup))
                  if e and feasible(e, compute, transfer, startup)] or [(n,)]
    return min(candidates, key=lambda e: paper_time(e, compute, transfer, startup))


def exhaustive_paper(compute: Sequence[float], transfer: Sequence[float],
                     startup: float) -> tuple[Ends, float]:
    """The batching with the least Eq. 4 among those satisfying (5) (the single batch always
    does), by trying all of them."""
    n = _check(compute, transfer)
    best = min((e for e in all_batchings(n) if feasible(e, compute, transfer, startup)),
               key=lambda e: paper_time(e, compute, transfer, startup))
    return best, paper_time(best, compute, transfer, startup)


# -- the allreduce iteration -----------------------------------------------------------------------

@dataclass(frozen=True)
class Batching:
    """Buckets as ends (1-based last layer of each, forward order) and the split: buckets
    wholly below ``split`` layers are reduced after the backward pass, front first (forward
    overlap); the others as soon as they are ready (backward overlap)."""

    ends: Ends
    split: int

    def __post_init__(self) -> None:
        if self.split != 0 and self.split not in self.ends:
            raise ValueError(f"split {self.split} is not a bucket boundary of {self.ends}")

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """(first, end) 0-based half-open ranges, forward order."""
        return list(zip((0, *self.ends[:-1]), self.ends, strict=True))


def iteration_time(batching: Batching, profile: Profile) -> float:
    """One iteration simulated, from the start of the backward pass to the end of the next
    forward pass: backward layer by layer from the last; a back bucket's allreduce starts when
    its first layer's gradient is ready and the channel is free; front buckets start front
    first when the backward pass is done; the forward pass computes layer i once its bucket is
    reduced."""
    T = profile.transfer
    n = len(T)
    ready = [0.0] * n
    clock = 0.0
    for i in range(n - 1, -1, -1):
        clock += profile.backward[i]
        ready[i] = clock
    backward_end = clock
    done = [0.0] * n
    channel = 0.0
    buckets = batching.buckets
    back = [b for b in buckets if b[0] >= batching.split][::-1]
    front = [b for b in buckets if b[0] < batching.split]
    for first, end in back + front:
        start = max(channel, ready[first] if first >= batching.split else backward_end)
        channel = start + profile.startup + sum(T[first:end])
        for i in range(first, end):
            done[i] = channel
    clock = backward_end
    for i in range(n):
        clock = max(clock, done[i]) + profile.forward[i]
    return clock


def _phase_candidates(compute: Sequence[float], transfer: Sequence[float],
                      startup: float) -> list[Ends]:
    if not compute:
        return [()]
    out = {greedy_front(compute, transfer, startup), greedy_back(compute, transfer, startup)}
    return sorted(out)


def ibatch_plan(profile: Profile) -> Batching:
    """The iBatch batching for an allreduce (module docstring): per split, both greedy
    algorithms on each phase; the shortest simulated iteration wins (ties: fewer buckets)."""
    n = len(profile.nbytes)
    if n == 0:
        raise ValueError("no layers to plan")
    T = profile.transfer
    best: tuple[float, int, Batching] | None = None
    for split in range(n + 1):
        fronts = _phase_candidates(profile.forward[:split], T[:split], profile.startup)
        backs = _phase_candidates(profile.backward[split:], T[split:], profile.startup)
        for f, b in itertools.product(fronts, backs):
            ends = f + tuple(split + e for e in b)
            cand = Batching(ends, split)
            key = (iteration_time(cand, profile), len(ends), cand)
            if best is None or key[:2] < best[:2]:
                best = key
    assert best is not None
    return best[2]


def exhaustive_plan(profile: Profile) -> tuple[Batching, float]:
    """The batching and split with the shortest simulated iteration, by trying all of them
    (2^(L-1) batchings × their boundaries): for testing the greedy plan on small models."""
    n = len(profile.nbytes)
    best: tuple[float, Batching] | None = None
    for ends in all_batchings(n):
        for split in (0, *ends):
            cand = Batching(ends, split)
            t = iteration_time(cand, profile)
            if best is None or t < best[0]:
                best = (t, cand)
    assert best is not None
    return best[1], best[0]


__all__ = ["Batching", "Ends", "Profile", "all_batchings", "exhaustive_paper", "exhaustive_plan",
           "feasible", "greedy_back", "greedy_front", "greedy_paper", "ibatch_plan",
           "iteration_time", "paper_time", "pipeline_time"]
