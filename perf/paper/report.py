"""Reproduce the BML paper's analysis from bmlmpi's own schedules, priced by the cost model.

    python perf/paper/report.py            # writes perf/paper/REPORT.md and, with matplotlib
                                           # (the ``plot`` extra), redraws perf/paper/*.png

Every number in the report is computed here from the schedules the executor runs
(:mod:`bmlmpi.schedules`) priced on link graphs (:mod:`bmlmpi.model`); the paper's values are
the formulas and statements of its text, printed beside ours. Sources:
``shared/seeds/000_c269322a980f2064.txt`` (the paper), ``001_7fe0ff36a62447ab.txt`` (slide
notes carrying Table II), ``003_c9eea3ecac030166.txt`` (the MXNet tree proposal).

The text is deterministic and does not depend on matplotlib: its Plots section names the
committed PNGs (:data:`PLOTS`) whether or not this run could redraw them, and
``tests/unit/test_paper_report.py`` holds the committed REPORT.md equal to :func:`report_text`.
"""

from __future__ import annotations

import argparse
import sys
import time
from fractions import Fraction as F
from pathlib import Path

import numpy as np

from bmlmpi.model import (
    BCubeNetwork,
    Calibration,
    FatTree,
    LinkMatrixNetwork,
    crossover,
    estimate,
    fat_tree_groups,
    price,
    price_symmetric,
)
from bmlmpi.model.estimate import algorithm_cost
from bmlmpi.schedules.bml import bml_schedule, bml_schedules
from bmlmpi.schedules.ps import ps_schedule, ps_schedules
from bmlmpi.schedules.ring import ring_schedule, ring_schedules
from bmlmpi.topology.links import preset
from bmlmpi.topology.trees import binary_tree, multi_trees

HERE = Path(__file__).resolve().parent

#: BCube shapes of Table II's rows: the paper's testbed, Fig. 5's two sizes, a few others,
#: and BCube(16,4), the paper's 65,536-server example.
TABLE_SHAPES = [(3, 2), (4, 2), (2, 4), (8, 2), (4, 3), (32, 2), (16, 4)]
FULL_PRICING_MAX = 64   # price every rank's schedule up to here; by symmetry above
RING_MAX = 1024         # a ring schedule has 2(N-1) steps: skip it beyond this

# p3.16xlarge, for the MXNet trees: the reference link is one NVLink, 25 GB/s.
P3_BETA = 1 / 25e9      # seconds per byte over one NVLink
P3_ALPHA = 10e-6        # assumed per-step latency (a peer copy's launch and completion)
P3_OVERHEADS = (0.0, 5e-6, 20e-6, 100e-6)   # assumed per-message costs to show

#: The plots :func:`plots` draws, in the report's order; committed beside REPORT.md.
PLOTS = ("fig5.png", "table2.png", "trees_p3.png")


def frac(x: F | float, digits: int = 4) -> str:
    """``a/b (0.xxxx)`` for a fraction, the decimal for a float."""
    if isinstance(x, F):
        if x.denominator == 1:
            return str(x.numerator)
        return f"{x.numerator}/{x.denominator} ({float(x):.{digits}f})"
    return f"{x:.{digits}f}"


def mark(ours: F, paper: F | None) -> str:
    if paper is None:
        return ""
    return "=" if ours == paper else "≠"


# -- Table II ------------------------------------------------------------------------------------

def table_ii() -> list[dict]:
    rows = []
    for n, k in TABLE_SHAPES:
        size, shape = n ** k, (n,) * k
        count = k * size  # one element per piece: exact fractions
        full = size <= FULL_PRICING_MAX
        ft = FatTree(size)
        bcube = BCubeNetwork(shape)
        t0 = time.perf_counter()
        if full:
            ps = price(ps_schedules(size, count), ft).t_f
            bml = price(bml_schedules(size, count, shape), bcube).t_f
            ring = price(ring_schedules(size, count), ft).t_f
        else:
            ps = price_symmetric(ps_schedule(0, size, count), ft).t_f
            bml = price_symmetric(bml_schedule(0, size, count, shape), bcube).t_f
            ring = (price_symmetric(ring_schedule(0, size, count), ft).t_f
                    if size <= RING_MAX else None)
        rows.append({
            "n": n, "k": k, "size": size, "ps": ps, "ring": ring, "bml": bml,
            "paper_ps": F(2 * (size - 1), size), "paper_ring": F(2 * (size - 1), size),
            "seed001_ring": F(size, size - 1), "paper_bml": F(2 * (size - 1), k * size),
            "method": "all ranks" if full else "by symmetry",
            "seconds": time.perf_counter() - t0,
        })
    return rows


