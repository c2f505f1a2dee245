"""Allreduce schedules for the survivors after x of N ranks have failed (MPI-free).

Two ways to re-partition the work among the N−x survivors, both with k·(N−x) pieces (k
pipelines, one piece per survivor per pipeline, balanced element ranges):

* **Fresh** (:func:`fresh_bml_schedule`): the survivors are renumbered 0…N−x−1 and run plain BML
  on a new mixed-radix BCube of N−x ranks (the default factorisation of N−x; a prime N−x is one
  level). Right on a flat network (shared memory, a Fat-Tree), where every pair of ranks is one
  hop apart and the old addresses mean nothing. Costs what BML costs on N−x ranks.

* **BCube-preserving** (:func:`bcube_recovery_schedule`), after the server-failure part of the
  BML slides (slide notes on Wang et al., NeurIPS 2018): on real BCube hardware a server's
  links are fixed, so the survivors keep their addresses and
  only ever talk to a server one digit away (one switch). Dead servers leave holes in the level
  groups; the work that would have passed through a hole goes around it through live servers.

Which BCube-preserving schedule runs (:func:`recovery_plan`, cached per shape and dead set,
the same on every rank without communication): two families are priced with the cost model
on the BCube without the dead servers (:class:`bmlmpi.model.BCubeWithout`, one element per
piece), each candidate proven by the verifier, and the cheapest taken (ties: fewer steps):

* the *relay planner* below (BML's trees with stand-ins and auxiliary relay routes);
* *timed trees* (:mod:`.recovery_search`, up to :data:`MAX_SEARCHED_SERVERS` servers): every
  piece reduced along its own searched spanning tree of the survivors, one step count per
  candidate. BCube(3,2) without [0,0]: 16·T_C = T_F in BML's 4 steps, against the relay
  planner's 20·T_C and the BML slides' 18·T_C; the lower bound is 14·T_C (perf/paper/REPORT.md §5).

The relay planner. Pipeline e visits the levels in BML's rotated order
L = (l_0, …, l_{k−1}) = (e, e+1, …) mod k. Its slice is cut into N−x pieces, piece j owned by
the j-th survivor in the order of the address digits (d_{l_0}, d_{l_1}, …), most significant
first, as in BML; so pieces whose owners share a prefix are one contiguous range, and with no
dead server the schedule is exactly BML's.

For piece j with owner o, BML's reduce-scatter is a tree: the node of depth w for the class u
of the not-yet-visited digits is the server t_w(u) = (o's digits on l_0..l_w, u's on the rest);
it collects the sum over every live server agreeing with u, and step w merges the depth-(w−1)
nodes of each level-l_w group into their parent. Around dead servers:

* a live node is held by its own server; a dead node (with live servers below it) by a
  *stand-in*: one of its live children, rotating over them piece by piece (the BML slides' row
  [0,*] splitting dead [0,0]'s pieces between [0,1] and [0,2]), else the stand-in of one of
  its children, else (rarely) it stays *split*, each child's holder keeping a part;
* a part travels from its holder to its node's holder in one hop when they share a switch
  (differ in one digit), otherwise along the earliest path through live relays (the BML slides'
  auxiliary 2-hop transfers; with two dead servers of a small cube, up to 4 hops); when its
  node's holder cannot be reached at all it is reduced into another holder of the same depth
  instead (every holder's sum ends at the owner, so nothing is lost or counted twice);
* every server holds at most one part of a piece per depth, and a relay carries a piece only
  while its range of that piece is free: a holder of the previous depth may relay it only after
  sending its own part, and no two transits overlap on one server (the planner tracks these
  intervals per slot). The search tries stand-in choices depth by depth, backtracking when a
  later depth cannot be routed, and prefers no splits, no redirects, the earliest finish, the
  fewest hops.

Step layout: depth w of the reduce-scatter is a main step (every direct transfer and the first
hop of every route, as in BML) followed by auxiliary steps (the further hops); the allgather
replays each route backwards with copies in mirrored steps. Steps that nothing uses are dropped.

When neither family has a schedule (survivors cut off from each other; for the relay planner
also routes more than two hops long with every relay busy) :class:`RecoveryError` is raised and
the caller falls back to the fresh schedule. Every set of up to two dead servers of BCube(3,2),
BCube(2,3) and BCube(4,2) plans and verifies (tests/unit/test_recovery.py).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ..model.cost import price
from ..model.network import BCubeWithout
from ..schedules.bml import bml_schedule
from ..schedules.types import Recv, Schedule, Step, Transfer, balanced_bounds, merged_ranges
from ..schedules.verify import ScheduleError, verify
from ..topology.bcube import BCube, Shape, default_shape
from .recovery_search import Bounds, TimedTrees, lower_bounds, min_steps, search_trees

#: Largest BCube the BCube-preserving planner takes on: planning is O(k²·N·(N−x)) Python
#: work (measured on the 2-core development machine: 16x16 in about 1.5 s, 32x32 in 35 s).
MAX_PLANNED_SERVERS = 256
#: Largest BCube whose timed trees are searched (:mod:`.recovery_search`); above it the
#: relay planner's schedule runs. Measured on the shared 2-core development machine (load
#: average about 7): 0.7 s for 9 servers, 2.4 s for 27, 2–4 s for 32.
MAX_SEARCHED_SERVERS = 32
#: Step counts searched: T_min … T_min + this (more never paid on the cubes of the report).
EXTRA_STEPS = 1


class RecoveryError(ValueError):
    """No BCube-preserving recovery schedule exists (or was found) for this failure set."""


def fresh_shape(survivors: int) -> Shape:
    """The BCube shape the survivors use on a flat network: the default factorisation."""
    if survivors < 1:
        raise RecoveryError("no survivors")
    return default_shape(survivors)


def fresh_bml_schedule(new_rank: int, survivors: int, count: int) -> Schedule:
    """BML over the survivors renumbered 0…survivors−1 on a fresh mixed-radix BCube."""
    return bml_schedule(new_rank, survivors, count, fresh_shape(survivors))


# -- the BCube-preserving planner ------------------------------------------------------------

# One global transfer: (slot, src, dst, lo, hi, stream, level, reduce); slots sort in time.
_Slot = tuple[int, int, int]
_Move = tuple[_Slot, int, int, int, int, int, int, bool]
# A reduce-phase route of one piece at one depth: (depth, [(server, slot it sends in)…,
# (destination, slot it receives in)])
_Route = tuple[int, list[tuple[int, int]]]


def _differing_levels(cube: BCube, a: int, b: int) -> list[int]:
    return [lv for lv in range(cube.levels) if cube.digit(a, lv) != cube.digit(b, lv)]


def _neighbours(cube: BCube, a: int) -> Iterator[int]:
    for lv in range(cube.levels):
        for b in range(cube.radices[lv]):
            if b != cube.digit(a, lv):
                yield cube.with_digit(a, lv, b)


class _PieceTree:
    """Stand-ins and routes of one piece's reduction tree (see the module docstring)."""

    def __init__(self, cube: BCube, order: Sequence[int], owner: int, live: frozenset[int],
                 rotation: dict[tuple[int, int], int]):
        self.cube = cube
        self.order = order
        self.owner = owner
        self.live = live
        self.rotation = rotation  # (depth, dead node) -> pieces it has handed to live children

    def _route(self, src: int, targets: set[int], now: set[int],
               occupied: dict[int, list[tuple[int, int]]]) -> list[tuple[int, int]] | None:
        """The earliest-arriving path from src to one of ``targets``, as [(server, slot it
        sends in)…, (target, slot it receives in)], or None.

        Slot 0 of a depth is its main step, slots 1, 2, … its auxiliary steps. A server holds
        the piece's range from the slot it receives it in to the slot it sends it on; these
        intervals (``occupied``: each part holder's own part from slot −1, every relay's
        transit) may not overlap on one server, and no holder of this depth (``now``) relays.
        The search runs over (server, arrival slot) breadth-first, lowest addresses first.
        """
        horizon = 3 * self.cube.levels + 4

        def free(x: int, t1: int, t2: int) -> bool:
            return all(hi < t1 or t2 < lo for lo, hi in occupied.get(x, ()))

        prev: dict[tuple[int, int], tuple[int, int] | None] = {(src, -1): None}
        reached = [(src, -1)]
        for slot in range(horizon):
            arrivals = []
            for a, ta in sorted(reached, key=lambda st: (st[1], st[0])):
                if ta >= slot or not free(a, ta, slot):
                    continue
                on_path = self._back(prev, (a, ta))
                visited = {x for x, _ in on_path}
                for b in _neighbours(self.cube, a):
                    if b in targets:
                        return on_path[:-1] + [(a, slot), (b, slot)]
                    if (b in visited or b not in self.live or b in now
                            or (b, slot) in prev or not free(b, slot, slot)):
                        continue
                    prev[(b, slot)] = (a, ta)
                    arrivals.append((b, slot))
            reached.extend(arrivals)
        return None

    @staticmethod
    def _back(prev: dict[tuple[int, int], tuple[int, int] | None],
              state: tuple[int, int]) -> list[tuple[int, int]]:
        """The states leading to ``state``, each paired with the slot it sent in."""
        chain = [state]
        while (p := prev[chain[-1]]) is not None:
            chain.append(p)
        chain.reverse()
        # (server, slot it sends in): the next state's arrival slot
        return [(chain[i][0], chain[i + 1][1]) for i in range(len(chain) - 1)] + [chain[-1]]

    def _options(self, w: int, node: int, parts: list[int]) -> list[tuple[int, ...]]:
        """Who may hold ``node`` at depth w, preferred first: the node itself when live; else
        one of its live children (rotated piece by piece), one of its children's stand-ins, or
        — when no single holder can be reached — all of them, each holding a part."""
        if node in self.live:
            return [(node,)]
        near = _neighbours_set(self.cube, node)
        live_children = [p for p in parts if p in near]
        if live_children:
            s = self.rotation.get((w, node), 0) % len(live_children)
            live_children = live_children[s:] + live_children[:s]
        others = [p for p in parts if p not in near]
        out = [(p,) for p in live_children + others]
        if len(parts) > 1:
            out.append(tuple(parts))
        return out

    def _depth(self, w: int, holders: dict[int, tuple[int, ...]]
               ) -> Iterator[tuple[dict[int, tuple[int, ...]], list[_Route]]]:
        """Every workable (holders, routes) for depth w, best first: fewest split nodes, then
        fewest redirected parts, then earliest finish, then fewest hops, then preference."""
        cube, lv = self.cube, self.order[w]
        target = cube.digit(self.owner, lv)
        groups: dict[int, list[int]] = defaultdict(list)
        for c in sorted(holders):
            groups[cube.with_digit(c, lv, target)].extend(holders[c])
        # A live node whose parts are all its neighbours merges them in the main step, as in
        # BML; only the nodes around the dead servers need a search.
        easy: dict[int, tuple[int, ...]] = {}
        easy_routes: list[_Route] = []
        hard: list[int] = []
        for y, parts in groups.items():
            near = _neighbours_set(cube, y)
            if y in self.live and all(p == y or p in near for p in parts):
                easy[y] = (y,)
                easy_routes.extend((w, [(p, 0), (y, 0)]) for p in parts if p != y)
            else:
                hard.append(y)
        options = [self._options(w, y, groups[y]) for y in hard]
        found = []
        for rank_, combo in enumerate(itertools.product(*options)):
            new_holders = {**easy, **dict(zip(hard, combo, strict=True))}
            singles = {parts[0] for parts in new_holders.values() if len(parts) == 1}
            now = {p for parts in new_holders.values() for p in parts}
            occupied: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for parts in holders.values():
                for p in parts:
                    if p not in now:
                        occupied[p].append((-1, 0))  # its own part, until it is routed
            routes: list[_Route] = []
            redirects = 0
            for y, kept in zip(hard, combo, strict=True):
                if len(kept) > 1:
                    continue  # split: every part stays where it is
                for src in groups[y]:
                    if src == kept[0]:
                        continue
                    occupied[src].remove((-1, 0))
                    path = self._route(src, {kept[0]}, now, occupied)
                    if path is None:
                        # any holder of this depth will do: every one ends at the owner
                        path = self._route(src, singles - {src}, now, occupied)
                        redirects += 1
                    if path is None:
                        break
                    occupied[src].append((-1, path[0][1]))
                    for (r, sent), (_, got) in zip(path[1:-1], path[:-2], strict=True):
                        occupied[r].append((got, sent))
                    routes.append((w, path))
                else:
                    continue
                break
            else:
                last = max((p[-1][1] for _, p in routes), default=0)
                hops = sum(len(p) - 1 for _, p in routes)
                splits = sum(len(parts) > 1 for parts in combo)
                found.append(((splits, redirects, last, hops, rank_), new_holders, routes))
        for _, new_holders, routes in sorted(found, key=lambda f: f[0]):
            yield new_holders, easy_routes + routes

    def plan(self) -> list[_Route]:
        """The reduce-phase routes of the piece, depth by depth."""
        k = len(self.order)
        chosen: list[tuple[dict[int, tuple[int, ...]], list[_Route]]] = []
        # depth-first search over the stand-in choices, depth by depth
        stack = [self._depth(0, {s: (s,) for s in self.live})]
        while stack:
            found = next(stack[-1], None)
            if found is None:
                stack.pop()
                if chosen:
                    chosen.pop()
                continue
            chosen.append(found)
            if len(chosen) == k:
                break
            stack.append(self._depth(len(chosen), found[0]))
        if len(chosen) < k or chosen[-1][0] != {self.owner: (self.owner,)}:
            raise RecoveryError(f"piece of owner {self.owner}: the survivors cannot reach each "
                                f"other around the dead servers")
        for w, (holders, _) in enumerate(chosen):
            for node, parts in holders.items():
                if node not in self.live and len(parts) == 1 and \
                        parts[0] in _neighbours_set(self.cube, node):
                    self.rotation[(w, node)] = self.rotation.get((w, node), 0) + 1
        return [r for _, routes in chosen for r in routes]


