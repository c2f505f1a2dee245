"""The optimum of the timed-tree recovery family by mixed-integer programming (needs scipy).

    python perf/paper/recovery_milp.py                  # seed 001's case, T = 2, 3, 4
    python perf/paper/recovery_milp.py 4x4 0 5 --steps 3 --time-limit 300

An offline check of :mod:`bmlmpi.ft.recovery_search`, whose search is a heuristic:
for one cube, dead set and number T of reduce steps, the exact optimum of the family it
searches (every piece reduced along a spanning tree of the survivors, every survivor sending
once, to a live neighbour, in a step after its children; allgather mirrored) on the cost
model (Σ over steps of the busiest NIC link). Binary x[p,v,u,t]: in piece p survivor v sends
to u in reduce step t; one send per non-owner; a send of v into u at t needs u to send after
t; z_t ≥ every link's load in step t; minimise 2·Σ z_t (T_C, one piece each). scipy's HiGHS
solves it; not a dependency of bmlmpi, and the runtime never calls it.

Results (HiGHS in scipy 1.17, on the shared development machine), in T_C:

* BCube(3,2) without [0,0]: 16 at T = 2 and T = 3 (what the runtime's search finds and runs,
  in 4 steps); 14 at T = 4, the lower bound of
  :func:`~bmlmpi.ft.recovery_search.lower_bounds` — the family reaches the bound with
  8 steps, a packing the search does not find;
* BCube(3,2) without [0,0] and [1,1]: 12 at T = 3 and 4 (the bound; the search finds 14);
* BCube(4,2) without [0,0]: 30 at T = 2, as the search; T = 3 not solved in 120 s (the
  search reaches the bound, 28, there).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bmlmpi.ft.recovery_search import live_neighbours  # noqa: E402
from bmlmpi.topology.bcube import BCube, parse_shape  # noqa: E402


def family_optimum(radices: tuple[int, ...], dead: set[int], steps: int,
                   time_limit: float = 120.0) -> dict:
    """Solve the MILP; ``t_c`` is the optimum (or best found), ``bound`` HiGHS's dual bound."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    cube = BCube(radices)
    k = cube.levels
    live = frozenset(range(cube.size)) - dead
    nbrs = {a: live_neighbours(cube, live, a) for a in sorted(live)}
    pieces = [o for _ in range(k) for o in sorted(live)]
    var: dict[tuple[int, int, int, int], int] = {}
    for p, o in enumerate(pieces):
        for v in sorted(live - {o}):
            for u, _ in nbrs[v]:
                for t in range(steps):
                    var[(p, v, u, t)] = len(var)
    nz = len(var)
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add(coefs: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for j, c in coefs:
            rows.append(r)
            cols.append(j)
            vals.append(c)
        lo.append(low)
        hi.append(high)

    for p, o in enumerate(pieces):
        for v in sorted(live - {o}):
            add([(var[(p, v, u, t)], 1) for u, _ in nbrs[v] for t in range(steps)], 1, 1)
            for u, _ in nbrs[v]:
                if u == o:
                    continue
                for t in range(steps):
                    later = [(var[(p, u, w, s)], -1) for w, _ in nbrs[u]
                             for s in range(t + 1, steps)]
                    add([(var[(p, v, u, t)], 1), *later], -np.inf, 0)
    for t in range(steps):
        for a in sorted(live):
            for lv in range(k):
                out = [(j, 1) for (p, v, u, s), j in var.items()
                       if s == t and v == a and cube.digit(v, lv) != cube.digit(u, lv)]
                into = [(j, 1) for (p, v, u, s), j in var.items()
                        if s == t and u == a and cube.digit(v, lv) != cube.digit(u, lv)]
                for coefs in (out, into):
                    if coefs:
                        add([*coefs, (nz + t, -1)], -np.inf, 0)
    a_mat = coo_matrix((vals, (rows, cols)), shape=(len(lo), nz + steps)).tocsr()
    cost = np.zeros(nz + steps)
    cost[nz:] = 2
    integral = np.ones(nz + steps)
    integral[nz:] = 0
    upper = np.ones(nz + steps)
    upper[nz:] = np.inf
    t0 = time.perf_counter()
    res = milp(cost, constraints=LinearConstraint(a_mat, lo, hi), integrality=integral,
               bounds=Bounds(np.zeros(nz + steps), upper),
               options={"time_limit": time_limit, "disp": False})
    return {"steps": steps, "status": res.message, "optimal": res.status == 0,
            "t_c": None if res.x is None else round(res.fun),
            "bound": getattr(res, "mip_dual_bound", None),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="?", default="3x3")
    ap.add_argument("dead", nargs="*", type=int, default=[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args(argv)
    radices = parse_shape(args.shape)
    for steps in args.steps:
        r = family_optimum(radices, set(args.dead), steps, args.time_limit)
        print(f"BCube {args.shape} without {sorted(args.dead)}, T = {steps}: "
              f"{r['t_c']} T_C ({'optimal' if r['optimal'] else r['status']}; "
              f"bound {r['bound']}; {r['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
