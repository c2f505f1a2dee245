"""Rank program of tests/test_contracts_launch.py: the contracts of docs/contracts.md, tried
on real ranks. ``python tests/contracts_ranks.py SCENARIO``; each rank prints one line
``CONTRACT {"rank": r, "failures": [...], ...}`` (a scenario that ends the job on purpose
prints what it reached before)."""
# Every lambda below is called at once by outcome()/expect(), inside its loop iteration.
# ruff: noqa: B023

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import bmlmpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
failures: list[str] = []
notes: dict = {}


def outcome(fn) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "", "", time.monotonic() - start


def data(n: int, call: int, dtype=np.float64) -> np.ndarray:
    """Position-, rank- and call-dependent input whose sum is exact."""
    return ((np.arange(n) * 7 + rank * 3 + call * 5) % 11).astype(dtype)


def want(n: int, call: int, dtype=np.float64) -> np.ndarray:
    return sum(((np.arange(n) * 7 + r * 3 + call * 5) % 11) for r in range(size)).astype(dtype)


def expect(label: str, fn, bad_rank: int | None, local: str, remote: str = "RemoteArgumentError",
           within: float | None = None, name: str | None = None) -> None:
    """``fn`` must raise ``local`` on ``bad_rank`` (every rank when None) and ``remote``
    elsewhere, the remote message naming ``rank {bad_rank}``, within ``within`` seconds."""
    kind, msg, took = outcome(fn)
    mine = local if bad_rank is None or rank == bad_rank else remote
    if kind != mine:
        failures.append(f"{label}: raised {kind or 'nothing'} ({msg[:300]}), wanted {mine}")
    elif mine == remote and bad_rank is not None and f"rank {bad_rank}" not in msg:
        failures.append(f"{label}: {kind} does not name rank {bad_rank}: {msg[:300]}")
    if name and kind == mine and name not in msg and mine != remote:
        failures.append(f"{label}: message lacks {name!r}: {msg[:300]}")
    if within is not None and took > within:
        failures.append(f"{label}: took {took:.1f} s (bound {within} s)")


def good_call(label: str, ctx, kind: str, n: int, call: int) -> None:
    a, b = data(n, call), np.zeros(n)
    k, msg, _ = outcome(lambda: run(ctx, kind, a, b))
    if k:
        failures.append(f"{label}: good call {call} raised {k}: {msg[:300]}")
    elif not np.array_equal(b, want(n, call)):
        failures.append(f"{label}: good call {call} gave {b[:6]} not {want(n, call)[:6]}")


def run(ctx, kind: str, a, b, op=MPI.SUM) -> None:
    if kind == "blocking":
        ctx.Allreduce(a, b, op)
    else:
        ctx.Iallreduce(a, b, op).Wait()


def native_choice(ctx, n: int) -> bool:
    """Whether ``ctx`` runs an allreduce of ``n`` float64 natively (its request says)."""
    from bmlmpi.api import NativeRun
    req = ctx.Iallreduce(np.zeros(n), np.zeros(n))
    native = isinstance(req.run, NativeRun)
    req.Wait()
    return native