def _neighbours_set(cube: BCube, a: int) -> set[int]:
    return set(_neighbours(cube, a))


def _owner_order(cube: BCube, live: Iterable[int], order: Sequence[int]) -> list[int]:
    return sorted(live, key=lambda a: tuple(cube.digit(a, lv) for lv in order))


def recovery_pieces(radices: Sequence[int], dead: Iterable[int], count: int
                    ) -> list[list[tuple[int, int, int]]]:
    """Per pipeline, its pieces as (owner, lo, hi): the pipeline's slice of the buffer cut into
    one balanced range per survivor, in the order of the owners' digits (first-visited level
    most significant) — k·(N−x) pieces in all."""
    cube = BCube(tuple(radices))
    k = cube.levels
    live = frozenset(range(cube.size)) - frozenset(dead)
    slices = balanced_bounds(0, count, max(k, 1))
    out = []
    for e in range(k):
        order = [(e + j) % k for j in range(k)]
        owners = _owner_order(cube, live, order)
        bounds = balanced_bounds(slices[e], slices[e + 1], len(owners))
        out.append([(o, bounds[j], bounds[j + 1]) for j, o in enumerate(owners)])
    return out


@lru_cache(maxsize=32)
def _relay_plan(radices: Shape, dead: frozenset[int], count: int
                ) -> tuple[dict[int, list[Step]], int]:
    """The relay planner's per-rank steps (stand-ins and auxiliary routes, module docstring)."""
    cube = BCube(radices)
    n, k = cube.size, cube.levels
    live = frozenset(range(n)) - dead
    if not live:
        raise RecoveryError("every server is dead")
    if n > MAX_PLANNED_SERVERS:
        raise RecoveryError(f"BCube of {n} servers is above the planner's limit "
                            f"({MAX_PLANNED_SERVERS}); use the fresh schedule")
    moves: list[_Move] = []
    for e, pieces in enumerate(recovery_pieces(radices, dead, count)):
        order = [(e + j) % k for j in range(k)]
        rotation: dict[tuple[int, int], int] = {}
        for o, lo, hi in pieces:
            routes = _PieceTree(cube, order, o, live, rotation).plan()
            if hi == lo:
                continue
            for w, path in routes:
                last = len(path) - 2
                for i, ((a, slot), (b, _)) in enumerate(zip(path[:-1], path[1:], strict=True)):
                    lv = _differing_levels(cube, a, b)[0]
                    # reduce-scatter depth w: the hop in its slot, reduced at the destination
                    moves.append(((0, w, slot), a, b, lo, hi, e, lv, i == last))
                    # allgather depth w: the same path backwards in mirrored slots
                    moves.append(((1, -w, -slot), b, a, lo, hi, e, lv, False))
    return _assemble(moves, live), len(live)


