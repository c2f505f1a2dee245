"""Rank program of tests/test_switch_launch.py: one rank switches to a signature every rank
ran before while the others repeat theirs (docs/contracts.md, "After an argument mismatch"),
and one rank refuses its arguments while the others run an agreed signature on a node tier
still to be set up. ``python tests/switch_ranks.py SCENARIO``; each rank prints one line
``SWITCH {"rank": r, "failures": [...], "cases": [...]}``.

Scenarios: ``registry`` (every algorithm of every collective in the registry, blocking; the
all-to-all at ``ALLTOALL_RANKS`` ranks),
``shm``, ``hierarchical`` and ``auto`` (the shared-memory tier: blocking, ``I…`` and
persistent), ``refuse`` (a refusal meeting the node tier's set-up). The deadline is
``BMLMPI_TIMEOUT``.
"""
# Every lambda below is called at once, inside its loop iteration.
# ruff: noqa: B023

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
failures: list[str] = []
cases: list[dict] = []
ROOT = 0          # the rooted collectives' root
SWITCHER = 1      # the rank that switches (or the one that accepts, in ``refuse``)
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "reduce", "bcast", "alltoall")
#: the rank count at which the registry scenario runs the all-to-all (each of its schedules
#: waits out one deadline: once is enough, and it costs the suite seconds)
ALLTOALL_RANKS = 4
#: the mpi4py name of each collective's call (``I…`` and ``…_init`` are formed from it)
NAMES = {"allreduce": "Allreduce", "reduce_scatter": "Reduce_scatter_block",
         "allgather": "Allgather", "reduce": "Reduce", "bcast": "Bcast",
         "alltoall": "Alltoall"}
#: what the second signature changes, per collective (the registry scenario)
CHANGES = {"allreduce": "op", "reduce_scatter": "dtype", "allgather": "count",
           "reduce": "op", "bcast": "count", "alltoall": "count"}
RAISED = ("DeadlineExceeded", "CommunicatorRevoked")


def signatures(change: str, m: int) -> tuple[tuple, tuple]:
    """Signature A and B (count, dtype, op) that differ in ``change``."""
    if change == "op, MAX first":  # auto never runs MPI's own call for MAX (its NaN rule)
        return (m, np.float64, MPI.MAX), (m, np.float64, MPI.SUM)
    a = (m, np.float64, MPI.SUM)
    b = {"op": (m, np.float64, MPI.MAX), "count": (2 * m, np.float64, MPI.SUM),
         "dtype": (m, np.int64, MPI.SUM)}[change]
    return a, b


def contribution(n: int, r: int, call: int, dtype) -> np.ndarray:
    """Position-, rank- and call-dependent data whose sums are exact."""
    return ((np.arange(n) * 7 + r * 3 + call * 5) % 11).astype(dtype)


def reduced(n: int, call: int, dtype, op) -> np.ndarray:
    parts = [contribution(n, r, call, dtype) for r in range(size)]
    return np.sum(parts, axis=0).astype(dtype) if op == MPI.SUM else np.max(parts, axis=0)


class Signature:
    """One signature of one collective: its buffers (kept, so a persistent request can be
    bound to them) and what each call must give."""

    def __init__(self, coll: str, sig: tuple):
        self.coll = coll
        self.m, self.dtype, self.op = sig
        m, dt = self.m, self.dtype
        self.send = np.zeros(size * m if coll in ("reduce_scatter", "alltoall") else m, dt)
        self.recv = np.zeros(size * m if coll in ("allgather", "alltoall") else m, dt)
        self.request = None

    def args(self) -> tuple:
        coll = self.coll
        if coll == "bcast":
            return (self.send, ROOT)
        if coll in ("allgather", "alltoall"):
            return (self.send, self.recv)
        if coll == "reduce":
            return (self.send, self.recv, self.op, ROOT)
        return (self.send, self.recv, self.op)

    def fill(self, call: int) -> None:
        self.send[:] = contribution(self.send.size, rank, call, self.dtype)
        self.recv[:] = -1

    def result(self) -> np.ndarray:
        return self.send if self.coll == "bcast" else self.recv

    def want(self, call: int) -> np.ndarray | None:
        """This rank's result of call ``call`` (None: it gets none)."""
        m, dt, op, coll = self.m, self.dtype, self.op, self.coll
        if coll == "allreduce":
            return reduced(m, call, dt, op)
        if coll == "reduce_scatter":
            return reduced(size * m, call, dt, op)[rank * m:(rank + 1) * m]
        if coll == "allgather":
            return np.concatenate([contribution(m, r, call, dt) for r in range(size)])
        if coll == "reduce":
            return reduced(m, call, dt, op) if rank == ROOT else None
        if coll == "alltoall":  # block ``rank`` of every rank's input
            return np.concatenate([contribution(size * m, r, call, dt)[rank * m:(rank + 1) * m]
                                   for r in range(size)])
        return contribution(m, ROOT, call, dt)

    def run(self, ctx, form: str) -> None:
        name = NAMES[self.coll]
        if form == "blocking":
            getattr(ctx, name)(*self.args())
        elif form == "nonblocking":
            getattr(ctx, "I" + name.lower())(*self.args()).Wait()
        else:
            if self.request is None:
                self.request = getattr(ctx, name + "_init")(*self.args())
            self.request.Start()
            self.request.Wait()


