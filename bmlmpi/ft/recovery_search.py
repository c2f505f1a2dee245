"""Search for BCube-preserving recovery schedules: timed reduction trees (MPI-free).

The problem (the BML slides' server failure): BCube ``radices`` (N servers, k levels) has lost the
servers in ``dead``; the S = N − x survivors keep their addresses and talk only to a live
server one switch away. The buffer is cut into k·S pieces as :func:`recovery_pieces
<bmlmpi.ft.recovery.recovery_pieces>` cuts it (one per survivor per pipeline); with
one piece as the unit, T_C = T_F/(k·S).

The family searched. Every piece p, owned by o_p, is reduced along its own spanning tree of
the survivors rooted at o_p, each edge one BCube hop between live servers. Every survivor
v ≠ o_p sends its partial sum of p once, to its parent, in reduce step t_p(v) ∈ [0, T), after
all its children: t_p(child) < t_p(v). The allgather replays each tree backwards, a parent
copying the finished piece to v in step 2T−1−t_p(v). BML is the member whose trees fix one
address digit per step in the pipeline's level order; the BML slides' relays (the servers that
carry dead [0,0]'s row share round it, its "auxiliary" 2-hop steps) are inner tree nodes off
BML's paths, and its auxiliary steps are extra steps T > k. A member is one (parent, step)
for every survivor in every piece: at most Π_v (deg(v)·T) timed trees per piece (deg: live
neighbours), ((deg·T)^(S−1))^(k·S) in all — about 10^128 for BCube(3,2) without [0,0] at
T = 4 (:func:`search_space_log10`); it is searched, not enumerated.

Cost. The cost model's (:mod:`bmlmpi.model.cost`): a step costs its busiest directional NIC
link (server, level, in or out), steps add up. The allgather step mirrors the reduce step
(the same links, directions swapped), so an allreduce costs 2·Σ_t max-link(t), in T_C.

The search (:func:`search_trees`). For each step count T from T_min (k, or more when some
survivor is further than k hops from an owner) to T_min + ``EXTRA_STEPS`` (recovery.py): a
breadth-first tree per piece (BML's digit order preferred, BML's steps where they fit), then a
greedy descent (every server of every piece moved in turn to its best parent and step, while
the cost drops), then iterated descent: kick (a few random moves) and descend again, keeping
the result when it is no worse, else going back to the best. The descent minimises
Σ_t max-link(t), ties broken by Σ link load² (which breaks the plateaus of the max). Fixed
budgets (sweeps, rounds: never a time) and a fixed-seed generator give the same result on
every rank without communication; about 0.3 s of CPU per step count for 27 servers (BCube
3x3x3 without one). The descent prices each candidate move from the link loads, without
applying it. :func:`bmlmpi.ft.recovery.recovery_plan` prices every result (and the relay
planner's schedule) with :func:`bmlmpi.model.price` on :class:`bmlmpi.model.BCubeWithout` and
keeps the cheapest. It is a heuristic: for BCube(3,2) without [0,0] it finds 16·T_C at T = 2,
the family's optimum up to T = 3, but not the 14·T_C the family reaches at T = 4 (both optima
by the exact MILP of ``perf/paper/recovery_milp.py``).

Lower bounds (:func:`lower_bounds`, in T_C, M = k·S pieces, L = the survivors' NICs that still
reach a live server, d_v those of survivor v):

* any allreduce: every element needs ≥ 2(S−1) transfers (one-way gossip), so the busiest NIC
  carries ≥ 2(S−1)·M/L; every survivor sends and receives every element at least once:
  ≥ M/d_v; every element crosses both ways between the servers of one digit value and the
  rest: ≥ M/(the level's NICs that cross, each way);
* this family: the reduce phase alone makes every survivor send each piece it does not own
  once, ≥ (M−k)/d_v and ≥ S·(M−k)/L over all NICs; the pieces owned outside a group of
  servers (all servers of one digit value, or one server) leave it through its NICs; the
  allgather doubles the reduce phase's bound.

Source: the server-failure part of the BML slides (slide notes on Wang et al., NeurIPS 2018:
k·(N−x) pieces, auxiliary steps around a dead server, BCube(3,2) without [0,0] in
18·T_C = 9/8·T_F); the timed-tree family and its search are ours.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..topology.bcube import BCube, Shape

#: Sweeps of one greedy descent at most; random moves per kick (tuned on the report's cubes).
DESCENT_SWEEPS, KICK_MOVES = 20, 8
#: Rounds of kick and descent per step count: about ROUND_WORK / (pieces · (survivors − 1)),
#: within [MIN_ROUNDS, MAX_ROUNDS] — a fixed count, never a time.
ROUND_WORK, MIN_ROUNDS, MAX_ROUNDS = 40_000, 10, 200


@dataclass(frozen=True)
class TimedTrees:
    """One member of the family: per piece, every non-owner's (server, parent, reduce step)."""

    radices: Shape
    dead: tuple[int, ...]
    steps: int                                  # T, reduce steps (the allreduce has 2T)
    pieces: tuple[tuple[int, int], ...]         # (pipeline, owner) per piece
    edges: tuple[tuple[tuple[int, int, int], ...], ...]
    step_loads: tuple[int, ...]                 # busiest link per reduce step, in pieces

    @property
    def cost(self) -> int:
        """The allreduce's bandwidth cost in T_C (piece-times): reduce + mirrored allgather."""
        return 2 * sum(self.step_loads)


