import os
import subprocess
import sys

import numpy as np
import pytest

from bmlmpi.topology.links import bcube_links, flat_links, is_connected, preset
from bmlmpi.topology.trees import (
    Tree,
    balanced_depth,
    binary_tree,
    exhaustive_best_tree,
    link_penalty,
    link_use,
    multi_trees,
)

P3 = preset("p3.16xlarge")


def check_tree(tree: Tree, w: np.ndarray, root: int) -> None:
    """The module's definition, checked from the raw arrays: spanning, rooted at ``root``,
    at most one edge per node per step, a node sends after all its children, every edge a
    link of ``w``, depth = the number of steps."""
    n = len(w)
    assert tree.size == n and tree.root == root
    assert tree.parent[root] == -1 and tree.send_step[root] == 0
    for v in range(n):  # spanning: every parent chain ends at the root
        seen, u = set(), v
        while u != root:
            assert u not in seen, f"cycle through {u}"
            seen.add(u)
            u = tree.parent[u]
    busy: dict[tuple[int, int], int] = {}
    for v in range(n):
        if v == root:
            continue
        p, s = tree.parent[v], tree.send_step[v]
        assert w[v, p] > 0, f"edge {v}-{p} is not a link"
        for node in (v, p):
            assert (node, s) not in busy, f"node {node} has two edges in step {s}"
            busy[(node, s)] = 1
        if p != root:
            assert s < tree.send_step[p], f"{p} sends before its child {v}"
    assert tree.depth == max(tree.send_step)
    assert len(tree.edges) == n - 1


def random_connected(n: int, density: float, rng, integer: bool = True) -> np.ndarray:
    while True:
        a = np.triu(rng.random((n, n)) < density, 1)
        vals = rng.integers(1, 4, (n, n)) if integer else rng.random((n, n)) + 0.05
        w = np.where(a, vals, 0).astype(float)
        w = w + w.T
        if is_connected(w):
            return w


def planted(n: int, extra: int, rng) -> tuple[np.ndarray, int]:
    """A sparse graph holding a balanced tree (random recursive bisection) plus ``extra``
    random links; returns it and the planted tree's root."""
    w = np.zeros((n, n))

    def build(nodes):
        if len(nodes) == 1:
            return nodes[0]
        h = (len(nodes) + 1) // 2
        a, b = build(nodes[:h]), build(nodes[h:])
        w[a, b] = w[b, a] = rng.integers(1, 4)
        return a if rng.random() < 0.5 else b

    root = int(build([int(x) for x in rng.permutation(n)]))
    for _ in range(extra):
        i, j = rng.integers(n, size=2)
        if i != j:
            w[i, j] = w[j, i] = rng.integers(1, 4)
    return w, root


# --- p3.16xlarge -------------------------------------------------------------------------


@pytest.mark.parametrize("root", range(8))
def test_p3_single_tree_is_optimal_and_on_nvlink(root):
    t = binary_tree(P3, root)
    check_tree(t, P3, root)
    assert t.depth == 3 and t.balanced
    assert all(P3[c, p] >= 2 for c, p in t.edges)
    best = exhaustive_best_tree(P3, root)
    check_tree(best, P3, root)
    assert t.weight(P3) == pytest.approx(best.weight(P3))


def test_p3_multi_trees_use_only_nvlinks_and_penalty_spreads_them():
    trees = multi_trees(P3)
    assert [t.root for t in trees] == list(range(8))
    for r, t in enumerate(trees):
        check_tree(t, P3, r)
        assert t.depth == 3
    use = link_use(trees)
    nvlinks = {(i, j) for i in range(8) for j in range(i + 1, 8) if P3[i, j] >= 2}
    assert set(use) == nvlinks  # only NVLinks, and all 16 of them
    unpenalised = link_use(multi_trees(P3, penalty=1.0))
    assert len(use) > len(unpenalised)
    assert max(use.values()) < max(unpenalised.values())
    print("p3.16xlarge link use (penalty 0.7):", use)
    print("p3.16xlarge link use (penalty 1.0):", unpenalised)


def test_penalty_from_env(monkeypatch):
    monkeypatch.delenv("BMLMPI_TREE_LINK_PENALTY", raising=False)
    assert link_penalty() == 0.7
    monkeypatch.setenv("BMLMPI_TREE_LINK_PENALTY", "0.5")
    assert link_penalty() == 0.5
    assert link_use(multi_trees(P3)) == link_use(multi_trees(P3, penalty=0.5))
    monkeypatch.setenv("BMLMPI_TREE_LINK_PENALTY", "1.5")
    with pytest.raises(ValueError, match="BMLMPI_TREE_LINK_PENALTY"):
        multi_trees(P3)
    monkeypatch.setenv("BMLMPI_TREE_LINK_PENALTY", "x")
    with pytest.raises(ValueError, match="not a number"):
        link_penalty()
    with pytest.raises(ValueError):
        link_penalty(0.0)


# --- BCube and flat graphs ----------------------------------------------------------------


@pytest.mark.parametrize("radices", [(2, 2, 2), (3, 3), (4, 4), (2, 3), (3, 2, 2), (2, 2, 2, 2),
                                     (3, 3, 3)])
