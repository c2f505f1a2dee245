"""Topology-aware reduction trees from a link-weight matrix (MXNet tree-reduce proposal).

Source: the Apache MXNet design proposal "topology-aware single-machine tree reduce": a
single binary tree for small arrays, one tree per root for large ones, trees found by
Kernighan-Lin bisection of the link graph, a bounded exhaustive search when KL gets stuck, and
a 0.7 penalty on links already used.

What a tree is here
-------------------
A reduction runs in synchronous *steps*. In step ``s`` every non-root node that is done
sends its partial sum to its parent, which adds it in; a node sends exactly once, after it
has received from all its children. As in the proposal's Figure 6 (GPU1→GPU5, then
GPU7→GPU5, then GPU4→GPU5), a node can receive from one child per step, so it may have
several children, at different steps — the communication graph is binomial-like.

* **binary**: every node takes part in at most one tree edge per step (it receives from at
  most one child, or sends to its parent, or idles). Unfolded over time this is the
  proposal's binary tree: each internal vertex at step s joins two partial sums — the
  receiver's own and its partner's — so every step at most halves the number of partial sums.
* **depth**: the number of steps, ``max(send_step)``. A binary tree on n nodes needs at least
  ⌈log2 n⌉ steps; a tree with exactly that many is **balanced**.
* **weight**: the sum of ``W`` over the tree's n − 1 edges; maximising it puts the reduction
  on the fastest links.

Equivalently (and this is how the trees are built), a balanced tree of cluster C rooted at r
with b steps left is: C split into A ∋ r and B with |A|, |B| ≤ 2^(b−1), a balanced tree of A
rooted at r and one of B rooted at some v, both with b − 1 steps, and the edge v→r in step b.

How a tree is found (:func:`binary_tree`)
-----------------------------------------
Top-down recursive bisection, the proposal's step 2 applied to each cluster:

1. A cluster of at most ``EXACT_LIMIT`` (8) nodes is solved exactly by a search over its
   bisections (a memoised dynamic programme over subsets; at most a few thousand splits).
   This is the proposal's exhaustive search, used directly where it is cheap; it also makes
   every tree on ≤ 8 nodes (p3.16xlarge included) a maximum-weight balanced tree.
2. A larger cluster is bisected by Kernighan-Lin into balanced halves (sizes ⌈m/2⌉, ⌊m/2⌋)
   that maximise intra-cluster weight, with the cluster root r locked on its side. The
   candidates are: KL from r alone, then joining through the heaviest r→B link (the
   proposal's rule); and KL with r and one of r's heaviest neighbours v locked on opposite
   sides (so a join edge always exists). Candidates are ranked by intra-cluster weight plus
   the join weight, and ones whose halves cannot be reached from their roots within the
   remaining steps are dropped. The first candidate whose halves both solve is taken.
3. If every KL candidate fails ("KL gets stuck", which the proposal saw on 6 GPUs), a bounded
   exhaustive search over the balanced bisections of clusters of up to
   ``SPLIT_SEARCH_LIMIT`` nodes, best-ranked first.
4. Every attempt counts against a budget proportional to n; when it runs out, or no balanced
   tree is found, the fallback is always valid: a breadth-first spanning tree over W's links
   (each node joining the least-loaded, then heaviest, neighbour one hop nearer the root)
   with its optimal step assignment (children in order of readiness). Its depth may exceed
   ⌈log2 n⌉; ``Tree.method`` says ``"fallback"``. It never aborts and never loops.

Every tree edge is a link of W (weight > 0), always: when W is too sparse for a balanced tree
(a path of 8 nodes rooted at one end needs 7 steps), the tree takes more steps instead of
routing through a missing link. For n ≤ 8 a balanced tree is found whenever one exists; for
larger n the search is a heuristic — reliable on dense and structured matrices (GPU
servers, BCube, flat), but on sparse graphs of more than ~20 nodes it often misses balanced
trees that exist (``perf/trees/README.md``). A disconnected W raises ValueError.

Multi-tree (:func:`multi_trees`): one tree per root 0..n−1, built in that order; after each,
the weights of the links it used are multiplied by the penalty (``BMLMPI_TREE_LINK_PENALTY``,
default 0.7), steering later trees to other links; each tree keeps to the strongest link
classes that still admit a balanced tree (see :func:`multi_trees`).

Determinism: no clocks, no global random state; ties are broken by a permutation drawn from
``seed``, so every rank that calls with the same W, root and seed gets the same tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from .. import config
from .links import is_connected, validate_links

EXACT_LIMIT = 8
SPLIT_SEARCH_LIMIT = 16
KL_PARTNERS = 3
KL_MAX_PASSES = 8
ATTEMPTS_BASE = 32
MAX_LINK_CLASSES = 8
SPLIT_SEARCH_COST = 4
ATTEMPTS_PER_NODE = 4
DEFAULT_PENALTY: float = config.variable("BMLMPI_TREE_LINK_PENALTY").default
_EPS = 1e-9

Edge = tuple[int, int, int]  # (child, parent, step)
_Found = tuple[float, tuple[Edge, ...]]  # (tree weight, its edges)


def balanced_depth(n: int) -> int:
    """⌈log2 n⌉: the fewest steps a binary reduction of n nodes can take."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    return (n - 1).bit_length()