def _assemble(moves: list[_Move], live: frozenset[int]) -> dict[int, list[Step]]:
    """Per-rank steps from the global transfers: merge adjacent ranges, drop unused slots."""
    grouped: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for step, src, dst, lo, hi, stream, level, red in moves:
        grouped[(step, src, dst, stream, level, red)].append((lo, hi))
    used_slots = sorted({key[0] for key in grouped})
    slot_index = {s: i for i, s in enumerate(used_slots)}
    sends: dict[int, list[list[Transfer]]] = {r: [[] for _ in used_slots] for r in live}
    recvs: dict[int, list[list[Recv]]] = {r: [[] for _ in used_slots] for r in live}
    for key in sorted(grouped):
        step, src, dst, stream, level, red = key
        i = slot_index[step]
        for lo, hi in merged_ranges(grouped[key]):
            sends[src][i].append(Transfer(dst, lo, hi, stream=stream, level=level))
            recvs[dst][i].append(Recv(src, lo, hi, stream=stream, level=level, reduce=red))
    return {r: [Step(tuple(s), tuple(v)) for s, v in zip(sends[r], recvs[r], strict=True)]
            for r in live}


# -- the searched plan and the choice -----------------------------------------------------------

def _tree_moves(cube: BCube, trees: TimedTrees, dead: frozenset[int], count: int
                ) -> list[_Move]:
    """The global transfers of timed trees: reduce step t, allgather step 2T−1−t."""
    moves: list[_Move] = []
    ranges = [(o, lo, hi) for pieces in recovery_pieces(cube.radices, dead, count)
              for o, lo, hi in pieces]
    for (e, owner), edges, (o, lo, hi) in zip(trees.pieces, trees.edges, ranges, strict=True):
        if o != owner:
            raise AssertionError(f"piece of {o} planned for {owner}")
        if hi == lo:
            continue
        for v, u, t in edges:
            lv = _differing_levels(cube, v, u)[0]
            moves.append(((0, t, 0), v, u, lo, hi, e, lv, True))
            moves.append(((1, -t, 0), u, v, lo, hi, e, lv, False))
    return moves


