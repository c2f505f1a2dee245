"""Soak test of the fault-tolerant allreduce: many randomised kill trials, small N.

    python perf/ft/soak.py --trials 100 --seed 1 --out perf/ft/results/soak.json

Each launch (``bmlmpi-run --ft -n W``) cuts the world into groups of ``--group-size`` ranks,
each with its own fault-tolerant communicator and algorithm (bml, bml on an explicit BCube
shape with BCube-preserving recovery, ring, tree, native — drawn at random). A group runs
successive trials until ``--min-survivors`` are left; a trial is

1. ``--healthy`` timed allreduces on the current members (the healthy baseline),
2. one allreduce during which a random member dies — by SIGKILL, an uncaught exception,
   ``os._exit(0)`` or SIGSTOP (a hang the heartbeat fences) — before the call, at the start of
   a random schedule step, or once a random step has been posted,
3. ``--healthy`` timed allreduces on the survivors.

Per trial it reports whether the failed call ended exactly right on every survivor (the exact
reduction over the survivors' inputs, the same everywhere; a victim that had already sent
everything may be included, as documented in bmlmpi.ft), the detection time (kill → first
and last survivor noticing), the recovery time (kill → the call committed on every survivor),
the shrink time, and the slowdown of the survivors' next healthy call (and the median of the
following ones) against the healthy calls before the failure. A call's time is its slowest
rank's. ``--rank-side`` is the program each rank runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = ["bml", "bml-bcube", "ring", "tree", "native"]
HOWS = [("kill", 0.4), ("raise", 0.2), ("exit", 0.25), ("stop", 0.15)]
WHENS = [("before", 0.2), ("post", 0.5), ("during", 0.3)]


def pick(rng: random.Random, weighted: list[tuple[str, float]]) -> str:
    return rng.choices([w for w, _ in weighted], [p for _, p in weighted])[0]


# -- rank side -------------------------------------------------------------------------------

def rank_side(spec: dict) -> int:
    import numpy as np
    from mpi4py import MPI

    import bmlmpi
    from bmlmpi import execute, ft
    from bmlmpi.topology.bcube import default_shape, format_shape

    ft.install_exit_handlers()

    def emit(**rec) -> None:
        print("SOAK-JSON " + json.dumps(rec), flush=True)

    world = MPI.COMM_WORLD
    gsize = spec["group_size"]
    gi = world.rank // gsize
    g = spec["groups"][gi]
    sub = world.Split(gi, world.rank)
    algorithm = "bml" if g["algorithm"] == "bml-bcube" else g["algorithm"]
    # bml-bcube: the group's default BCube shape named explicitly, so that recovery keeps the
    # addresses (BCube-preserving schedules); a prime size is a one-level BCube
    topology = format_shape(default_shape(gsize)) if g["algorithm"] == "bml-bcube" else None
    comm = bmlmpi.Communicator(sub, algorithm=algorithm, topology=topology,
                               fault_tolerant=True, timeout=spec["timeout"],
                               hang_timeout=spec["hang_timeout"])
    me = comm.original_rank
    n = spec["count"]

    def data(rank: int, tag: int) -> np.ndarray:
        i = np.arange(n)
        return ((i * 7 + rank * 3 + tag) % 11 + rank * 1000 + tag * 100_000).astype(np.float64)

    armed: dict = {}

    class Killer(execute.RunObserver):
        """Dies when the armed trial's run is about to post the armed step."""

        def post(self, run: execute.Run, lane: int) -> None:
            if armed and armed["when"] == "post":
                nsteps = run.plan.nsteps
                target = int(armed["step_frac"] * nsteps)
                if run.posting_step(lane) >= target:
                    emit(group=gi, trial=armed["trial"], victim=me, t_kill=time.time(),
                         step=target, nsteps=nsteps, must_exclude=run.sends_left())
                    die(armed["how"])

    killer = Killer()

    def die(how: str) -> None:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "raise":
            raise RuntimeError("soak: dying on purpose")
        elif how == "exit":
            os._exit(0)
        os.kill(os.getpid(), signal.SIGSTOP)

    def timed(tag: int) -> float:
        x, out = data(me, tag), np.empty(n)
        t0 = time.perf_counter()
        comm.Allreduce(x, out)
        return time.perf_counter() - t0

    tag = 0
    members = list(range(gsize))
    with execute.observing(killer):
        for ti, trial in enumerate(g["trials"]):
            before = []
            for _ in range(spec["healthy"]):
                tag += 1
                before.append(timed(tag))
            victim = members[trial["victim_index"] % len(members)]
            tag += 1
            if victim == me:
                armed.update(trial, trial=ti)
                if trial["when"] == "before" or algorithm == "native" and trial["when"] == "post":
                    emit(group=gi, trial=ti, victim=me, t_kill=time.time(), step=-1, nsteps=0,
                         must_exclude=True)
                    die(trial["how"])
            x, out = data(me, tag), np.full(n, -1.0)
            t0 = time.perf_counter()
            req = comm.Iallreduce(x, out)
            if victim == me and trial["when"] == "during":
                while True:
                    run = req.run
                    if not isinstance(run, execute.Run):
                        break
                    target = int(trial["step_frac"] * run.plan.sched.nsteps)
                    if run.step >= target:
                        break
                    req.Test()
                is_run = isinstance(run, execute.Run)
                step = run.step if is_run else -1  # it may have gone past the target
                emit(group=gi, trial=ti, victim=me, t_kill=time.time(), step=step,
                     nsteps=run.plan.nsteps if is_run else 0,
                     must_exclude=is_run and run.sends_left())
                die(trial["how"])
            req.Wait()
            t_done = time.time()
            fail_call = time.perf_counter() - t0
            alive = [m for m in members if m != victim]
            want = sum(data(r, tag) for r in alive)
            with_victim = want + data(victim, tag)
            match = "exact" if np.array_equal(out, want) else \
                "with-victim" if np.array_equal(out, with_victim) else "wrong"
            after = []
            for _ in range(spec["healthy"]):
                tag += 1
                after.append(timed(tag))
            rec = next((r for r in reversed(comm.recoveries) if victim in r.lost), None)
            emit(group=gi, trial=ti, survivor=me, match=match, size=comm.size, before=before,
                 fail_call=fail_call, after=after, t_done=t_done,
                 failed=list(comm.failed), recovery=None if rec is None else
                 {"noticed": rec.noticed, "agreed": rec.agreed, "shrunk": rec.shrunk})
            members = alive
    ft.finish(0)
    return 0