# -- Fig. 4 walk-through --------------------------------------------------------------------------

def walkthrough() -> dict:
    shape, size = (3, 3), 9
    count = 18  # one element per piece: T_C = 1 element-time
    scheds = bml_schedules(size, count, shape)
    cost = price(scheds, BCubeNetwork(shape))
    steps = []
    for i, (sc, st) in enumerate(zip(cost.steps, scheds[0].steps, strict=True)):
        per_level = {}
        for t in st.sends:
            per_level.setdefault(t.level, [t.stream, 0])[1] += t.hi - t.lo
        steps.append({"step": i, "t_c": F(sc.time), "link": sc.link,
                      "levels": {lv: tuple(v) for lv, v in sorted(per_level.items())}})
    return {"steps": steps, "total_t_c": F(cost.time), "t_f": cost.t_f,
            "paper": [6, 2, 2, 6]}


# -- Fig. 5 ----------------------------------------------------------------------------------------

FIG5 = [(16, (4, 4), 4), (1024, (32, 32), 16)]


def fig5() -> list[dict]:
    out = []
    for size, shape, ports in FIG5:
        groups = fat_tree_groups(ports)
        count = 6 * size  # divisible by 2 and 3 pipelines times N pieces
        bcube, ft = BCubeNetwork(shape), FatTree(size)
        k = len(shape)
        bml = price_symmetric(bml_schedule(0, size, count, shape), bcube).t_f
        ps_bcube = price_symmetric(ps_schedule(0, size, count), bcube).t_f
        hier = price_symmetric(bml_schedule(0, size, count, groups), ft).t_f
        hier_bcube_shape = price_symmetric(bml_schedule(0, size, count, shape), ft).t_f
        ps_ft = price_symmetric(ps_schedule(0, size, count), ft).t_f
        if size <= FULL_PRICING_MAX:  # cross-check the symmetry shortcut
            assert price(ps_schedules(size, count), bcube).t_f == ps_bcube
            assert price(bml_schedules(size, count, groups), ft).t_f == hier
        paper_bml = F(2 * (size - 1), k * size)
        out.append({"size": size, "shape": shape, "ports": ports, "groups": groups,
                    "BML/BCube": (bml, paper_bml),
                    "PS/BCube": (ps_bcube, 2 * paper_bml),
                    "Hierarchical/Fat-Tree": (hier, F(2 * (size - 1), size)),
                    "PS/Fat-Tree": (ps_ft, F(2 * (size - 1), size)),
                    "hier_bcube_shape": hier_bcube_shape})
    return out


# -- the MXNet trees on p3.16xlarge ---------------------------------------------------------------

def mxnet_trees() -> dict:
    w = preset("p3.16xlarge")
    net = LinkMatrixNetwork(w, name="p3.16xlarge")
    single = binary_tree(w)
    multi = multi_trees(w)
    count = 8 * 3 * 1000
    c_single = algorithm_cost("tree", count, 4, 8, net)
    c_multi = algorithm_cost("multitree", count, 4, 8, net)
    # how many trees load the busiest link of each multi-tree step
    link_trees = []
    for sc in c_multi.steps:
        bw = net.bandwidth(sc.link)
        link_trees.append(round(float(sc.time) * float(bw) / (count / 8)))
    sizes = [1 << p for p in range(10, 27, 2)]
    curves = {}
    crossings = {}
    for o in P3_OVERHEADS:
        cal = Calibration(alpha=P3_ALPHA, beta=P3_BETA, msg_overhead=o)
        curves[o] = [estimate(["tree", "multitree"], s, 4, 8, net, calib=cal) for s in sizes]
        crossings[o] = crossover("tree", "multitree", 4, 8, net, calib=cal)
    # per-message cost that puts the crossover at the proposal's 1M and 10M float32
    steps_single, steps_multi = c_single, c_multi
    d_msgs = (sum(s.messages for s in steps_multi.steps)
              - sum(s.messages for s in steps_single.steps))
    d_tf = float(c_single.t_f - c_multi.t_f)
    implied = {m: m * 4 * P3_BETA * d_tf / d_msgs for m in (1_000_000, 10_000_000)}
    for m, o in implied.items():  # check the closed form against the search
        x = crossover("tree", "multitree", 4, 8, net,
                      calib=Calibration(alpha=P3_ALPHA, beta=P3_BETA, msg_overhead=o))
        assert x is not None and abs(x - m) <= m * 0.02 + 16, (m, x)
    return {"single": single, "multi": multi, "weights": w, "c_single": c_single,
            "c_multi": c_multi, "link_trees": link_trees, "sizes": sizes, "curves": curves,
            "crossings": crossings, "implied": implied, "d_msgs": d_msgs, "d_tf": d_tf}