@dataclass(frozen=True)
class Candidate:
    """One schedule the choice priced: ``label``, its steps, and its bandwidth in T_C."""

    label: str
    nsteps: int
    step_t_c: tuple[Fraction, ...]
    trees: TimedTrees | None = None

    @property
    def t_c(self) -> Fraction:
        return sum(self.step_t_c, Fraction(0))


@dataclass(frozen=True)
class RecoveryPlan:
    """What the survivors run after ``dead`` failed on BCube ``radices``: the ``chosen``
    candidate (cheapest on the cost model, then fewest steps), every candidate priced, and
    the lower bounds — all in T_C = T_F/(k·S)."""

    radices: Shape
    dead: tuple[int, ...]
    survivors: int
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    bounds: Bounds | None
    #: Candidates the verifier refused (label, its message): never run; empty unless a bug.
    rejected: tuple[tuple[str, str], ...] = ()


def _candidate(label: str, per_rank: dict[int, list[Step]], n: int, unit: int, k: int,
               live: Sequence[int], network, trees: TimedTrees | None = None) -> Candidate:
    scheds = [Schedule("bml-recovery", r, n, unit, tuple(per_rank[r]), streams=k,
                       participants=tuple(live)) for r in live]
    verify(scheds, live=live)
    cost = price(scheds, network)
    per_step = tuple(Fraction(s.time) * k * len(live) / unit for s in cost.steps)
    return Candidate(label, cost.nsteps, per_step, trees)