@dataclass(frozen=True)
class Tree:
    """A binary reduction tree (see the module docstring for "binary" and "depth").

    ``parent[v]`` is v's parent (−1 for the root); ``send_step[v]`` is the step, 1-based, in
    which v sends its partial sum to its parent (0 for the root). Construction checks the
    invariants: one root, every node takes part in at most one edge per step, and a node
    sends only after all its children have (which also rules out cycles).
    """

    root: int
    parent: tuple[int, ...]
    send_step: tuple[int, ...]
    method: str = field(default="given", compare=False)
    children: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    levels: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False)
    depth: int = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.parent)
        parent = tuple(int(p) for p in self.parent)
        step = tuple(int(s) for s in self.send_step)
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "send_step", step)
        if n == 0 or len(step) != n:
            raise ValueError(f"tree: parent ({n}) and send_step ({len(step)}) must have the "
                             f"same positive length")
        if not 0 <= self.root < n or parent[self.root] != -1 or step[self.root] != 0:
            raise ValueError(f"tree: root {self.root} must have parent -1 and send_step 0")
        kids: list[list[int]] = [[] for _ in range(n)]
        for v in range(n):
            if v == self.root:
                continue
            p = parent[v]
            if not 0 <= p < n or p == v:
                raise ValueError(f"tree: node {v} has bad parent {p}")
            if step[v] < 1:
                raise ValueError(f"tree: node {v} has send_step {step[v]} < 1")
            kids[p].append(v)
        for u in range(n):
            busy = [step[c] for c in kids[u]]
            if len(set(busy)) != len(busy):
                raise ValueError(f"tree: node {u} receives twice in one step {sorted(busy)}")
            if u != self.root and busy and max(busy) >= step[u]:
                raise ValueError(f"tree: node {u} sends in step {step[u]} before its child's "
                                 f"step {max(busy)}")
        depth = max(step)
        levels = tuple(tuple((v, parent[v]) for v in range(n) if step[v] == s)
                       for s in range(1, depth + 1))
        object.__setattr__(self, "children",
                           tuple(tuple(sorted(k, key=lambda c: step[c])) for k in kids))
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "depth", depth)

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """(child, parent) pairs, in step order."""
        return tuple(e for lvl in self.levels for e in lvl)

    @property
    def balanced(self) -> bool:
        return self.depth == balanced_depth(self.size)

    def weight(self, weights: Any) -> float:
        w = np.asarray(weights, dtype=np.float64)
        return float(sum(w[c, p] for c, p in self.edges))

    @classmethod
    def from_edges(cls, n: int, root: int, edges: Sequence[Edge], method: str) -> Tree:
        parent = [-1] * n
        step = [0] * n
        for c, p, s in edges:
            parent[c] = p
            step[c] = s
        return cls(root, tuple(parent), tuple(step), method)