@dataclass(frozen=True)
class Bounds:
    """Lower bounds in T_C: for any allreduce on the survivors' links, and for the family."""

    any_schedule: Fraction
    family: Fraction


def live_neighbours(cube: BCube, live: frozenset[int], a: int) -> list[tuple[int, int]]:
    """(server, level) of every live server one switch from ``a``, ascending."""
    out = []
    for lv in range(cube.levels):
        for v in range(cube.radices[lv]):
            b = cube.with_digit(a, lv, v)
            if b != a and b in live:
                out.append((b, lv))
    return sorted(out)


def _distances(cube: BCube, live: frozenset[int], src: int) -> dict[int, int]:
    dist = {src: 0}
    queue = deque([src])
    while queue:
        a = queue.popleft()
        for b, _ in live_neighbours(cube, live, a):
            if b not in dist:
                dist[b] = dist[a] + 1
                queue.append(b)
    return dist


def min_steps(radices: Shape, dead: Iterable[int]) -> int | None:
    """The fewest reduce steps a tree can take: max(k, the largest survivor-to-survivor
    distance); None when the dead servers cut the survivors apart."""
    cube = BCube(tuple(radices))
    live = frozenset(range(cube.size)) - frozenset(dead)
    far = 0
    for a in sorted(live):
        dist = _distances(cube, live, a)
        if len(dist) < len(live):
            return None
        far = max(far, *dist.values())
    return max(cube.levels, far, 1)


def _nics(cube: BCube, live: frozenset[int]) -> dict[int, set[int]]:
    return {a: {lv for _, lv in live_neighbours(cube, live, a)} for a in live}