@lru_cache(maxsize=64)
def recovery_plan(radices: Shape, dead: frozenset[int]) -> RecoveryPlan:
    """Price the relay planner's schedule and, up to :data:`MAX_SEARCHED_SERVERS`, the
    searched timed trees of every step count (:mod:`.recovery_search`) on the BCube without
    ``dead``, each with one element per piece, verify each (a candidate the verifier refuses
    is dropped and listed in ``rejected``), and choose the cheapest.
    Deterministic and communication-free; cached per shape and dead set."""
    shape = tuple(int(r) for r in radices)
    cube = BCube(shape)
    n, k = cube.size, max(cube.levels, 1)
    dead_set = frozenset(int(d) for d in dead)
    live = sorted(frozenset(range(n)) - dead_set)
    if not live:
        raise RecoveryError("every server is dead")
    unit = k * len(live)
    network = BCubeWithout(shape, dead_set)
    candidates: list[Candidate] = []
    rejected: list[tuple[str, str]] = []
    relay_error: RecoveryError | None = None

    def offer(label: str, per_rank: dict[int, list[Step]], trees: TimedTrees | None) -> None:
        try:
            candidates.append(_candidate(label, per_rank, n, unit, k, live, network, trees))
        except ScheduleError as exc:  # proven wrong: never run it
            rejected.append((label, str(exc)))

    try:
        per_rank, _ = _relay_plan(shape, dead_set, unit)
        offer("relays", per_rank, None)
    except RecoveryError as exc:
        relay_error = exc
    first = min_steps(shape, dead_set) if dead_set and len(live) > 1 else None
    if first is not None and n <= MAX_SEARCHED_SERVERS:
        pieces = [(e, o) for e, ps in enumerate(recovery_pieces(shape, dead_set, unit))
                  for o, _, _ in ps]
        for steps in range(first, first + EXTRA_STEPS + 1):
            trees = search_trees(shape, dead_set, pieces, steps)
            if trees is None:
                continue
            per_rank = _assemble(_tree_moves(cube, trees, dead_set, unit), frozenset(live))
            offer(f"trees T={steps}", per_rank, trees)
    if not candidates:
        raise relay_error or RecoveryError(f"no recovery schedule passed the verifier: "
                                           f"{rejected}")
    chosen = min(candidates, key=lambda c: (c.t_c, c.nsteps))
    try:
        bounds = lower_bounds(shape, dead_set) if len(live) > 1 else None
    except ValueError:
        bounds = None
    return RecoveryPlan(shape, tuple(sorted(dead_set)), len(live), chosen, tuple(candidates),
                        bounds, tuple(rejected))


