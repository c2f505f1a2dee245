"""Tree-generation time of bmlmpi.topology.trees for 8..64 nodes.

    python perf/trees/bench_trees.py            # prints a Markdown report to stdout

For each link matrix: the time of one ``binary_tree`` (median and max over up to 8 roots), the
time of the whole ``multi_trees`` set (n trees), both as CPU time of this process (what the
generation costs, robust to other users of a shared machine) and, for the set, wall time;
how the trees were found (exact / kl / split-search / fallback), whether they are balanced
(depth ⌈log2 n⌉), and the weight of the root-0 tree. Single-threaded pure Python + numpy;
every rank runs this once per communicator and link matrix, so it is set-up cost, not
per-allreduce cost.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections import Counter

import numpy as np

from bmlmpi.topology.links import bcube_links, flat_links, is_connected, preset
from bmlmpi.topology.trees import balanced_depth, binary_tree, link_use, multi_trees


def random_links(n: int, degree: float, seed: int) -> np.ndarray:
    """A connected random graph with about ``degree`` links per node, weights 1..3."""
    rng = np.random.default_rng(seed)
    while True:
        a = np.triu(rng.random((n, n)) < degree / (n - 1), 1)
        w = np.where(a, rng.integers(1, 4, (n, n)), 0).astype(float)
        w = w + w.T
        if is_connected(w):
            return w


def cases() -> list[tuple[str, np.ndarray]]:
    out = [("p3.16xlarge", preset("p3.16xlarge"))]
    for n, shapes in [(8, [(2, 2, 2)]), (16, [(4, 4), (2, 2, 2, 2)]),
                      (32, [(4, 8), (2, 2, 2, 2, 2)]), (64, [(4, 4, 4), (8, 8)])]:
        for shape in shapes:
            out.append(("bcube " + "x".join(map(str, shape)), bcube_links(shape)))
        out.append((f"flat {n}", flat_links(n)))
        out.append((f"random {n}, dense (p=0.5)", random_links(n, 0.5 * (n - 1), seed=n)))
        out.append((f"random {n}, sparse (deg 4)", random_links(n, 4.0, seed=n + 1)))
    return out


def main() -> None:
    load0 = os.getloadavg()
    print("# Tree generation time (bmlmpi.topology.trees)\n")
    print(f"- machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.platform()}")
    print(f"- Python {sys.version.split()[0]}, numpy {np.__version__}")
    print(f"- load average at start: {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}")
    print("- command: `python perf/trees/bench_trees.py`\n")
    print("| links | n | one tree, median CPU ms | one tree, max CPU ms | all n trees, CPU s | "
          "all n trees, wall s | methods | balanced | weight (root 0) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, w in cases():
        n = len(w)
        roots = sorted({int(r) for r in np.linspace(0, n - 1, min(n, 8))})
        times, methods, trees = [], Counter(), []
        for r in roots:
            t0 = time.process_time()
            t = binary_tree(w, r)
            times.append(time.process_time() - t0)
            trees.append(t)
        t0, c0 = time.perf_counter(), time.process_time()
        mts = multi_trees(w)
        multi_cpu, multi_wall = time.process_time() - c0, time.perf_counter() - t0
        methods.update(t.method for t in mts)
        balanced = sum(t.depth == balanced_depth(n) for t in mts)
        print(f"| {name} | {n} | {statistics.median(times) * 1e3:.1f} | "
              f"{max(times) * 1e3:.1f} | {multi_cpu:.2f} | {multi_wall:.2f} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(methods.items()))} | "
              f"{balanced}/{n} | {trees[0].weight(w):g} |")
        sys.stdout.flush()
    p3 = preset("p3.16xlarge")
    use = link_use(multi_trees(p3))
    print("\np3.16xlarge, 8 trees (penalty 0.7): uses per link (i, j): weight × uses")
    print(", ".join(f"({i},{j}): {p3[i, j]:g}×{k}" for (i, j), k in use.items()))
    load1 = os.getloadavg()
    print(f"\n- load average at end: {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")


if __name__ == "__main__":
    main()