def test_bcube_trees_are_balanced_on_bcube_links(radices):
    w = bcube_links(radices)
    n = len(w)
    for root in sorted({0, n // 2, n - 1}):
        t = binary_tree(w, root)
        check_tree(t, w, root)
        assert t.depth == balanced_depth(n)
        if n <= 8:
            assert t.weight(w) == pytest.approx(exhaustive_best_tree(w, root).weight(w))


@pytest.mark.parametrize("radices", [(2, 2, 2), (3, 3), (4, 4)])
def test_bcube_multi_trees(radices):
    w = bcube_links(radices)
    trees = multi_trees(w)
    for r, t in enumerate(trees):
        check_tree(t, w, r)
        assert t.balanced


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 9, 16, 17, 33])
def test_flat_trees(n):
    w = flat_links(n)
    t = binary_tree(w, n - 1)
    check_tree(t, w, n - 1)
    assert t.depth == balanced_depth(n)


# --- random graphs ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_random_small_graphs_match_exhaustive_optimum(seed):
    rng = np.random.default_rng(seed)
    for trial in range(6):
        n = int(rng.integers(2, 9))
        w = random_connected(n, [0.3, 0.5, 0.8, 1.0][trial % 4], rng, integer=seed % 2 == 0)
        root = int(rng.integers(n))
        t = binary_tree(w, root)
        check_tree(t, w, root)
        best = exhaustive_best_tree(w, root)
        if best is None:  # too sparse for a balanced tree: a deeper one over W's links
            assert t.depth > balanced_depth(n) and t.method == "fallback"
        else:
            check_tree(best, w, root)
            assert t.depth == balanced_depth(n)
            assert t.weight(w) == pytest.approx(best.weight(w))


@pytest.mark.parametrize("seed", range(6))
def test_random_planted_graphs_up_to_16_nodes_get_balanced_trees(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(5):
        n = int(rng.integers(9, 17))
        w, root = planted(n, int(rng.integers(0, n)), rng)
        t = binary_tree(w, root)
        check_tree(t, w, root)
        assert t.depth == balanced_depth(n)


@pytest.mark.parametrize("seed", range(3))
def test_random_sparse_graphs_up_to_16_nodes_give_valid_trees(seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(3):
        n = int(rng.integers(9, 17))
        w = random_connected(n, 3.0 / n, rng)
        root = int(rng.integers(n))
        t = binary_tree(w, root)
        check_tree(t, w, root)
        assert t.depth >= balanced_depth(n)


def test_path_graph_is_too_sparse_for_a_balanced_tree():
    n = 8
    w = np.zeros((n, n))
    for i in range(n - 1):
        w[i, i + 1] = w[i + 1, i] = 1
    assert exhaustive_best_tree(w, 0) is None
    t = binary_tree(w, 0)
    check_tree(t, w, 0)
    assert t.method == "fallback" and t.depth == n - 1  # a path from its end is sequential
    t = binary_tree(w, 3)
    check_tree(t, w, 3)
    assert t.depth == 4  # from the middle: the longer arm, 4 hops


# --- errors, determinism, small cases -----------------------------------------------------


def test_disconnected_matrix_is_an_error():
    w = np.zeros((4, 4))
    w[0, 1] = w[1, 0] = w[2, 3] = w[3, 2] = 1
    with pytest.raises(ValueError, match="disconnected"):
        binary_tree(w, 0)
    with pytest.raises(ValueError, match="disconnected"):
        multi_trees(w)


def test_bad_inputs():
    with pytest.raises(ValueError, match="root"):
        binary_tree(P3, 8)
    with pytest.raises(ValueError, match="symmetric"):
        binary_tree([[0, 1], [2, 0]], 0)
    with pytest.raises(ValueError, match="n <= 8"):
        exhaustive_best_tree(flat_links(9), 0)


def test_tree_rejects_invalid_structures():
    with pytest.raises(ValueError, match="twice in one step"):
        Tree(0, (-1, 0, 0), (0, 1, 1))
    with pytest.raises(ValueError, match="before its child"):
        Tree(0, (-1, 0, 1), (0, 1, 1))
    with pytest.raises(ValueError, match="root"):
        Tree(0, (1, -1), (1, 0))
    with pytest.raises(ValueError, match="before its child"):  # 2 receives and sends in step 1
        Tree(0, (-1, 0, 0, 2), (0, 2, 1, 1))
    t = Tree(0, (-1, 0, 0, 2), (0, 1, 2, 1))
    assert t.depth == 2 and t.children[0] == (1, 2) and t.levels == (((1, 0), (3, 2)), ((2, 0),))


def test_one_and_two_nodes():
    t = binary_tree(np.zeros((1, 1)), 0)
    assert t.depth == 0 and t.edges == ()
    t = binary_tree(flat_links(2), 1)
    assert t.parent == (1, -1) and t.send_step == (1, 0)


def test_deterministic_in_process_and_across_processes():
    rng = np.random.default_rng(7)
    w = random_connected(20, 0.4, rng, integer=False)
    a, b = multi_trees(w), multi_trees(w)
    assert a == b
    assert binary_tree(w, 3) == binary_tree(w, 3)
    code = ("import numpy as np, sys; from bmlmpi.topology.trees import binary_tree;"
            "w = np.array(eval(sys.stdin.read()));"
            "t = binary_tree(w, 3); print(t.parent, t.send_step)")
    out = subprocess.run([sys.executable, "-c", code], input=repr(w.tolist()), text=True,
                         capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.returncode == 0, out.stderr
    t = binary_tree(w, 3)
    assert out.stdout.strip() == f"{t.parent} {t.send_step}"