def candidate_schedules(candidate: Candidate, radices: Sequence[int], dead: Iterable[int],
                        count: int) -> list[Schedule]:
    """Every survivor's schedule of one priced candidate of :func:`recovery_plan`."""
    shape = tuple(int(r) for r in radices)
    dead_set = frozenset(int(d) for d in dead)
    n, k = math.prod(shape), max(len(shape), 1)
    live = sorted(frozenset(range(n)) - dead_set)
    if candidate.trees is None:
        per_rank, _ = _relay_plan(shape, dead_set, count)
    else:
        if (candidate.trees.radices, candidate.trees.dead) != (shape, tuple(sorted(dead_set))):
            raise ValueError("candidate planned for another cube or dead set")
        per_rank = _assemble(_tree_moves(BCube(shape), candidate.trees, dead_set, count),
                             frozenset(live))
    return [Schedule("bml-recovery", r, n, count, tuple(per_rank[r]), streams=k,
                     participants=tuple(live)) for r in live]


@lru_cache(maxsize=32)
def _global_plan(radices: Shape, dead: frozenset[int], count: int
                 ) -> tuple[dict[int, list[Step]], int, str]:
    plan = recovery_plan(radices, dead)
    live = frozenset(range(math.prod(radices))) - dead
    if plan.chosen.trees is None:
        per_rank, survivors = _relay_plan(radices, dead, count)
        return per_rank, survivors, plan.chosen.label
    moves = _tree_moves(BCube(radices), plan.chosen.trees, dead, count)
    return _assemble(moves, live), len(live), plan.chosen.label