# ---------------------------------------------------------------------------------------
# search


class _Builder:
    """State of one tree search: the matrix, tie-break order, memo and attempt budget."""

    def __init__(self, w: np.ndarray, seed: int) -> None:
        self.w = w
        self.n = w.shape[0]
        self.adj = w > 0
        self.nbr_mask = [sum(1 << int(j) for j in np.nonzero(row)[0]) for row in self.adj]
        rng = np.random.default_rng(seed)
        # key[v]: v's position in the tie-break order; clusters are kept sorted by it.
        self.key = np.empty(self.n, dtype=np.int64)
        self.key[rng.permutation(self.n)] = np.arange(self.n)
        self.attempts_left = ATTEMPTS_BASE + ATTEMPTS_PER_NODE * self.n
        self.memo: dict[tuple[tuple[int, ...], int, int], _Found | None] = {}
        self.used_exact = False
        self.used_kl = False
        self.used_split_search = False

    def sort(self, nodes: Any) -> tuple[int, ...]:
        return tuple(sorted((int(x) for x in nodes), key=lambda x: self.key[x]))

    # -- feasibility filter ----------------------------------------------------------------

    def reachable(self, nodes: Sequence[int], root: int, steps: int) -> bool:
        """Every node of ``nodes`` is within ``steps`` hops of ``root`` inside the cluster:
        necessary for a reduction over the cluster's own links in that many steps."""
        mask = 0
        for x in nodes:
            mask |= 1 << x
        nbr = self.nbr_mask
        seen = frontier = 1 << root
        for _ in range(steps):
            if seen == mask:
                return True
            reach = 0
            while frontier:
                low = frontier & -frontier
                reach |= nbr[low.bit_length() - 1]
                frontier ^= low
            frontier = reach & mask & ~seen
            if not frontier:
                return False
            seen |= frontier
        return seen == mask

    # -- recursion ---------------------------------------------------------------------

    def solve(self, nodes: tuple[int, ...], r: int,
              b: int) -> _Found | None:
        """Best tree found for cluster ``nodes`` rooted at ``r`` within ``b`` steps."""
        m = len(nodes)
        if m == 1:
            return 0.0, ()
        if b < balanced_depth(m):
            return None
        memo_key = (nodes, r, b)
        if memo_key in self.memo:
            return self.memo[memo_key]
        result = None
        if self.reachable(nodes, r, b):
            if m <= EXACT_LIMIT:
                self.used_exact = True
                result = _exact(self.w, nodes, r, b)
            else:
                result = self._split(nodes, r, b)
        self.memo[memo_key] = result
        return result

    def _spend(self, attempts: int) -> bool:
        if self.attempts_left < attempts:
            self.attempts_left = 0
            return False
        self.attempts_left -= attempts
        return True

    def _join(self, a: tuple[int, ...], bset: tuple[int, ...], r: int, v: int,
              b: int) -> _Found | None:
        left = self.solve(a, r, b - 1)
        if left is None:
            return None
        right = self.solve(bset, v, b - 1)
        if right is None:
            return None
        return left[0] + right[0] + float(self.w[v, r]), left[1] + right[1] + ((v, r, b),)

    def _split(self, nodes: tuple[int, ...], r: int,
               b: int) -> _Found | None:
        # Generating candidates costs as much as trying one: both draw on the budget.
        if not self._spend(1):
            return None
        tried: set[tuple[tuple[int, ...], int]] = set()
        for a, bset, v in self._kl_candidates(nodes, r, b):
            if self.attempts_left <= 0:
                return None
            self.attempts_left -= 1
            tried.add((a, v))
            res = self._join(a, bset, r, v, b)
            if res is not None:
                self.used_kl = True
                return res
        if len(nodes) > SPLIT_SEARCH_LIMIT or not self._spend(SPLIT_SEARCH_COST):
            return None
        for a, bset, v in self._all_splits(nodes, r, b):
            if self.attempts_left <= 0:
                return None
            if (a, v) in tried:
                continue
            self.attempts_left -= 1
            res = self._join(a, bset, r, v, b)
            if res is not None:
                self.used_split_search = True
                return res
        return None

    # -- candidates --------------------------------------------------------------------

    def _half_sizes(self, m: int, b: int) -> list[int]:
        cap = 1 << (b - 1)
        sizes = sorted({(m + 1) // 2, m // 2})
        return [s for s in sizes if s <= cap and m - s <= cap]

    def _score(self, a: tuple[int, ...], bset: tuple[int, ...], r: int, v: int) -> float:
        ia, ib = np.asarray(a), np.asarray(bset)
        intra = self.w[np.ix_(ia, ia)].sum() / 2 + self.w[np.ix_(ib, ib)].sum() / 2
        return float(intra + self.w[r, v])

    def _viable(self, a: tuple[int, ...], bset: tuple[int, ...], r: int, v: int,
                b: int) -> bool:
        return (self.adj[r, v] and self.reachable(a, r, b - 1)
                and self.reachable(bset, v, b - 1))

    def _kl_candidates(self, nodes: tuple[int, ...], r: int,
                       b: int) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
        idx = np.asarray(nodes)
        sub = self.w[np.ix_(idx, idx)]
        ri = nodes.index(r)
        found: dict[tuple[tuple[int, ...], int], tuple[float, tuple[int, ...]]] = {}

        def add(in_a: np.ndarray, vi: int) -> None:
            a = self.sort(idx[in_a])
            bset = self.sort(idx[~in_a])
            v = int(idx[vi])
            if (a, v) not in found and self._viable(a, bset, r, v, b):
                found[(a, v)] = (self._score(a, bset, r, v), bset)

        partners = [int(j) for j in np.nonzero(sub[ri] > 0)[0]]
        # heaviest first; ties by the seeded order (nodes are already sorted by it)
        partners.sort(key=lambda j: -sub[ri, j])
        for size_a in self._half_sizes(len(nodes), b):
            # The proposal's rule: KL from the root alone, then its heaviest link across.
            grown = _grow(sub, size_a, ri, None)
            locked = np.zeros(len(nodes), dtype=bool)
            locked[ri] = True
            for in_a in _dedupe([_kl(sub, grown, locked), grown]):
                across = np.nonzero(~in_a & (sub[ri] > 0))[0]
                if len(across):
                    add(in_a, int(across[np.argmax(sub[ri, across])]))
            # Partner-locked KL: the join edge exists by construction.
            for vi in partners[:KL_PARTNERS]:
                grown = _grow(sub, size_a, ri, vi)
                locked2 = locked.copy()
                locked2[vi] = True
                for in_a in _dedupe([_kl(sub, grown, locked2), grown]):
                    add(in_a, vi)
        ranked = sorted(found.items(), key=lambda kv: -kv[1][0])
        return [(a, bset, v) for (a, v), (_, bset) in ranked]

    def _all_splits(self, nodes: tuple[int, ...], r: int,
                    b: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], int]]:
        """Every balanced bisection with a link from r across, both halves reachable from
        their roots in b − 1 steps, best-scored first (filtered and scored vectorised over
        all bisections; converted to node tuples only as the caller consumes them)."""
        m = len(nodes)
        idx = np.asarray(nodes)
        sub = self.w[np.ix_(idx, idx)]
        adj = (sub > 0).astype(np.float64)
        ri = nodes.index(r)
        rest = [i for i in range(m) if i != ri]
        sides, scores, partners = [], [], []
        for size_a in self._half_sizes(m, b):
            combos = np.array(list(combinations(rest, size_a - 1)), dtype=np.int64)
            in_a = np.zeros((len(combos), m), dtype=bool)
            in_a[:, ri] = True
            if combos.size:
                in_a[np.arange(len(combos))[:, None], combos] = True
            fa = in_a.astype(np.float64)
            fb = 1 - fa
            # einsum, not @: these small products must not wake a multithreaded BLAS
            intra = 0.5 * ((np.einsum("ki,ij->kj", fa, sub) * fa).sum(axis=1)
                           + (np.einsum("ki,ij->kj", fb, sub) * fb).sum(axis=1))
            ok_a = _batch_reach(adj, in_a, np.full(len(in_a), ri), b - 1)
            for vi in np.nonzero(sub[ri] > 0)[0]:
                rows = np.nonzero(ok_a & ~in_a[:, vi])[0]
                if not len(rows):
                    continue
                rows = rows[_batch_reach(adj, ~in_a[rows], np.full(len(rows), vi), b - 1)]
                sides.append(in_a[rows])
                scores.append(intra[rows] + sub[ri, vi])
                partners.append(np.full(len(rows), vi))
        if not sides:
            return
        side = np.concatenate(sides)
        partner = np.concatenate(partners)
        # stable: equal scores keep the enumeration order, which follows the seeded order
        for k in np.argsort(-np.concatenate(scores), kind="stable"):
            yield self.sort(idx[side[k]]), self.sort(idx[~side[k]]), int(idx[partner[k]])