def bad_buffers(bad: str, n: int, call: int):
    """(sendbuf, recvbuf) that fail the local check in the way named."""
    a = data(n, call)
    if bad == "read-only":
        b = np.zeros(n)
        b.flags.writeable = False
        return a, b
    if bad == "overlap":
        z = np.zeros(2 * n)
        return z[:n], z[n // 2:n // 2 + n]
    if bad == "non-contiguous":
        return a, np.zeros(2 * n)[::2]
    if bad == "dtype":
        return a, np.zeros(n, np.float32)
    raise ValueError(bad)


# -- scenarios ----------------------------------------------------------------------------
def scenario_arguments() -> None:
    """Items 1, 6, 7 and 5a: bad arguments on one rank, at construction and after a
    signature's first calls; every rank raises quickly, the communicator stays usable."""
    quick = 0.5 * float(os.environ["BMLMPI_TIMEOUT"])
    blocking_mode = os.environ.get("BMLMPI_BLOCKING", "watchdog")
    for value in (float("nan"), float("inf"), 0, -1):
        expect(f"timeout={value} everywhere",
               lambda: bmlmpi.Communicator(world, timeout=value), None, "ValueError",
               within=quick, name="finite number of seconds")
        expect(f"timeout={value} on rank 1",
               lambda: bmlmpi.Communicator(world, timeout=value if rank == 1 else 30), 1,
               "ValueError", within=quick)
    expect("algorithm typo on rank 1 (constructor)",
           lambda: bmlmpi.Communicator(world, algorithm="bmll" if rank == 1 else "bml"), 1,
           "ValueError", within=quick)
    shapes = {4: ("4", "2x2"), 6: ("6", "2x3")}
    if size in shapes:
        one, other = shapes[size]
        expect("topology differs on rank 0",
               lambda: bmlmpi.Communicator(world, algorithm="bml",
                                           topology=one if rank == 0 else other),
               None, "ArgumentMismatch", within=quick, name="topolog")
    n = 4
    for algorithm in ("native", "auto", "bml", "ring"):
        ctx = bmlmpi.Communicator(world, algorithm=algorithm)
        call = 0
        # a blocking MPI_Allreduce cannot be interrupted: that is the watchdog scenario's case
        uninterruptible = blocking_mode == "watchdog" and (
            algorithm == "native" or (algorithm == "auto" and native_choice(ctx, n)))
        for kind in ("blocking", "nonblocking"):
            if kind == "blocking" and uninterruptible:
                continue
            for bad in ("read-only", "overlap", "non-contiguous", "dtype"):
                label = f"{algorithm} {kind} {bad}"
                for _ in range(3):
                    call += 1
                    good_call(label, ctx, kind, n, call)
                call += 1
                a, b = bad_buffers(bad, n, call) if rank == 1 else (data(n, call),
                                                                     np.zeros(n))
                expect(label, lambda: run(ctx, kind, a, b), 1, "BufferSpecError", within=quick)
                call += 1
                good_call(label + " (after)", ctx, kind, n, call)
        if uninterruptible:
            ctx.Free()
            continue
        # the module-level call with an unknown algorithm on one rank
        d = world.Dup()
        for _ in range(2):
            call += 1
            a, b = data(n, call), np.zeros(n)
            bmlmpi.Allreduce(a, b, comm=d, algorithm=algorithm)
        call += 1
        expect(f"{algorithm}: module-level algorithm typo on rank 1",
               lambda: bmlmpi.Allreduce(data(n, call), np.zeros(n), comm=d,
                                        algorithm="bmll" if rank == 1 else algorithm),
               1, "ValueError", within=quick)
        call += 1
        a, b = data(n, call), np.zeros(n)
        k, msg, _ = outcome(lambda: bmlmpi.Allreduce(a, b, comm=d, algorithm=algorithm))
        if k or not np.array_equal(b, want(n, call)):
            failures.append(f"{algorithm}: module-level call after the typo: {k} {msg[:200]}")
        d.Free()
        ctx.Free()
    # item 2, native: the every-call check catches a rank switching to a checked signature
    ctx = bmlmpi.Communicator(world, algorithm="native", check="every-call")
    x, y = np.ones(8), np.zeros(8)
    ctx.Allreduce(x, y, MPI.SUM)
    ctx.Allreduce(x, y, MPI.MAX)
    expect("every-call: rank 1 switches op", lambda: ctx.Allreduce(
        x, y, MPI.SUM if rank == 1 else MPI.MAX), None, "ArgumentMismatch", within=quick)
    expect("every-call: rank 1 read-only", lambda: ctx.Allreduce(
        *bad_buffers("read-only", 8, 0)) if rank == 1 else ctx.Allreduce(x, y), 1,
        "BufferSpecError", within=quick)
    good_call("every-call after", ctx, "blocking", 8, 1)
    ctx.Free()


def scenario_switch() -> None:
    """Item 2: one rank switches to another signature it already ran (the first-call check
    does not see it): no rank may return a wrong result; every rank raises within its
    deadline, and the communicator is revoked afterwards."""
    timeout = float(os.environ["BMLMPI_TIMEOUT"])
    for algorithm, change in (("bml", "op"), ("ring", "count"), ("tree", "dtype")):
        if True:
            ctx = bmlmpi.Communicator(world, algorithm=algorithm)
            sigs = {"op": [(8, np.float64, MPI.SUM), (8, np.float64, MPI.MAX)],
                    "count": [(8, np.float64, MPI.SUM), (16, np.float64, MPI.SUM)],
                    "dtype": [(8, np.float64, MPI.SUM), (8, np.int64, MPI.SUM)]}[change]
            for n, dt, op in sigs:
                x, y = np.ones(n, dt), np.zeros(n, dt)
                ctx.Allreduce(x, y, op)
            n, dt, op = sigs[0] if rank == 1 else sigs[1]
            x, y = (np.arange(n) + rank).astype(dt), np.zeros(n, dt)
            kind, msg, took = outcome(lambda: ctx.Allreduce(x, y, op))
            label = f"{algorithm} switch {change}"
            if kind not in ("DeadlineExceeded", "CommunicatorRevoked"):
                failures.append(f"{label}: raised {kind or 'nothing'} ({msg[:200]}); y={y[:4]}")
            if took > timeout + 10:
                failures.append(f"{label}: took {took:.1f} s")
            world.Barrier()  # every rank gave up (or learnt that another did)
            k, _, _ = outcome(lambda: ctx.Allreduce(np.ones(8), np.zeros(8)))
            if k != "CommunicatorRevoked":
                failures.append(f"{label}: the next call raised {k or 'nothing'}")
            ctx.Free()


def scenario_late() -> None:
    """Item 3: rank 1 arrives ``timeout + 2`` s late at call 3; the others raise
    DeadlineExceeded, reuse recvbuf, and nothing writes it afterwards."""
    timeout = float(os.environ["BMLMPI_TIMEOUT"])
    n = 6
    for algorithm, kind in (("native", "nonblocking"), ("native", "blocking"),
                            ("bml", "blocking"), ("ring", "nonblocking")):
        label = f"{algorithm} {kind}"
        if (algorithm, kind) == ("native", "blocking") and \
                os.environ.get("BMLMPI_BLOCKING") == "watchdog":
            continue  # MPI_Allreduce itself: the watchdog's case (tests/test_watchdog_launch.py)
        ctx = bmlmpi.Communicator(world, algorithm=algorithm)
        for call in (1, 2):
            good_call(label, ctx, kind, n, call)
        b = np.zeros(n)
        if rank == 1:
            time.sleep(timeout + 2)
            k, msg, _ = outcome(lambda: run(ctx, kind, data(n, 3), b))
            notes[f"{label}: late rank"] = k or "completed"
        else:
            k, msg, _ = outcome(lambda: run(ctx, kind, data(n, 3), b))
            # its own deadline, or another on-time rank's notice that it gave up first
            if k not in ("DeadlineExceeded", "CommunicatorRevoked"):
                failures.append(f"{label}: raised {k or 'nothing'}: {msg[:200]}")
            b[:] = 42
            time.sleep(4)  # rank 1 arrives meanwhile
            if not np.all(b == 42):
                failures.append(f"{label}: recvbuf written after DeadlineExceeded: {b}")
        k, msg, _ = outcome(lambda: run(ctx, kind, data(n, 4), np.zeros(n)))
        if k != "CommunicatorRevoked":
            failures.append(f"{label}: a later call raised {k or 'nothing'} ({msg[:200]})")
        world.Barrier()
        ctx.Free()


def scenario_stopped() -> None:
    """Item 5b: a peer stopped (SIGSTOP) during a call; the others raise DeadlineExceeded
    and end; the job must end (MPI_Finalize bounded)."""
    ctx = bmlmpi.Communicator(world, algorithm="bml")
    for call in (1, 2):
        good_call("stopped", ctx, "blocking", 6, call)
    if rank == 1:
        print("CONTRACT " + json.dumps({"rank": rank, "failures": failures, "stopping": True}),
              flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    k, msg, _ = outcome(lambda: ctx.Allreduce(data(6, 3), np.zeros(6)))
    if k != "DeadlineExceeded":
        failures.append(f"stopped: raised {k or 'nothing'}: {msg[:200]}")


def scenario_watchdog_bad() -> None:
    """Item 1 on the blocking native fast path (watchdog mode): rank 1's read-only recvbuf
    at call 4; the others are inside MPI_Allreduce, which cannot be interrupted: the
    watchdog ends the job at once, naming rank 1 and its error."""
    ctx = bmlmpi.Communicator(world, algorithm="native")
    for call in (1, 2, 3):
        good_call("watchdog", ctx, "blocking", 4, call)
    print("CONTRACT " + json.dumps({"rank": rank, "failures": failures, "reached": 3}),
          flush=True)
    a, b = bad_buffers("read-only", 4, 4) if rank == 1 else (data(4, 4), np.zeros(4))
    k, msg, _ = outcome(lambda: ctx.Allreduce(a, b))
    print(f"RAISED rank {rank} {k}: {msg[:200]}", flush=True)
    time.sleep(float(os.environ["BMLMPI_TIMEOUT"]) * 3)  # the watchdog ends the job first


def scenario_ft() -> None:
    """Items 1 and 5c on the fault-tolerant communicator (under --ft)."""
    quick = 0.5 * float(os.environ["BMLMPI_TIMEOUT"])
    expect("ft: timeout < hang_timeout",
           lambda: bmlmpi.Communicator(world, fault_tolerant=True, timeout=5, hang_timeout=10),
           None, "ValueError", within=quick, name="hang_timeout")
    for algorithm in ("native", "bml"):
        ctx = bmlmpi.Communicator(world, algorithm=algorithm, fault_tolerant=True, timeout=60,
                                  hang_timeout=20)
        call = 0
        for kind in ("blocking", "nonblocking"):
            for bad in ("read-only", "dtype"):
                label = f"ft {algorithm} {kind} {bad}"
                for _ in range(3):
                    call += 1
                    good_call(label, ctx, kind, 4, call)
                call += 1
                a, b = bad_buffers(bad, 4, call) if rank == 1 else (data(4, call), np.zeros(4))
                expect(label, lambda: run(ctx, kind, a, b), 1, "BufferSpecError", within=quick)
                call += 1
                good_call(label + " (after)", ctx, kind, 4, call)
        ctx.Free()


def scenario_ft_lag() -> None:
    """Item 4 under --ft: four non-blocking calls of different sizes outstanding; the victim
    (the last rank) dies before starting its third, rank 0 starts its last two 0.3 s late.
    Every survivor must complete every call: calls 1 and 2 with or without the victim's
    input (whether they committed before the failure), calls 3 and 4 over the survivors.
    The algorithm is ``CONTRACT_ALGORITHM``."""
    algorithm = os.environ["CONTRACT_ALGORITHM"]
    victim = size - 1
    sizes = (5, 1001, 17, 4099)
    ctx = bmlmpi.Communicator(world, algorithm=algorithm, fault_tolerant=True, timeout=60,
                              hang_timeout=10)
    ctx.Allreduce(np.ones(4), np.zeros(4))  # every rank is in before the failure
    outs, reqs = [], []
    for i, n in enumerate(sizes):
        if i == 2 and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == 2 and rank == 0:
            time.sleep(0.3)
        out = np.zeros(n)
        reqs.append(ctx.Iallreduce(data(n, i), out))
        outs.append(out)
    k, msg, _ = outcome(lambda: [r.Wait() for r in reqs])
    if k:
        failures.append(f"ft lag {algorithm}: {k}: {msg[:300]}")
    for i, (n, out) in enumerate(zip(sizes, outs, strict=True)):
        survivors = sum(((np.arange(n) * 7 + r * 3 + i * 5) % 11)
                        for r in range(size) if r != victim)
        ok = np.array_equal(out, survivors) or (i < 2 and np.array_equal(out, want(n, i)))
        if not ok:
            failures.append(f"ft lag {algorithm}: call {i + 1} gave {out[:4]}")
    notes["failed"] = list(ctx.failed)


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
    print("CONTRACT " + json.dumps({"rank": rank, "failures": failures, "notes": notes}),
          flush=True)
    if sys.argv[1] in ("ft", "ft_lag"):
        from bmlmpi import ft
        ft.finish(0, timeout=10)