# -- driver ----------------------------------------------------------------------------------

def plan_launch(rng: random.Random, groups: int, group_size: int, min_survivors: int) -> list:
    out = []
    for _ in range(groups):
        trials = []
        for size in range(group_size, min_survivors, -1):
            trials.append({"victim_index": rng.randrange(size), "how": pick(rng, HOWS),
                           "when": pick(rng, WHENS), "step_frac": rng.random()})
        out.append({"algorithm": rng.choice(ALGORITHMS), "trials": trials})
    return out


def run_launch(spec: dict, timeout: float) -> tuple[list[dict], float, str]:
    n = len(spec["groups"]) * spec["group_size"]
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", str(n), sys.executable,
           str(Path(__file__).resolve()), "--rank-side", json.dumps(spec)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0"}
    t0 = time.time()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env=env)
        out, err = res.stdout, res.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = "TIMEOUT"
    recs = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
            if line.startswith("SOAK-JSON ")]
    return recs, time.time() - t0, err[-2000:]


def summarise_trial(spec_group: dict, gi: int, ti: int, recs: list[dict]) -> dict:
    trial = spec_group["trials"][ti]
    victims = [r for r in recs if r.get("group") == gi and r.get("trial") == ti
               and "victim" in r]
    surv = [r for r in recs if r.get("group") == gi and r.get("trial") == ti
            and "survivor" in r]
    out = {"algorithm": spec_group["algorithm"], "how": trial["how"], "when": trial["when"],
           "survivors": len(surv)}
    if not victims or not surv:
        out["outcome"] = "hang-or-crash"
        return out
    v = victims[0]
    matches = {s["match"] for s in surv}
    exact = matches == {"exact"} or (matches == {"with-victim"} and not v["must_exclude"])
    out["outcome"] = "exact" if exact else f"wrong:{sorted(matches)}"
    out["victim_included"] = matches == {"with-victim"}
    out["size_before"] = surv[0]["size"] + 1
    out["step"], out["nsteps"] = v["step"], v["nsteps"]
    noticed = [s["recovery"]["noticed"] for s in surv if s["recovery"]]
    shrunk = [s["recovery"]["shrunk"] - s["recovery"]["agreed"] for s in surv if s["recovery"]]
    if noticed:
        out["detect_first_s"] = min(noticed) - v["t_kill"]
        out["detect_last_s"] = max(noticed) - v["t_kill"]
        out["shrink_s"] = max(shrunk)
    out["recover_s"] = max(s["t_done"] for s in surv) - v["t_kill"]
    n = len(surv[0]["before"])
    before = [max(s["before"][i] for s in surv) for i in range(n)]
    after = [max(s["after"][i] for s in surv) for i in range(n)]
    if n:
        base = statistics.median(before)
        out["healthy_before_s"] = base
        out["next_call_slowdown"] = after[0] / base
        out["later_calls_slowdown"] = statistics.median(after[1:] or after) / base
    return out