def _batch_reach(adj: np.ndarray, members: np.ndarray, roots: np.ndarray,
                 steps: int) -> np.ndarray:
    """For each row of ``members`` (a node subset): are all its nodes within ``steps`` hops
    of that row's root, over links inside the subset?"""
    seen = np.zeros_like(members)
    seen[np.arange(len(roots)), roots] = True
    for _ in range(steps):
        grown = (np.einsum("ki,ij->kj", seen.astype(np.float64), adj) > 0) & members
        if np.array_equal(grown | seen, seen):
            break
        seen |= grown
    return (seen == members).all(axis=1)


def _dedupe(parts: list[np.ndarray]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for p in parts:
        if not any(np.array_equal(p, q) for q in out):
            out.append(p)
    return out


def _grow(w: np.ndarray, size_a: int, ri: int, vi: int | None) -> np.ndarray:
    """Initial bisection: grow side A from ``ri`` (and side B from ``vi``, if given) by
    repeatedly adding the unassigned node most strongly linked to the growing side."""
    m = w.shape[0]
    size_b = m - size_a
    in_a = np.zeros(m, dtype=bool)
    in_b = np.zeros(m, dtype=bool)
    in_a[ri] = True
    if vi is not None:
        in_b[vi] = True
    while in_a.sum() < size_a and (vi is None or in_b.sum() < size_b):
        grow_a = vi is None or in_a.sum() * size_b <= in_b.sum() * size_a
        side = in_a if grow_a else in_b
        free = ~(in_a | in_b)
        pull = np.where(free, w[:, side].sum(axis=1), -1.0)
        side[int(np.argmax(pull))] = True
    if in_a.sum() < size_a:
        in_a |= ~(in_a | in_b)
    return in_a


def _kl(w: np.ndarray, in_a: np.ndarray, locked: np.ndarray) -> np.ndarray:
    """Kernighan-Lin refinement of a bisection: swap pairs to maximise the weight inside the
    two sides (minimise the cut), keeping the sizes and the ``locked`` nodes in place."""
    in_a = in_a.copy()
    for _ in range(KL_MAX_PASSES):
        to_a = w[:, in_a].sum(axis=1)
        to_b = w[:, ~in_a].sum(axis=1)
        d = np.where(in_a, to_b - to_a, to_a - to_b)  # external minus internal
        free = ~locked
        gains: list[float] = []
        swaps: list[tuple[int, int]] = []
        while True:
            fa = np.nonzero(in_a & free)[0]
            fb = np.nonzero(~in_a & free)[0]
            if not len(fa) or not len(fb):
                break
            g = d[fa][:, None] + d[fb][None, :] - 2 * w[np.ix_(fa, fb)]
            i, j = np.unravel_index(int(np.argmax(g)), g.shape)
            x, y = int(fa[i]), int(fb[j])
            gains.append(float(g[i, j]))
            swaps.append((x, y))
            free[x] = free[y] = False
            d += np.where(in_a, 2 * (w[:, x] - w[:, y]), 2 * (w[:, y] - w[:, x]))
        if not gains:
            break
        total = np.cumsum(gains)
        k = int(np.argmax(total))
        if total[k] <= _EPS:
            break
        for x, y in swaps[:k + 1]:
            in_a[x], in_a[y] = False, True
    return in_a


def _exact(w: np.ndarray, nodes: tuple[int, ...], r: int,
           b: int) -> _Found | None:
    """Maximum-weight binary tree of ``nodes`` rooted at ``r`` in at most ``b`` steps, by a
    dynamic programme over subsets: f(S, x, t) = best of (x idles in step t) and
    max over S = A ⊔ B, x ∈ A, v ∈ B of f(A, x, t−1) + w[v, x] + f(B, v, t−1)."""
    m = len(nodes)
    lw = w[np.ix_(nodes, nodes)].tolist()
    nbrs = [[j for j in range(m) if lw[i][j] > 0] for i in range(m)]
    memo: dict[tuple[int, int, int], _Found | None] = {}

    def f(mask: int, x: int, t: int) -> _Found | None:
        size = mask.bit_count()
        if size == 1:
            return 0.0, ()
        if size > (1 << t):
            return None
        k = (mask, x, t)
        if k in memo:
            return memo[k]
        cap = 1 << (t - 1)
        best = f(mask, x, t - 1) if size <= cap else None
        rest = mask & ~(1 << x)
        linked = 0
        for j in nbrs[x]:
            linked |= 1 << j
        sub = rest
        while sub:
            nb = sub.bit_count()
            if nb <= cap and size - nb <= cap and sub & linked:
                left = f(mask ^ sub, x, t - 1)
                if left is not None:
                    bits = sub & linked
                    while bits:
                        v = (bits & -bits).bit_length() - 1
                        bits &= bits - 1
                        right = f(sub, v, t - 1)
                        if right is not None:
                            total = left[0] + right[0] + lw[v][x]
                            if best is None or total > best[0] + _EPS:
                                best = (total, left[1] + right[1] + ((v, x, t),))
            sub = (sub - 1) & rest
        memo[k] = best
        return best

    res = f((1 << m) - 1, nodes.index(r), b)
    if res is None:
        return None
    return res[0], tuple((nodes[c], nodes[p], s) for c, p, s in res[1])


def _fallback(w: np.ndarray, root: int, key: np.ndarray) -> tuple[Edge, ...]:
    """Always-valid tree over W's links: breadth-first layers from the root, each node joining
    the neighbour one hop nearer with the fewest children so far (then the heaviest link),
    then the optimal step assignment for that tree (a parent takes its children in order of
    readiness, one per step)."""
    n = w.shape[0]
    dist = np.full(n, -1)
    dist[root] = 0
    layer = [root]
    order = [root]
    while layer:
        nxt = sorted({int(j) for i in layer for j in np.nonzero(w[i] > 0)[0] if dist[j] < 0},
                     key=lambda j: key[j])
        for j in nxt:
            dist[j] = dist[layer[0]] + 1
        order += nxt
        layer = nxt
    parent = [-1] * n
    nkids = [0] * n
    for v in order[1:]:
        cands = [int(u) for u in np.nonzero(w[v] > 0)[0] if dist[u] == dist[v] - 1]
        p = min(cands, key=lambda u: (nkids[u], -w[v, u], key[u]))
        parent[v] = p
        nkids[p] += 1
    kids: list[list[int]] = [[] for _ in range(n)]
    for v in order[1:]:
        kids[parent[v]].append(v)
    ready = [0] * n  # step in which the node has received its last child
    edges = []
    for v in reversed(order):
        t = 0
        for c in sorted(kids[v], key=lambda c: (ready[c], key[c])):
            t = max(t, ready[c]) + 1
            edges.append((c, v, t))
        ready[v] = t
    return tuple(edges)


# ---------------------------------------------------------------------------------------
# public API


def _checked(weights: Any) -> np.ndarray:
    w = validate_links(weights)
    if not is_connected(w):
        raise ValueError("link matrix is disconnected: no spanning reduction tree exists "
                         "(some ranks share no chain of links with the others)")
    return w


def binary_tree(weights: Any, root: int = 0, *, seed: int = 0) -> Tree:
    """A balanced binary reduction tree of maximum weight rooted at ``root`` (see module
    docstring). Raises ValueError for an invalid or disconnected matrix or a bad root."""
    w = _checked(weights)
    n = w.shape[0]
    if not 0 <= root < n:
        raise ValueError(f"root {root} out of range for {n} nodes")
    return _build(w, root, seed)


def _build(w: np.ndarray, root: int, seed: int) -> Tree:
    n = w.shape[0]
    builder = _Builder(w, seed)
    found = builder.solve(builder.sort(range(n)), root, balanced_depth(n))
    if found is None:
        return Tree.from_edges(n, root, _fallback(w, root, builder.key), "fallback")
    if builder.used_split_search:
        method = "split-search"
    elif builder.used_kl:
        method = "kl"
    else:
        method = "exact" if n > 1 else "trivial"
    return Tree.from_edges(n, root, found[1], method)


def link_penalty(penalty: float | None = None, env: Mapping[str, str] | None = None) -> float:
    """The link-usage penalty: ``penalty`` if given, else ``BMLMPI_TREE_LINK_PENALTY``, else
    0.7. Must lie in (0, 1]."""
    if penalty is None:
        return config.get("BMLMPI_TREE_LINK_PENALTY", env)  # its parser checks the range
    if not (0 < penalty <= 1) or math.isnan(penalty):
        raise ValueError(f"penalty must be in (0, 1], got {penalty}")
    return float(penalty)


def multi_trees(weights: Any, penalty: float | None = None, *, seed: int = 0) -> tuple[Tree, ...]:
    """One tree per root 0..n−1, built in order; each multiplies the weights of the links it
    used by ``penalty`` (default ``BMLMPI_TREE_LINK_PENALTY`` or 0.7) before the next.

    Link-class floor: each tree is searched on the links whose *original* weight is at least
    the highest threshold (one of W's distinct values) at which a balanced tree is still
    found; the penalised weights only rank links above that floor. Without it a single
    NVLink used twice (2 · 0.7² = 0.98) would lose to an idle PCIe path (1), although
    half of 25 GB/s still beats 10 GB/s; with it the p3.16xlarge trees stay on NVLinks and
    the penalty spreads them over the NVLinks. With only one link class it changes nothing;
    a matrix with more than ``MAX_LINK_CLASSES`` distinct weights is a continuum, not
    classes, and gets no floor. When the penalised weights lead the search to no balanced
    tree for a root, that root's tree is searched on the unpenalised weights before falling
    back to a deeper tree.
    """
    w0 = _checked(weights)
    p = link_penalty(penalty)
    n = w0.shape[0]
    levels = np.unique(w0[w0 > 0])[::-1]  # distinct link weights, strongest first
    if len(levels) > MAX_LINK_CLASSES:
        levels = levels[-1:]  # a continuum of weights, not classes: no floor
    current = w0.copy()
    trees = []
    for root in range(n):
        tree = _build_floored(w0, current, levels, root, seed)
        trees.append(tree)
        for c, q in tree.edges:
            current[c, q] *= p
            current[q, c] *= p
    return tuple(trees)


def _build_floored(w0: np.ndarray, current: np.ndarray, levels: np.ndarray, root: int,
                   seed: int) -> Tree:
    """The tree on the strongest link classes that admit a balanced tree: a binary search
    over the floor (a higher floor keeps a subset of the links, so balance is monotone up to
    the heuristic's reach). If no floor gives a balanced tree under the penalised weights,
    the unpenalised weights are tried (same links, and the search sometimes finds on them
    what it missed on the penalised ones); the last resort is the all-links result."""
    lo, hi = 0, len(levels) - 1  # candidates levels[lo..hi]; levels[-1] keeps every link
    best: Tree | None = None
    every_link: Tree | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        keep = w0 >= levels[mid]
        tree = None
        if is_connected(np.where(keep, 1.0, 0.0)):
            tree = _build(np.where(keep, current, 0.0), root, seed)
            if mid == len(levels) - 1:
                every_link = tree
        if tree is not None and tree.balanced:
            best, hi = tree, mid - 1
        else:
            lo = mid + 1
    if best is not None:
        return best
    retry = _build(w0, root, seed)
    if retry.balanced:
        return retry
    return every_link if every_link is not None else _build(current, root, seed)


def link_use(trees: Sequence[Tree]) -> dict[tuple[int, int], int]:
    """How many of ``trees`` use each undirected link (i < j)."""
    out: dict[tuple[int, int], int] = {}
    for t in trees:
        for c, p in t.edges:
            k = (min(c, p), max(c, p))
            out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def exhaustive_best_tree(weights: Any, root: int = 0) -> Tree | None:
    """The maximum-weight balanced binary tree by brute force, or None if W has none.

    Independent of :func:`binary_tree`'s search, for checking it: it enumerates every
    sequence of ⌈log2 n⌉ steps, each a set of disjoint sender→receiver pairs over W's links
    among the nodes still holding a partial sum (the root never sends), keeping only
    sequences that leave at most 2^(steps left) partial sums after each step. n ≤ 8.
    """
    w = _checked(weights)
    n = w.shape[0]
    if n > EXACT_LIMIT:
        raise ValueError(f"exhaustive_best_tree is for n <= {EXACT_LIMIT}, got {n}")
    if not 0 <= root < n:
        raise ValueError(f"root {root} out of range for {n} nodes")
    depth = balanced_depth(n)
    best: list[Any] = [None, ()]

    def matchings(active: list[int]) -> Any:
        """Every set of disjoint (sender, receiver) pairs over links among ``active``."""
        if not active:
            yield ()
            return
        x, rest = active[0], active[1:]
        yield from matchings(rest)  # x idles
        for i, y in enumerate(rest):
            if w[x, y] <= 0:
                continue
            remaining = rest[:i] + rest[i + 1:]
            for tail in matchings(remaining):
                if x != root:
                    yield ((x, y),) + tail
                if y != root:
                    yield ((y, x),) + tail

    def walk(active: list[int], step: int, weight: float, edges: tuple[Edge, ...]) -> None:
        if step > depth:
            if active == [root] and (best[0] is None or weight > best[0] + _EPS):
                best[0], best[1] = weight, edges
            return
        limit = 1 << (depth - step)
        for pairs in matchings(active):
            if len(active) - len(pairs) > limit:
                continue
            senders = {s for s, _ in pairs}
            walk([a for a in active if a not in senders], step + 1,
                 weight + sum(w[s, q] for s, q in pairs),
                 edges + tuple((s, q, step) for s, q in pairs))

    walk(list(range(n)), 1, 0.0, ())
    if best[0] is None:
        return None
    return Tree.from_edges(n, root, best[1], "exhaustive")


__all__ = [
    "DEFAULT_PENALTY", "EXACT_LIMIT", "Tree", "balanced_depth", "binary_tree",
    "exhaustive_best_tree", "link_penalty", "link_use", "multi_trees",
]