# -- failure recovery (seed 001) -----------------------------------------------------------------

#: Item 1 of issue 19: the cubes as radices, with one and two dead servers (a second dead
#: server in the first's row, or in neither its row nor its column).
RECOVERY_CASES = [((3, 3), (0,)), ((3, 3), (0, 4)), ((3, 3), (0, 1)),
                  ((4, 4), (0,)), ((4, 4), (0, 5)), ((4, 4), (0, 1)),
                  ((3, 3, 3), (0,)), ((3, 3, 3), (0, 13)), ((3, 3, 3), (0, 1)),
                  ((2, 2, 3), (0,)), ((2, 2, 3), (0, 7)), ((2, 2, 3), (0, 1))]


def cube_name(radices: tuple[int, ...]) -> str:
    if len(set(radices)) == 1:
        return f"BCube({radices[0]},{len(radices)})"
    return f"BCube({'x'.join(map(str, radices))})"


def address(radices: tuple[int, ...], server: int) -> str:
    """``[d_{k-1},…,d_0]``, the slide notes' notation."""
    digits = []
    for r in radices:
        digits.append(server % r)
        server //= r
    return "[" + ",".join(map(str, reversed(digits))) + "]"


def fresh_t_c(radices: tuple[int, ...], dead: tuple[int, ...]) -> F:
    """BML over the survivors renumbered on a fresh BCube (what ``recovery="fresh"`` runs),
    on the BCube without the dead servers: its messages are relayed by live servers."""
    from bmlmpi.ft.recovery import fresh_shape
    from bmlmpi.model import BCubeWithout
    from bmlmpi.schedules.types import Recv, Schedule, Step, Transfer

    n, k = int(np.prod(radices)), len(radices)
    live = [r for r in range(n) if r not in dead]
    s = len(live)
    count = k * s * len(fresh_shape(s))
    out = []
    for sched in bml_schedules(s, count, fresh_shape(s)):
        steps = tuple(Step(tuple(Transfer(live[t.peer], t.lo, t.hi, t.stream)
                                 for t in st.sends),
                           tuple(Recv(live[t.peer], t.lo, t.hi, t.stream, reduce=t.reduce)
                                 for t in st.recvs)) for st in sched.steps)
        out.append(Schedule("bml", live[sched.rank], n, count, steps, sched.streams,
                            participants=tuple(live)))
    cost = price(out, BCubeWithout(radices, dead))
    return F(cost.time) * k * s / count


def recovery() -> dict | None:
    """Seed 001's example (BCube(3,2) without [0,0]) and issue 19's table, if the recovery
    search exists in this tree."""
    try:
        from bmlmpi.ft.recovery import recovery_plan
    except ImportError:
        return None
    from bmlmpi.ft.recovery_search import live_neighbours
    from bmlmpi.topology.bcube import BCube

    rows = []
    for radices, dead in RECOVERY_CASES:
        plan = recovery_plan(radices, frozenset(dead))
        rows.append({"radices": radices, "dead": dead, "plan": plan,
                     "fresh": fresh_t_c(radices, dead),
                     "relays": next(c for c in plan.candidates if c.label == "relays")})
    radices, dead = RECOVERY_CASES[0]
    cube, live = BCube(radices), frozenset(range(int(np.prod(radices)))) - set(dead)
    rows[0]["nics"] = sum(len({lv for _, lv in live_neighbours(cube, live, a)}) for a in live)
    return {"seed": rows[0], "rows": rows, "paper_t_c": 18, "paper_t_f": F(9, 8)}