def machine_info() -> dict:
    """The machine and versions; MPI's read without initialising MPI in this driver (a
    singleton's shared-memory segment would stay in /dev/shm: compare.py's versions())."""
    import mpi4py
    import numpy
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "mpi4py": mpi4py.__version__,
            "mpi": MPI.Get_library_version().replace("\0", "").strip().splitlines()[0],
            "load_average_at_start": os.getloadavg()}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--groups", type=int, default=4, help="groups per launch")
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--min-survivors", type=int, default=2)
    p.add_argument("--healthy", type=int, default=5, help="timed calls before and after")
    p.add_argument("--count", type=int, default=65_536, help="float64 elements per call")
    p.add_argument("--timeout", type=float, default=60, help="bmlmpi deadline (s)")
    p.add_argument("--hang-timeout", type=float, default=2.0)
    p.add_argument("--launch-timeout", type=float, default=400)
    p.add_argument("--out", default=str(ROOT / "perf/ft/results/soak.json"))
    args = p.parse_args(argv)
    if args.rank_side is not None:
        return rank_side(json.loads(args.rank_side))

    rng = random.Random(args.seed)
    info = machine_info()
    trials: list[dict] = []
    launches = []
    while len(trials) < args.trials:
        spec = {"group_size": args.group_size, "count": args.count, "healthy": args.healthy,
                "timeout": args.timeout, "hang_timeout": args.hang_timeout,
                "groups": plan_launch(rng, args.groups, args.group_size, args.min_survivors)}
        recs, seconds, err = run_launch(spec, args.launch_timeout)
        launches.append({"seconds": seconds, "ranks": args.groups * args.group_size,
                         "stderr_tail": err if err == "TIMEOUT" else ""})
        for gi, g in enumerate(spec["groups"]):
            for ti in range(len(g["trials"])):
                trials.append(summarise_trial(g, gi, ti, recs))
        done = sum(t["outcome"] == "exact" for t in trials)
        print(f"launch {len(launches)}: {seconds:.0f} s, {len(trials)} trials, {done} exact",
              flush=True)

    def stat(key: str) -> dict:
        vals = [t[key] for t in trials if key in t]
        if not vals:
            return {}
        return {"n": len(vals), "median": statistics.median(vals), "p90": pct(vals, 0.9),
                "max": max(vals)}

    def by_algorithm(a: str) -> dict:
        sub = [t for t in trials if t["algorithm"] == a]
        out = {"trials": len(sub), "exact": sum(t["outcome"] == "exact" for t in sub)}
        for key in ("recover_s", "next_call_slowdown", "later_calls_slowdown"):
            vals = [t[key] for t in sub if key in t]
            if vals:
                out[key + "_median"] = statistics.median(vals)
        return out

    by_how = {}
    for how, _ in HOWS:
        sub = [t for t in trials if t["how"] == how]
        by_how[how] = {"trials": len(sub), "exact": sum(t["outcome"] == "exact" for t in sub),
                       "detect_first_s": statistics.median(
                           [t["detect_first_s"] for t in sub if "detect_first_s" in t] or [0])}
    summary = {
        "trials": len(trials),
        "exact": sum(t["outcome"] == "exact" for t in trials),
        "victim_included": sum(bool(t.get("victim_included")) for t in trials),
        "outcomes": {o: sum(t["outcome"] == o for t in trials)
                     for o in sorted({t["outcome"] for t in trials})},
        "detect_first_s": stat("detect_first_s"), "detect_last_s": stat("detect_last_s"),
        "shrink_s": stat("shrink_s"), "recover_s": stat("recover_s"),
        "next_call_slowdown": stat("next_call_slowdown"),
        "later_calls_slowdown": stat("later_calls_slowdown"),
        "by_how": by_how,
        "by_algorithm": {a: by_algorithm(a) for a in ALGORITHMS},
    }
    result = {"machine": info, "args": vars(args), "launches": launches, "summary": summary,
              "trials": trials}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0 if summary["exact"] == summary["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