def lower_bounds(radices: Shape, dead: Iterable[int]) -> Bounds:
    """The lower bounds of the module docstring, in T_C = T_F/(k·S)."""
    cube = BCube(tuple(radices))
    k = cube.levels
    live = frozenset(range(cube.size)) - frozenset(dead)
    s = len(live)
    if s < 2:
        return Bounds(Fraction(0), Fraction(0))
    m = k * s
    nics = _nics(cube, live)
    total = sum(len(v) for v in nics.values())
    if total == 0 or any(not v for v in nics.values()):
        raise ValueError("a survivor has no live neighbour: no allreduce over BCube links")
    any_b = max(Fraction(2 * (s - 1) * m, total),
                max(Fraction(m, len(v)) for v in nics.values()))
    fam = max(Fraction(s * (m - k), total),
              max(Fraction(m - k, len(v)) for v in nics.values()))
    # groups: all live servers with digit l equal to c; the NICs of level l leave them
    for lv in range(k):
        for c in range(cube.radices[lv]):
            group = {a for a in live if cube.digit(a, lv) == c}
            if not group or group == live:
                continue
            out = sum(1 for a in group
                      if any(b not in group for b, _ in live_neighbours(cube, live, a)))
            into = sum(1 for a in live - group
                       if any(b in group for b, _ in live_neighbours(cube, live, a)))
            if out == 0 or into == 0:
                raise ValueError("the dead servers cut the survivors apart")
            any_b = max(any_b, Fraction(m, out), Fraction(m, into))
            fam = max(fam, Fraction(k * (s - len(group)), out),
                      Fraction(k * len(group), into))
    return Bounds(any_b, 2 * fam)


def search_space_log10(radices: Shape, dead: Iterable[int], steps: int) -> float:
    """log10 of the family's size bound at ``steps`` reduce steps (module docstring)."""
    cube = BCube(tuple(radices))
    live = frozenset(range(cube.size)) - frozenset(dead)
    per_piece = {o: sum(math.log10(len(live_neighbours(cube, live, v)) * steps)
                        for v in live if v != o) for o in live}
    return cube.levels * sum(per_piece.values())