def render_recovery(rec: dict) -> list[str]:
    L: list[str] = []
    add = L.append
    seed = rec["seed"]
    plan, relays = seed["plan"], seed["relays"]
    chosen = plan.chosen
    radices = seed["radices"]
    pieces = 2 * plan.survivors
    add("## 5. Failure recovery: BCube(3,2) without server [0,0] (seed 001)")
    add("")
    add("The survivors keep their addresses and talk only to live servers one switch away; "
        f"the buffer is cut into k·(N−x) = {pieces} pieces, so T_C = T_F/{pieces}. "
        "`recovery_plan((3, 3), {0})` (`bmlmpi/ft/recovery.py`) prices every "
        "candidate with one element per piece on `BCubeWithout((3, 3), [0])` (BCube(3,2) "
        "with [0,0]'s links gone), proves each with the verifier, and runs the cheapest: the "
        "relay planner's schedule (BML's trees with stand-ins and auxiliary 2-hop relays) "
        "and, for every step count T, the timed reduction trees the search of "
        "`bmlmpi/ft/recovery_search.py` finds (each piece reduced along its own "
        "spanning tree of the survivors, each survivor sending once, in a step after its "
        "children; the allgather mirrors it).")
    add("")
    add("| | steps | per step (T_C) | total |")
    add("|---|---:|---|---|")
    for c in plan.candidates:
        mark_ = " **(runs)**" if c is chosen else ""
        add(f"| {c.label}{mark_} | {c.nsteps} | {', '.join(frac(x) for x in c.step_t_c)} | "
            f"{frac(c.t_c)} T_C = {frac(c.t_c / pieces)} T_F |")
    add(f"| seed 001 | 6 | 6, …, 6 (the auxiliary steps' costs are not given) | "
        f"{rec['paper_t_c']} T_C = {frac(rec['paper_t_f'])} T_F |")
    b = plan.bounds
    add(f"| lower bound | | | {frac(b.any_schedule)} T_C = "
        f"{frac(b.any_schedule / pieces)} T_F |")
    add("")
    verdict = "below" if chosen.t_c < rec["paper_t_c"] else (
        "equal to" if chosen.t_c == rec["paper_t_c"] else "above")
    reached = "reaches it" if chosen.t_c == b.any_schedule else "does not reach it"
    add(f"**Ours:** {frac(chosen.t_c)}·T_C = {frac(chosen.t_c / pieces)}·T_F in "
        f"{chosen.nsteps} steps, {verdict} the slides' 18·T_C = 9/8·T_F and the relay "
        f"planner's {frac(relays.t_c)}·T_C: the relay planner's first and last steps cost "
        f"{frac(relays.step_t_c[0])}·T_C each (a server of a full row sends the 3 pieces of "
        "each other column, as in healthy BML) and its auxiliary steps carry [0,0]'s share "
        "round it, while the searched trees load no NIC with more than "
        f"{frac(max(chosen.step_t_c))} pieces in any step. The lower bound: every element "
        f"needs 2(S−1) = {2 * (plan.survivors - 1)} transfers, and the survivors keep "
        f"{seed['nics']} working NICs, so the busiest carries at least "
        f"{2 * (plan.survivors - 1)}·{pieces}/{seed['nics']} = {frac(b.any_schedule)} pieces; "
        f"the search {reached} (`perf/paper/recovery_milp.py`, which needs scipy, solves "
        "the family exactly for a given step count; its docstring records the optima). The "
        "slides list the steps' transfers but not their times, so their 18 cannot be "
        "checked step by step.")
    add("")
    add("The trees that run, per piece (owner; each survivor → its parent @ reduce step; "
        "the allgather step is 2T−1 minus it):")
    add("")
    trees = chosen.trees
    if trees is not None:
        for (e, owner), edges in zip(trees.pieces, trees.edges, strict=True):
            hops = ", ".join(f"{address(radices, v)}→{address(radices, u)}@{t}"
                             for v, u, t in edges)
            add(f"- pipeline {e}, owner {address(radices, owner)}: {hops}")
        add("")
    add("### Recovery on other cubes")
    add("")
    add("In T_C = T_F/(k·S) (S survivors). *Searched*: what runs (the cheapest candidate); "
        "*relays*: the relay planner; *fresh BML*: BML over the survivors renumbered on a "
        "fresh BCube of the default factorisation (`recovery=\"fresh\"`), its messages "
        "relayed by live servers over the same cube; *bound (any)*: the lower bound for any "
        "allreduce on the survivors' links (every element needs 2(S−1) transfers over the "
        "working NICs; every survivor sends and receives every element once; every element "
        "crosses every group of servers sharing a digit value both ways); *bound (family)*: "
        "the bound for schedules that reduce and then mirror (every survivor sends each "
        "piece it does not own once in the reduce phase, over its working NICs, and the "
        "allgather takes as long).")
    add("")
    add("| cube | dead | S | searched | steps | relays | fresh BML | bound (any) | "
        "bound (family) |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rec["rows"]:
        p = row["plan"]
        dead = " ".join(address(row["radices"], d) for d in row["dead"])
        add(f"| {cube_name(row['radices'])} | {dead} | {p.survivors} | "
            f"{frac(p.chosen.t_c, 2)} | {p.chosen.nsteps} | {frac(row['relays'].t_c, 2)} | "
            f"{frac(row['fresh'], 2)} | {frac(p.bounds.any_schedule, 2)} | "
            f"{frac(p.bounds.family, 2)} |")
    add("")
    add("Where *searched* equals *bound (family)* the search is optimal for its family. The "
        "gap to *bound (any)* is the price of the family's phases (reduce, then allgather): "
        "without [0,0] and [0,1], [0,2] keeps one NIC and must both send and receive the "
        "others' pieces on it, one phase after the other.")
    add("")
    return L


# -- plots ----------------------------------------------------------------------------------------

def plots(t2: list[dict], f5: list[dict], mx: dict) -> list[str]:
    """Draw :data:`PLOTS` into this folder; the names drawn (none without matplotlib)."""
    try:
        import matplotlib
        import matplotlib.ticker
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []

    fig, ax = plt.subplots(figsize=(6, 3.6))
    series = ["BML/BCube", "PS/BCube", "Hierarchical/Fat-Tree", "PS/Fat-Tree"]
    x = np.arange(len(f5))
    width = 0.2
    for i, name in enumerate(series):
        ours = [float(r[name][0]) for r in f5]
        paper = [float(r[name][1]) for r in f5]
        ax.bar(x + (i - 1.5) * width, ours, width, label=name)
        ax.scatter(x + (i - 1.5) * width, paper, marker="_", s=200, color="k", zorder=3)
    ax.set_xticks(x, [str(r["size"]) for r in f5])
    ax.set_xlabel("Number of servers")
    ax.set_ylabel("GST (× T_F)")
    ax.set_ylim(0, 2.5)
    ax.set_title("Fig. 5 from our schedules (bars); paper's text (black ticks)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(HERE / "fig5.png", dpi=120)
    plt.close(fig)
    made.append("fig5.png")

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ns = [r["size"] for r in t2]
    order = np.argsort(ns)
    ax.plot([ns[i] for i in order], [float(t2[i]["ps"]) for i in order], "o-",
            label="PS on Fat-Tree (= ring)")
    for k in sorted({r["k"] for r in t2}):
        pts = sorted((r["size"], float(r["bml"])) for r in t2 if r["k"] == k)
        ax.plot(*zip(*pts, strict=True), "s--", label=f"BML on BCube(n,{k})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("servers N")
    ax.set_ylabel("GST (× T_F)")
    ax.set_ylim(0, 2.2)
    ax.legend(fontsize=8)
    ax.set_title("Table II: GST priced from the schedules", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "table2.png", dpi=120)
    plt.close(fig)
    made.append("table2.png")

    fig, ax = plt.subplots(figsize=(6, 3.6))
    sizes = mx["sizes"]
    for o in P3_OVERHEADS:
        ratio = [c["tree"] / c["multitree"] for c in mx["curves"][o]]
        ax.plot(sizes, ratio, "o-", label=f"{o * 1e6:g} µs per message")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axvspan(1e6, 1e7, color="grey", alpha=0.2, label="proposal: 1M–10M floats")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([0.2, 0.5, 1, 2, 3])
    ax.set_xlabel("float32 elements")
    ax.set_ylabel("single-tree time / multi-tree time")
    ax.set_title("p3.16xlarge: multi-tree wins above 1", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "trees_p3.png", dpi=120)
    plt.close(fig)
    made.append("trees_p3.png")
    return made


# -- the Markdown -----------------------------------------------------------------------------

def render(t2: list[dict], wt: dict, f5: list[dict], mx: dict, rec: dict | None) -> str:
    L: list[str] = []
    add = L.append
    add("# The BML paper's analysis, from bmlmpi's schedules")
    add("")
    add("Generated by `python perf/paper/report.py` (do not edit by hand). Every *ours* number "
        "is the cost model (`bmlmpi.model`) pricing the schedules the executor runs "
        "(`bmlmpi.schedules`): each send routed over the network's links, each step costing "
        "the busiest link's bytes / bandwidth, steps summed. Bandwidth figures are in T_F, the "
        "time to send the whole buffer over one link; T_C = T_F/(kN) is one BML piece. "
        "Counts are chosen so that every piece has the same size, so the results are exact "
        "fractions. *Paper* is the formula or statement of the paper's text (`seeds/000`), or "
        "of the Table II transcription in the slide notes (`seeds/001`).")
    add("")

    add("## 1. Table II: theoretical GST")
    add("")
    add("PS is the P2P parameter server (`bmlmpi/schedules/ps.py`: every server aggregates "
        "1/N) on a one-NIC non-blocking Fat-Tree; ring is `ring_schedule` on the same Fat-Tree; "
        "BML is `bml_schedule` on BCube(n,k), one NIC per level. *Priced* says whether every "
        "rank's schedule was routed or one rank's, scaled by the network's symmetry (exact for "
        "these schedules; the unit tests check the two agree). Ring is not priced beyond "
        f"N = {RING_MAX} (2(N−1) steps per rank).")
    add("")
    add("| BCube(n,k) | N | PS / Fat-Tree, ours | paper 2(N−1)/N | ring, ours | "
        "seed 001 N/(N−1) | BML, ours | paper 2(N−1)/(kN) | priced |")
    add("|---|---:|---|---|---|---|---|---|---|")
    for r in t2:
        ring = frac(r["ring"]) if r["ring"] is not None else "—"
        add(f"| ({r['n']},{r['k']}) | {r['size']} | {frac(r['ps'])} "
            f"{mark(r['ps'], r['paper_ps'])} | {frac(r['paper_ps'])} | {ring} "
            f"{mark(r['ring'], r['paper_ring']) if r['ring'] is not None else ''} | "
            f"{frac(r['seed001_ring'])} | {frac(r['bml'])} {mark(r['bml'], r['paper_bml'])} | "
            f"{frac(r['paper_bml'])} | {r['method']} |")
    add("")
    ok = all(r["ps"] == r["paper_ps"] and r["bml"] == r["paper_bml"]
             and (r["ring"] is None or r["ring"] == r["paper_ring"]) for r in t2)
    add(f"**Result:** {'every' if ok else 'NOT every'} row matches the paper's formulas exactly "
        "(`=` marks). BML on BCube(n,k) takes 1/k of the Fat-Tree GST, as claimed.")
    add("")
    add("**The ring entry of Table II as transcribed in `seeds/001` (N/(N−1)·T_F) is wrong.** "
        "The paper's own text (§2) gives 2(N−1)/N·T_F for Ring AllReduce (2(N−1) steps of "
        "T_F/N each), and that is what our ring schedule costs. N/(N−1) cannot be right: "
        "for N ≥ 4 it is below 2(N−1)/N, the least any allreduce can cost when each server "
        "has one link (every server must send and receive 2(N−1)/N of the buffer), and for "
        "N = 2, 3 it is above what the ring achieves. It reads like 2(N−1)/N with the "
        "fraction inverted and the 2 dropped.")
    add("")

    add("## 2. The BCube(3,2) walk-through (Fig. 4)")
    add("")
    add("`bml_schedules(9, 18, (3, 3))` (one element per piece, so 1 element = T_C) priced on "
        "BCube(3,2). Per step, the elements rank 0 sends on each level (and which pipeline "
        "uses it), and the busiest link of all servers:")
    add("")
    add("| step | phase | level 0: pipeline, elements | level 1: pipeline, elements | "
        "busiest link | ours (T_C) | paper (T_C) |")
    add("|---:|---|---|---|---|---:|---:|")
    for st, paper in zip(wt["steps"], wt["paper"], strict=True):
        phase = "aggregation" if st["step"] < 2 else "broadcast"
        lv = st["levels"]
        cells = [f"thread {lv[v][0]}, {lv[v][1]}" if v in lv else "—" for v in (0, 1)]
        add(f"| {st['step'] + 1} | {phase} | {cells[0]} | {cells[1]} | `{st['link']}` | "
            f"{frac(st['t_c'])} | {paper} |")
    add(f"| | | | | **total** | **{frac(wt['total_t_c'])} T_C = {frac(wt['t_f'])} T_F** | "
        "**16 T_C = 8/9 T_F** |")
    add("")
    add("Matches the paper step for step: 6·T_C, 2·T_C, 2·T_C, 6·T_C. In every step thread 0 "
        "and thread 1 use different levels (different NICs), which is why the k pipelines "
        "overlap and the total is 1/k of a one-NIC schedule's 2·16 T_C.")
    add("")

    add("## 3. Fig. 5: BML vs PS on BCube and Fat-Tree")
    add("")
    add("The paper's Fig. 5 is a bar chart whose heights are not printed; its §3.3 text states "
        "them: BML on BCube is 2(N−1)/(kN)·T_F; PS on BCube \"will double the GST compared "
        "with running BML\"; the hierarchical (BML-like) algorithm on Fat-Tree, grouping "
        "servers by edge switch, then aggregation switch, then pod, \"results in the same GST "
        "as running PS algorithm in Fat-Tree\", 2(N−1)/N·T_F. *Paper* below is those "
        "statements evaluated. Ours: BML = `bml_schedule` on BCube(n,2); PS/BCube = the P2P "
        "PS schedule on BCube, every transfer between servers that differ in both digits "
        "relayed through a server (2 hops, fixing the lower digit first); "
        "Hierarchical/Fat-Tree = `bml_schedule` with the Fat-Tree(k') hierarchy as radices "
        "(k'/2 servers per edge switch, k'/2 edge switches per pod, k' pods) on a one-NIC "
        "Fat-Tree; PS/Fat-Tree = the PS schedule there.")
    add("")
    add("| servers | network | series | ours (T_F) | paper (T_F) | |")
    add("|---:|---|---|---|---|---|")
    for r in f5:
        nets = {"BML/BCube": f"BCube{r['shape'][0], 2}",
                "PS/BCube": f"BCube{r['shape'][0], 2}",
                "Hierarchical/Fat-Tree": f"Fat-Tree({r['ports']}), groups {r['groups']}",
                "PS/Fat-Tree": f"Fat-Tree({r['ports']})"}
        for name in ("BML/BCube", "PS/BCube", "Hierarchical/Fat-Tree", "PS/Fat-Tree"):
            ours, paper = r[name]
            add(f"| {r['size']} | {nets[name]} | {name} | {frac(ours)} | {frac(paper)} | "
                f"{mark(ours, paper)} |")
    add("")
    r16, r1k = f5
    add("Three of the four series match exactly (hierarchical on Fat-Tree also gives "
        f"{frac(r16['hier_bcube_shape'])} at N = 16 with the BCube radices (4,4) instead of the "
        "Fat-Tree grouping: with one NIC, the grouping does not matter).")
    add("")
    ps16, ps1k = r16["PS/BCube"][0], r1k["PS/BCube"][0]
    add(f"**PS on BCube differs from \"double BML\":** ours is {frac(ps16)} at N = 16 and "
        f"{frac(ps1k)} at N = 1024, i.e. {float(ps16 / r16['BML/BCube'][0]):.2f}× and "
        f"{float(ps1k / r1k['BML/BCube'][0]):.2f}× BML, not 2×. Worked by hand for BCube(n,2): "
        "a server's N−1 flows of P/N each cross 2(n−1)·1 + (n−1)²·2 = 2n(n−1) NIC hops in "
        "all, spread evenly over its 2 NICs (the relays carry the rest), so each uplink "
        "carries n(n−1)·P/N = (n−1)/n·P per phase: 2(n−1)/n·T_F for push and pull, against "
        "BML's 2(N−1)/(2N)·T_F ≈ 1·T_F. The ratio tends to 2 as n grows (1.94 at n = 32) "
        "but is 1.6 at n = 4. The paper's \"double\" is the large-n limit; its Fig. 5 bar "
        "for 16 servers cannot be read from the text.")
    add("")
    add("A modelling note: our model is step-synchronous (a step ends when its busiest link "
        "is done, as the executor waits for all of a step's transfers). For equal radices "
        "every NIC is equally busy in every step, so this equals the pipelined bound the "
        "paper uses. For mixed radices (e.g. 2x3) the k pipelines move different amounts in "
        "the same step and the synchronous cost is higher than max-over-NICs of the total "
        "(the bound `perf/testbed/theory.py` uses).")
    add("")

    add("## 4. The MXNet trees on p3.16xlarge: single vs multi tree")
    add("")
    add("Link matrix: the `p3.16xlarge` preset (3 = two NVLinks, 50 GB/s; 2 = one NVLink, "
        "25 GB/s; 1 = PCIe through the CPU, 10 GB/s). Bandwidths in units of one NVLink: "
        "3 → 2, 2 → 1, 1 → 2/5; an NVLink is a private point-to-point link, a PCIe path "
        "shares the GPU's host port. Trees from `bmlmpi.topology.trees` (`binary_tree`, "
        "`multi_trees` with penalty 0.7); schedules `tree_schedule` / `multitree_schedule`.")
    add("")
    single, multi, w = mx["single"], mx["multi"], mx["weights"]
    add(f"- single tree (root {single.root}, {single.depth} steps, weight "
        f"{single.weight(w):g}): edges (child→parent @step) "
        + ", ".join(f"{c}→{p}@{single.send_step[c]}" for c, p in enumerate(single.parent)
                    if p >= 0))
    add(f"- multi-tree: {len(multi)} trees, depths {[t.depth for t in multi]}, weights "
        f"{[round(t.weight(w), 1) for t in multi]}")
    cs, cm = mx["c_single"], mx["c_multi"]
    add(f"- bandwidth cost: single tree {frac(cs.t_f)} T_F (steps "
        f"{', '.join(frac(x, 3) for x in cs.step_t_f())}), multi-tree {frac(cm.t_f)} T_F "
        f"(steps {', '.join(frac(x, 3) for x in cm.step_t_f())}); T_F = the buffer over one "
        "NVLink.")
    add(f"- most messages one GPU posts per step: single {[s.messages for s in cs.steps]}, "
        f"multi {[s.messages for s in cm.steps]}.")
    add(f"- trees sharing the busiest link, per multi-tree step: {mx['link_trees']} (of 8; "
        f"busiest links {[s.link[1:3] for s in cm.steps]}).")
    add("")
    add("Seconds for one allreduce of float32 with β = 1/(25 GB/s) per NVLink unit, "
        f"α = {P3_ALPHA * 1e6:g} µs per step (assumed), and a cost per message a GPU posts "
        "(assumed, columns):")
    add("")
    head = "| float32 elements | " + " | ".join(
        f"single / multi, {o * 1e6:g} µs/msg" for o in P3_OVERHEADS) + " |"
    add(head)
    add("|---:|" + "---|" * len(P3_OVERHEADS))
    for i, s in enumerate(mx["sizes"]):
        cells = []
        for o in P3_OVERHEADS:
            c = mx["curves"][o][i]
            cells.append(f"{c['tree'] * 1e6:.0f} / {c['multitree'] * 1e6:.0f} µs")
        add(f"| {s:,} | " + " | ".join(cells) + " |")
    add("")
    add("| per-message cost | model's crossover (float32 elements) |")
    add("|---:|---:|")
    for o in P3_OVERHEADS:
        x = mx["crossings"][o]
        add(f"| {o * 1e6:g} µs | {x:,} |" if x is not None else f"| {o * 1e6:g} µs | never |")
    add("")
    lo, hi = mx["implied"][1_000_000], mx["implied"][10_000_000]
    add("**Paper (MXNet proposal, Fig. 7):** \"beyond 1M-10M float32's, multi-tree begins to "
        "do better than a single tree\". **Ours:** with the per-step α-β model alone the "
        "crossover is at a handful of elements — both schedules take 2⌈log2 8⌉ = 6 steps and "
        "the multi-tree moves less per link in every step, so it is never slower. The "
        "measured crossover comes from what each extra message costs: the multi-tree posts "
        f"{mx['d_msgs']} more messages per GPU over the allreduce and saves "
        f"{mx['d_tf']:.2f} T_F, so the crossover is at count = o·{mx['d_msgs']}/"
        f"({mx['d_tf']:.2f}·4 B·β), about "
        f"{mx['d_msgs'] / (mx['d_tf'] * 4 * P3_BETA) * 1e-6:,.0f} float32 per µs of "
        f"per-message cost o. The proposal's 1M–10M float32 corresponds "
        f"to o ≈ {lo * 1e6:.0f}–{hi * 1e6:.0f} µs per message — the order of a reduction "
        "kernel launch plus a scheduled copy in MXNet's engine, which our α-β-o model does "
        "not know a priori. On our own executor `choose()` uses the o it measures "
        "(`bmlmpi.calibrate`).")
    add("")
    add("The multi-tree's bandwidth cost is far from the hardware's: "
        f"{mx['link_trees'][0]} of the 8 trees cross the same NVLink in their first step, "
        "because the link-usage penalty spreads link use over trees but not over steps. A "
        "GPU of p3.16xlarge has 6 NVLink units out, so an allreduce could approach "
        "2·7/8/6 ≈ 0.29 T_F; this multi-tree costs "
        f"{float(cm.t_f):.2f} T_F.")
    add("")
    if rec is not None:
        L.extend(render_recovery(rec))
    add("## Plots")
    add("")
    for p in PLOTS:
        add(f"![{p}]({p})")
        add("")
    return "\n".join(L).rstrip() + "\n"


def compute() -> dict:
    """Everything the report shows, computed (a few seconds)."""
    return {"t2": table_ii(), "wt": walkthrough(), "f5": fig5(), "mx": mxnet_trees(),
            "rec": recovery()}


def report_text(results: dict | None = None) -> str:
    """REPORT.md's text: the same with or without matplotlib, run after run."""
    return render(**(compute() if results is None else results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "REPORT.md")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = compute()
    text = report_text(results)
    args.out.write_text(text)
    print(text)
    print(f"(computed in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if not args.no_plots:
        drawn = plots(results["t2"], results["f5"], results["mx"])
        if drawn and tuple(drawn) != PLOTS:
            raise RuntimeError(f"drew {drawn}, but the report names {PLOTS}")
        if not drawn:
            print("(plots not redrawn: matplotlib is not installed, pip install "
                  "'.[plot]'; the report names the committed ones)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