def outcome(fn) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "", "", time.monotonic() - start


def exact(label: str, s: Signature, call: int) -> bool:
    want = s.want(call)
    if want is not None and not np.array_equal(s.result(), want):
        bad = int(np.count_nonzero(s.result() != want))
        failures.append(f"{label}: call {call} wrong ({bad}/{want.size} elements)")
        return False
    return True


def switch(algorithm: str, coll: str, change: str, form: str, m: int, timeout: float,
           check: str = "first-call") -> None:
    """Signatures A, B, A on every rank (each exact), then rank SWITCHER runs B while the
    others run A: every rank raises (or, where its part reads nothing from the switching
    rank, returns its exact result); the communicator is then revoked on every rank (with
    ``check="every-call"``: every rank raises ArgumentMismatch and the next call is right)."""
    label = f"{algorithm} {coll} {change} {form} N={size}"
    ctx = bmlmpi.Communicator(world, algorithm=algorithm, timeout=timeout, check=check)
    a, b = (Signature(coll, s) for s in signatures(change, m))
    for call, s in enumerate((a, b, a)):
        s.fill(call)
        kind, msg, _ = outcome(lambda: s.run(ctx, form))
        kinds = world.allgather(kind)
        if any(kinds):
            # an algorithm that does not apply here refuses on every rank alike
            if call == 0 and len(set(kinds)) == 1 and kind in ("ValueError",
                                                               "ShmUnavailable"):
                cases.append({"label": label, "algorithm": algorithm, "collective": coll,
                              "form": form, "outcome": "n/a", "why": msg[:200]})
                ctx.Free()
                return
            failures.append(f"{label}: call {call} raised {kind}: {msg[:300]}")
            return
        exact(label, s, call)
    world.Barrier()  # every rank has finished the good calls
    chosen = {}
    if algorithm == "auto":  # what it runs: the contract is that algorithm's
        chosen = {"chosen": [ctx.explain(x.m, x.dtype, x.op).chosen for x in (a, b)]}
    mine = b if rank == SWITCHER else a
    call = 3
    mine.fill(call)
    kind, msg, took = outcome(lambda: mine.run(ctx, form))
    cases.append({"label": label, "algorithm": algorithm, "collective": coll, "form": form,
                  "outcome": kind or "returned", **chosen})
    if check == "every-call":
        if kind != "ArgumentMismatch":
            failures.append(f"{label}: raised {kind or 'nothing'} ({msg[:200]}), wanted "
                            f"ArgumentMismatch")
        world.Barrier()
        a.fill(4)
        k, msg, _ = outcome(lambda: a.run(ctx, form))
        if k:
            failures.append(f"{label}: the next call raised {k}: {msg[:200]}")
        else:
            exact(label, a, 4)
    else:
        if kind == "":
            # only a part that reads nothing from the switching rank may complete: a
            # reduce's ranks that only send, a broadcast's root or a rank the root feeds
            # directly; what it returned must be exact
            may = (coll == "reduce" and rank != ROOT) or (coll == "bcast" and rank != SWITCHER)
            if not may:
                failures.append(f"{label}: returned without an error")
            exact(label + " (returned)", mine, call)
        elif kind not in RAISED:
            failures.append(f"{label}: raised {kind} ({msg[:200]})")
        if took > timeout + 10:
            failures.append(f"{label}: took {took:.1f} s (deadline {timeout} s)")
        world.Barrier()  # every rank gave up (or learnt that another did)
        a.fill(4)
        k, msg, _ = outcome(lambda: a.run(ctx, "blocking"))
        if k != "CommunicatorRevoked":
            failures.append(f"{label}: the next call raised {k or 'nothing'} ({msg[:200]})")
    k, msg, _ = outcome(ctx.Free)
    if k:
        failures.append(f"{label}: Free raised {k}: {msg[:200]}")


def scenario_registry() -> None:
    """Every (algorithm, collective) pair of the registry, blocking; ``native`` with the
    every-call check (with the first-call check its contract is MPI's: none)."""
    timeout = float(os.environ["BMLMPI_TIMEOUT"])
    for coll in COLLECTIVES:
        if coll == "alltoall" and size != ALLTOALL_RANKS:
            continue
        for algorithm in bmlmpi.algorithms(coll):
            if algorithm == "auto":  # a choice among the others (the auto scenario)
                continue
            check = "every-call" if algorithm == "native" else "first-call"
            switch(algorithm, coll, CHANGES[coll], "blocking", 60 * size, timeout, check)