class _TreeSet:
    """The link loads of a set of timed trees, updated move by move (see the docstring)."""

    def __init__(self, cube: BCube, live: frozenset[int], pieces: Sequence[tuple[int, int]],
                 steps: int):
        self.cube, self.live, self.pieces, self.steps = cube, live, pieces, steps
        k, n = cube.levels, cube.size
        self.k, self.n = k, n
        self.nbrs = {a: live_neighbours(cube, live, a) for a in sorted(live)}
        self.level = {(a, b): lv for a, bl in self.nbrs.items() for b, lv in bl}
        links = 2 * n * k
        self.load = [[0] * links for _ in range(steps)]
        self.hist = [{0: links} for _ in range(steps)]
        self.top = [0] * steps
        self.phi = 0   # Σ over steps of the busiest link
        self.psi = 0   # Σ over steps and links of load²
        self.parent: list[dict[int, int]] = []
        self.step: list[dict[int, int]] = []
        self.children: list[dict[int, list[int]]] = []

    def _bump(self, t: int, i: int, d: int) -> None:
        row = self.load[t]
        a = row[i]
        b = a + d
        row[i] = b
        h = self.hist[t]
        h[a] -= 1
        h[b] = h.get(b, 0) + 1
        self.psi += b * b - a * a
        if b > self.top[t]:
            self.phi += b - self.top[t]
            self.top[t] = b
        elif a == self.top[t] and h[a] == 0:
            self.phi -= 1
            self.top[t] = a - 1

    def edge(self, v: int, u: int, t: int, d: int) -> None:
        lv = self.level[(v, u)]
        self._bump(t, v * self.k + lv, d)                       # v's level-lv uplink
        self._bump(t, (self.n + u) * self.k + lv, d)            # u's level-lv downlink

    def seed_trees(self) -> bool:
        """Breadth-first trees, BML's digit order preferred, steps as in BML where the tree
        allows, else as soon as possible; False when some tree needs more steps."""
        cube, k, T = self.cube, self.k, self.steps
        for e, o in self.pieces:
            order = {(e + j) % k: j for j in range(k)}
            dist = _distances(cube, self.live, o)
            par: dict[int, int] = {}
            for v in sorted(self.live - {o}):
                closer = [(order[lv], b) for b, lv in self.nbrs[v] if dist[b] == dist[v] - 1]
                par[v] = min(closer)[1]
            kids: dict[int, list[int]] = {v: [] for v in self.live}
            for v, u in sorted(par.items()):
                kids[u].append(v)
            when: dict[int, int] = {}
            for v in sorted(par, key=lambda x: (-dist[x], x)):
                lv = self.level[(v, par[v])]
                when[v] = max([order[lv]] + [when[c] + 1 for c in kids[v]])
            if max(when.values(), default=0) >= T:
                for v in sorted(par, key=lambda x: (-dist[x], x)):
                    when[v] = max([0] + [when[c] + 1 for c in kids[v]])
                if max(when.values(), default=0) >= T:
                    return False
            self.parent.append(par)
            self.step.append(when)
            self.children.append(kids)
            for v, u in par.items():
                self.edge(v, u, when[v], 1)
        return True

    def descend(self, sweeps: int) -> None:
        """Greedy descent: sweep the pieces and servers in order, moving each server to its
        best (parent, step) within its children's and parent's steps while that lowers
        (Σ max-link, Σ load²); stop after a sweep without a move or after ``sweeps``."""
        last, k, n, load, top = self.steps - 1, self.k, self.n, self.load, self.top
        for _ in range(sweeps):
            moved = False
            for p, (_, o) in enumerate(self.pieces):
                par, when, kids = self.parent[p], self.step[p], self.children[p]
                for v in sorted(par):
                    u0, t0 = par[v], when[v]
                    lo = 0
                    for c in kids[v]:
                        if when[c] >= lo:
                            lo = when[c] + 1
                    # Every candidate's cost is computed, not applied and undone: the state
                    # as edge() would leave it with v's edge (u0, t0) taken out (its two
                    # links one lower; the step's busiest link one lower when both held all
                    # the links at the top), then the candidate's two links one higher.
                    lv0 = self.level[(v, u0)]
                    up0, down0 = v * k + lv0, (n + u0) * k + lv0
                    row0, top0 = load[t0], top[t0]
                    a0, b0 = row0[up0], row0[down0]
                    at_top = (a0 == top0) + (b0 == top0)
                    top0_out = top0 - 1 if at_top and self.hist[t0][top0] == at_top else top0
                    phi = self.phi - (top0 - top0_out)
                    psi = self.psi - 2 * (a0 + b0 - 1)
                    # the best so far, (Σ max-link, Σ load²); a move must beat the current
                    best, best_phi, best_psi = None, self.phi, self.psi
                    for u, lv in self.nbrs[v]:
                        hi = last if u == o else when[u] - 1
                        up, down = v * k + lv, (n + u) * k + lv
                        for t in range(lo, hi + 1):
                            row = load[t]
                            a, b = row[up], row[down]
                            if t == t0:
                                if u == u0:
                                    continue
                                a -= up == up0  # u != u0: only v's uplink can be shared
                                high = top0_out
                            else:
                                high = top[t]
                            rise = (a if a > b else b) + 1 - high
                            key_phi = phi + rise if rise > 0 else phi
                            if key_phi > best_phi:
                                continue
                            key_psi = psi + 2 * (a + b + 1)
                            if key_phi < best_phi or key_psi < best_psi:
                                best, best_phi, best_psi = (u, t), key_phi, key_psi
                    if best is None:
                        continue
                    self.edge(v, u0, t0, -1)
                    u, t = best
                    self.edge(v, u, t, 1)
                    par[v], when[v] = u, t
                    kids[u0].remove(v)
                    kids[u].append(v)
                    moved = True
            if not moved:
                return

    def kick(self, draw: random.Random, moves: int) -> None:
        """Perturb: ``moves`` random valid moves (a server of a piece to another parent and
        step between its children's and its parent's), whatever they cost."""
        last = self.steps - 1
        done = tries = 0
        while done < moves and tries < 100 * moves:
            tries += 1
            p = draw.randrange(len(self.pieces))
            o = self.pieces[p][1]
            par, when, kids = self.parent[p], self.step[p], self.children[p]
            v = draw.choice(sorted(par))
            u = draw.choice(self.nbrs[v])[0]
            hi = last if u == o else when[u] - 1
            lo = max((when[c] + 1 for c in kids[v]), default=0)
            if hi < lo or self._descends(par, o, u, v):
                continue
            t = draw.randint(lo, hi)
            self.edge(v, par[v], when[v], -1)
            self.edge(v, u, t, 1)
            kids[par[v]].remove(v)
            kids[u].append(v)
            par[v], when[v] = u, t
            done += 1

    def iterate(self, rounds: int, seed: int) -> None:
        """Iterated descent: ``rounds`` times kick and descend, keeping the result when it is
        no worse than the best so far, else going back to the best."""
        draw = random.Random(seed)
        best = (self.phi, self.psi)
        snap = self._snapshot()
        for _ in range(rounds):
            self.kick(draw, KICK_MOVES)
            self.descend(DESCENT_SWEEPS)
            if (self.phi, self.psi) <= best:
                best = (self.phi, self.psi)
                snap = self._snapshot()
            else:
                self._restore(snap)

    @staticmethod
    def _descends(par: dict[int, int], owner: int, u: int, v: int) -> bool:
        while u != owner:
            if u == v:
                return True
            u = par[u]
        return False

    def _snapshot(self) -> list[tuple[dict[int, int], dict[int, int]]]:
        return [(dict(p), dict(w)) for p, w in zip(self.parent, self.step, strict=True)]

    def _restore(self, snap: list[tuple[dict[int, int], dict[int, int]]]) -> None:
        for p, (par, when) in enumerate(snap):
            for v, u in self.parent[p].items():
                self.edge(v, u, self.step[p][v], -1)
            for v, u in par.items():
                self.edge(v, u, when[v], 1)
            kids: dict[int, list[int]] = {v: [] for v in self.live}
            for v, u in sorted(par.items()):
                kids[u].append(v)
            # copies: the snapshot must survive the moves made after going back to it
            self.parent[p], self.step[p], self.children[p] = dict(par), dict(when), kids