def bcube_recovery_schedule(rank: int, radices: Sequence[int], dead: Iterable[int],
                            count: int) -> Schedule:
    """The schedule of survivor ``rank`` (its original address) on BCube ``radices`` without
    the servers in ``dead``. Peers are original addresses; ``participants`` lists the survivors.
    """
    shape = tuple(int(r) for r in radices)
    cube = BCube(shape)
    n = cube.size
    dead_set = frozenset(int(d) for d in dead)
    if any(not 0 <= d < n for d in dead_set):
        raise ValueError(f"dead servers {sorted(dead_set)} outside [0, {n})")
    if not 0 <= rank < n or rank in dead_set:
        raise ValueError(f"rank {rank} is not a live server of the {n}-server BCube")
    if count < 0:
        raise ValueError(f"negative count {count}")
    per_rank, survivors, label = _global_plan(shape, dead_set, count)
    k = max(cube.levels, 1)
    live = tuple(sorted(per_rank))
    return Schedule("bml-recovery", rank, n, count, tuple(per_rank[rank]), streams=k,
                    participants=live,
                    meta={"radices": shape, "dead": tuple(sorted(dead_set)),
                          "pieces": cube.levels * survivors, "plan": label})


def bcube_preserving(name: str, rank: int, home_shape: Shape, failed: Iterable[int],
                     count: int) -> Schedule | None:
    """The survivors' schedule that keeps the BCube addresses of ``home_shape`` (the BML slides):
    ``rank`` and the schedule's peers are original ranks. None when it does not apply — not
    bml, nobody failed, a cube over ``MAX_PLANNED_SERVERS``, or no such schedule found — and
    the survivors run the fresh schedule over their new ranks instead."""
    dead = tuple(failed)
    if name != "bml" or not dead or math.prod(home_shape) > MAX_PLANNED_SERVERS:
        return None
    try:
        return bcube_recovery_schedule(rank, home_shape, dead, count)
    except RecoveryError:
        return None


def bcube_recovery_schedules(radices: Sequence[int], dead: Iterable[int],
                             count: int) -> list[Schedule]:
    """Every survivor's schedule (for the verifier and the cost figures)."""
    dead_set = frozenset(dead)
    n = math.prod(radices)
    return [bcube_recovery_schedule(r, radices, dead_set, count)
            for r in range(n) if r not in dead_set]


def nic_piece_times(scheds: Sequence[Schedule], piece: int) -> list[int]:
    """Per step, the busiest NIC's load in piece-times: the most elements any server moves
    over one level (sent or received, whichever is larger) in that step, divided by the piece
    size. On BCube every level is its own NIC, so a step lasts as long as its busiest NIC."""
    nsteps = max(s.nsteps for s in scheds)
    out = []
    for i in range(nsteps):
        worst = 0
        for s in scheds:
            if i >= s.nsteps:
                continue
            load: dict[tuple[str, int], int] = defaultdict(int)
            for t in s.steps[i].sends:
                load[("out", t.level)] += t.n
            for t in s.steps[i].recvs:
                load[("in", t.level)] += t.n
            worst = max(worst, *load.values(), 0)
        out.append(-(-worst // piece))
    return out