def tier_cases(algorithm: str, changes: tuple[str, ...]) -> None:
    timeout = float(os.environ["BMLMPI_TIMEOUT"])
    for form in ("blocking", "nonblocking", "persistent"):
        for change in changes:
            switch(algorithm, "allreduce", change, form, 1000, timeout)
        for coll, change in (("reduce_scatter", "count"), ("allgather", "count"),
                             ("reduce", "op")):
            switch(algorithm, coll, change, form, 1000 // size, timeout)


def scenario_shm() -> None:
    """Issue item 1 on ``shm``: the allreduce's op, count and dtype; Reduce_scatter_block,
    Allgather and Reduce; blocking, non-blocking and persistent."""
    tier_cases("shm", ("op", "count", "dtype"))


def scenario_hierarchical() -> None:
    """Issue item 1 on ``hierarchical`` within one node (its node tier in shared memory)."""
    tier_cases("hierarchical", ("op",))


def scenario_auto() -> None:
    """Issue item 1 with ``auto`` at 262,144 float64 (the shared-memory tier's size, where
    the calibration measured shared memory: the launch gives it a cache of its own). The
    others run MAX, which auto never gives to MPI's own call, so they run a schedule
    whatever the calibration measured; rank SWITCHER runs SUM."""
    # 2 MiB calls: a deadline that an oversubscribed, loaded machine meets on the good calls
    timeout = max(float(os.environ["BMLMPI_TIMEOUT"]), 10.0)
    # the calibration is measured once, under a deadline that a loaded machine meets, and
    # read from the launch's cache by every communicator after it: a communicator takes it
    # after its first auto call with a choice to make
    warm = bmlmpi.Communicator(world, algorithm="auto", timeout=max(timeout, 300))
    ones = np.ones(262_144)
    warm.Allreduce(ones, np.empty_like(ones))
    warm.Free()
    for form in ("blocking", "nonblocking", "persistent"):
        switch("auto", "allreduce", "op, MAX first", form, 262_144, timeout)


class SlowRefusal:
    """A receive buffer whose refusal takes a while: the accepting rank has passed the
    notice check of its call before the others' notices arrive."""

    def __array__(self, *args, **kwargs):
        time.sleep(1.0)
        raise TypeError("this receive buffer is refused (on purpose, after 1 s)")


def scenario_refuse() -> None:
    """Issue item 7: rank SWITCHER runs a signature agreed before while every other rank
    refuses its arguments, at the first call after a repair (the node tier is set up again
    on the repaired communicator): every rank raises within the deadline, the others'
    refusal as their own error, SWITCHER's as RemoteArgumentError naming a refusing rank
    (DeadlineExceeded where the notice came too late). Blocking and non-blocking;
    ``hierarchical`` (one node) and ``shm``."""
    timeout = float(os.environ["BMLMPI_TIMEOUT"])
    m = 4
    for algorithm in ("hierarchical", "shm"):
        for form in ("blocking", "nonblocking"):
            label = f"{algorithm} refuse {form} N={size}"
            ctx = bmlmpi.Communicator(world, algorithm=algorithm, timeout=timeout)
            s = Signature("reduce_scatter", (m, np.float64, MPI.SUM))
            s.fill(0)
            s.run(ctx, form)
            exact(label, s, 0)
            for call, refusers in ((1, {SWITCHER}), (2, set(range(size)) - {SWITCHER})):
                s.fill(call)
                if rank in refusers:
                    def refused():
                        args = (s.send, SlowRefusal(), MPI.SUM)
                        if form == "blocking":
                            ctx.Reduce_scatter_block(*args)
                        else:
                            ctx.Ireduce_scatter_block(*args).Wait()
                    kind, msg, took = outcome(refused)
                    want = ("TypeError",)
                else:
                    kind, msg, took = outcome(lambda: s.run(ctx, form))
                    want = ("RemoteArgumentError", "DeadlineExceeded")
                cases.append({"label": f"{label} call {call}", "algorithm": algorithm,
                              "form": form, "outcome": kind or "returned"})
                if kind not in want:
                    failures.append(f"{label} call {call}: raised {kind or 'nothing'} "
                                    f"({msg[:200]}), wanted {'/'.join(want)}")
                if took > timeout + 5:
                    failures.append(f"{label} call {call}: took {took:.1f} s")
                world.Barrier()
            # the communicator goes on (after a refusal) or is revoked (after a deadline)
            s.fill(3)
            k, msg, _ = outcome(lambda: s.run(ctx, form))
            if k not in ("", "CommunicatorRevoked"):
                failures.append(f"{label}: the next call raised {k}: {msg[:200]}")
            elif not k:
                exact(label + " next call", s, 3)
            k, msg, _ = outcome(ctx.Free)
            if k:
                failures.append(f"{label}: Free raised {k}: {msg[:200]}")


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
    print("SWITCH " + json.dumps({"rank": rank, "failures": failures, "cases": cases}),
          flush=True)