def rounds_for(pieces: int, survivors: int) -> int:
    """The search budget for one step count: a fixed number of rounds, never a time."""
    return max(MIN_ROUNDS, min(MAX_ROUNDS, ROUND_WORK // max(pieces * (survivors - 1), 1)))


def search_trees(radices: Shape, dead: Iterable[int], pieces: Sequence[tuple[int, int]],
                 steps: int, rounds: int | None = None, seed: int = 0) -> TimedTrees | None:
    """The best timed trees the search finds with ``steps`` reduce steps for ``pieces``
    ((pipeline, owner) each), or None when a tree cannot fit in ``steps``. Deterministic."""
    shape = tuple(int(r) for r in radices)
    cube = BCube(shape)
    dead_t = tuple(sorted(frozenset(int(d) for d in dead)))
    live = frozenset(range(cube.size)) - frozenset(dead_t)
    if steps < 1 or len(live) < 2:
        return None
    trees = _TreeSet(cube, live, pieces, steps)
    if not trees.seed_trees():
        return None
    budget = rounds_for(len(pieces), len(live)) if rounds is None else rounds
    # the generator's seed names the problem: the same draws on every rank and every run
    problem = zlib.crc32(repr((shape, dead_t, steps, tuple(pieces))).encode())
    trees.descend(DESCENT_SWEEPS)
    trees.iterate(budget, seed * 2**32 + problem)
    edges = tuple(tuple((v, par[v], when[v]) for v in sorted(par))
                  for par, when in zip(trees.parent, trees.step, strict=True))
    return TimedTrees(shape, dead_t, steps, tuple(pieces), edges, tuple(trees.top))


__all__ = ["Bounds", "TimedTrees", "live_neighbours", "lower_bounds", "min_steps",
           "rounds_for", "search_space_log10", "search_trees"]
