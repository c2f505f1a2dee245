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


#: The family's collectives the contracts are tried on (mpi4py's method names).
FAMILY = ("Reduce_scatter_block", "Allgather", "Reduce", "Bcast")
#: Their roots: rank 1 (the rank with bad arguments) is where a reduce writes, and a
#: broadcast's receiver.
ROOTS = {"Reduce": 1, "Bcast": 0}


def rdata(n: int, call: int, r: int) -> np.ndarray:
    """Rank ``r``'s input of :func:`data`."""
    return ((np.arange(n) * 7 + r * 3 + call * 5) % 11).astype(np.float64)


def family_args(what: str, m: int, call: int,
                root: int | None = None) -> tuple[tuple, np.ndarray, np.ndarray]:
    """(the call's arguments on this rank, the array it writes, what that array must hold
    afterwards) of a family call of ``m`` elements a block (``root`` None: :data:`ROOTS`)."""
    root = ROOTS.get(what, 0) if root is None else root
    if what == "Reduce_scatter_block":
        out = np.zeros(m)
        whole = sum(rdata(size * m, call, r) for r in range(size))
        return (rdata(size * m, call, rank), out), out, whole[rank * m:(rank + 1) * m]
    if what == "Allgather":
        out = np.zeros(size * m)
        return (rdata(m, call, rank), out), out, np.concatenate(
            [rdata(m, call, r) for r in range(size)])
    if what == "Reduce":
        out = np.zeros(m)
        want_out = sum(rdata(m, call, r) for r in range(size)) if rank == root else out.copy()
        return (rdata(m, call, rank), out, MPI.SUM, root), out, want_out
    buf = rdata(m, call, root) if rank == root else np.zeros(m)
    return (buf, root), buf, rdata(m, call, root)


def family_run(ctx, what: str, kind: str, args: tuple) -> None:
    """One family call: blocking, non-blocking (``I…`` then Wait) or persistent (``…_init``,
    Start, Wait, Free)."""
    if kind == "blocking":
        getattr(ctx, what)(*args)
    elif kind == "nonblocking":
        getattr(ctx, "I" + what.lower())(*args).Wait()
    else:
        req = getattr(ctx, what + "_init")(*args)
        req.Start()
        req.Wait()
        req.Free()


def family_good(label: str, ctx, what: str, kind: str, m: int, call: int,
                root: int | None = None) -> None:
    args, out, expected = family_args(what, m, call, root)
    k, msg, _ = outcome(lambda: family_run(ctx, what, kind, args))
    if k:
        failures.append(f"{label}: good call {call} raised {k}: {msg[:300]}")
    elif not np.array_equal(out, expected):
        failures.append(f"{label}: good call {call} gave {out[:6]} not {expected[:6]}")


def family_arguments(quick: float, blocking_mode: str) -> None:
    """Item 1 for the family: rank 1's read-only output after a signature's first calls,
    blocking, non-blocking and persistent: it raises its own error, every other rank
    RemoteArgumentError at once or (a part that needs nothing from rank 1) its right
    result; the next call is right. (Reduce: rank 1 is the root; Bcast: rank 1 receives.)"""
    m = 5
    for algorithm in ("native", "bml"):
        ctx = bmlmpi.Communicator(world, algorithm=algorithm)
        call = 0
        for what in FAMILY:
            for kind in ("blocking", "nonblocking", "init"):
                if kind == "blocking" and algorithm == "native" and blocking_mode == "watchdog":
                    continue  # mpi4py's blocking call itself: the watchdog's case
                label = f"family {algorithm} {what} {kind}"
                for _ in range(3):
                    call += 1
                    family_good(label, ctx, what, kind, m, call)
                call += 1
                args, out, right = family_args(what, m, call)
                if rank == 1:
                    out.flags.writeable = False
                    expect(label + " read-only", lambda: family_run(ctx, what, kind, args), 1,
                           "BufferSpecError", within=quick)
                else:
                    # a rank whose part of the call needs nothing from rank 1 (a broadcast's
                    # root, a receiver the root feeds, a reduce's rank that only sends) may
                    # complete it, with its right result, before the notice arrives
                    k, msg, took = outcome(lambda: family_run(ctx, what, kind, args))
                    if not (k == "RemoteArgumentError" and "rank 1" in msg
                            or not k and np.array_equal(out, right)):
                        failures.append(f"{label} read-only: raised {k or 'nothing'} "
                                        f"({msg[:200]}), out={out[:6]}")
                    if took > quick:
                        failures.append(f"{label} read-only: took {took:.1f} s")
                world.Barrier()   # a rank that completed learns of the error at its next call
                call += 1
                family_good(label + " (after)", ctx, what, kind, m, call)
        ctx.Free()
    # a rank switching op on a native family call: the every-call check catches it
    ctx = bmlmpi.Communicator(world, algorithm="native", check="every-call")
    x, y = np.ones(4 * size), np.zeros(4)
    ctx.Reduce_scatter_block(x, y, MPI.SUM)
    ctx.Reduce_scatter_block(x, y, MPI.MAX)
    expect("every-call: rank 1 switches a Reduce_scatter_block's op",
           lambda: ctx.Reduce_scatter_block(x, y, MPI.SUM if rank == 1 else MPI.MAX), None,
           "ArgumentMismatch", within=quick)
    family_good("every-call after", ctx, "Reduce_scatter_block", "blocking", 4, 1)
    ctx.Free()


def option_differences(quick: float) -> None:
    """Item 7: options that differ per rank (the algorithm, validation, compression at a
    signature's first call) raise ArgumentMismatch on every rank at once, naming each
    rank's; the communicator stays usable."""
    expect("algorithm auto on rank 0, bml elsewhere",
           lambda: bmlmpi.Communicator(world, algorithm="auto" if rank == 0 else "bml"),
           None, "ArgumentMismatch", within=quick, name="auto")
    expect("validate off on rank 1",
           lambda: bmlmpi.Communicator(world, validate=rank != 1), None, "ArgumentMismatch",
           within=quick, name="/off")
    call = 100
    for algorithm in ("native", "bml"):
        ctx = bmlmpi.Communicator(world, algorithm=algorithm)
        n = 6
        for kind in ("blocking", "nonblocking"):
            for label, mine in (("fp16 on rank 1 only", "fp16" if rank == 1 else None),
                                ("fp16 on rank 1, bf16 elsewhere",
                                 "fp16" if rank == 1 else "bf16"),
                                ("plain on rank 1, fp16 elsewhere",
                                 None if rank == 1 else "fp16")):
                n += 1   # a signature's first call on every rank
                call += 1
                a, b = data(n, call), np.zeros(n)
                expect(f"{algorithm} {kind} {label}",
                       lambda: (ctx.Allreduce(a, b, compression=mine) if kind == "blocking"
                                else ctx.Iallreduce(a, b, compression=mine).Wait()),
                       None, "ArgumentMismatch", within=quick, name="compressed (wire fp16")
                call += 1
                good_call(f"{algorithm} {kind} {label} (after)", ctx, kind, n, call)
        call += 1
        a, b = data(n, call), np.zeros(n)
        k, msg, _ = outcome(lambda: ctx.Allreduce(a, b, compression="fp16"))
        if k or not np.array_equal(b, want(n, call)):
            failures.append(f"{algorithm}: fp16 on every rank: {k} {msg[:200]} {b[:4]}")
        ctx.Free()


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
    family_arguments(quick, blocking_mode)
    option_differences(quick)


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
    switch_family(timeout)


def switch_family(timeout: float) -> None:
    """Item 2 for the family's schedules and a persistent allreduce: the same contract."""
    def blocks(m):  # a reduce-scatter of m elements a block
        return lambda ctx, x: ctx.Reduce_scatter_block(x + np.ones(size * m), np.zeros(m))

    def slots(m):  # an allgather of m elements a slot
        return lambda ctx, x: ctx.Allgather(x + np.ones(m), np.zeros(size * m))

    def reduce(op):
        return lambda ctx, x: ctx.Reduce(x + np.ones(8), np.zeros(8), op, 0)

    cases = (("bml", "Reduce_scatter_block count", blocks(4), blocks(8)),
             ("ring", "Allgather count", slots(4), slots(8)),
             ("tree", "Reduce op", reduce(MPI.SUM), reduce(MPI.MAX)))
    for algorithm, change, first, second in cases:
        ctx = bmlmpi.Communicator(world, algorithm=algorithm)
        first(ctx, 0)
        second(ctx, 0)
        label = f"{algorithm} switch {change}"
        kind, msg, took = outcome(lambda: (first if rank == 1 else second)(ctx, rank))
        if kind == "" and what_returns_nothing(change):
            kind = "DeadlineExceeded"   # its sends went out; it receives no result
        switched(label, ctx, kind, msg, took, timeout)
    # persistent allreduces (bml): each start of its own signature's tags
    ctx = bmlmpi.Communicator(world, algorithm="bml")
    short = ctx.Allreduce_init(np.ones(8), np.zeros(8))
    long = ctx.Allreduce_init(np.ones(16), np.zeros(16))
    for req in (short, long):
        req.Start()
        req.Wait()
    mine = short if rank == 1 else long
    kind, msg, took = outcome(lambda: (mine.Start(), mine.Wait()))
    switched("bml switch Allreduce_init count", ctx, kind, msg, took, timeout)


def what_returns_nothing(change: str) -> bool:
    """Whether this rank's part of the call is sends only (a reduce's leaves may complete
    them and return: they have no result to get wrong)."""
    return change.startswith("Reduce ") and rank != 0


def switched(label: str, ctx, kind: str, msg: str, took: float, timeout: float) -> None:
    """What must hold after a rank switched signature: every rank raised within its deadline,
    and the communicator is revoked; frees ``ctx``."""
    if kind not in ("DeadlineExceeded", "CommunicatorRevoked"):
        failures.append(f"{label}: raised {kind or 'nothing'} ({msg[:200]})")
    if took > timeout + 10:
        failures.append(f"{label}: took {took:.1f} s")
    world.Barrier()
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
    late_family(timeout)


def join_native(comm, what: str, args: tuple) -> None:
    """Join, with mpi4py's own non-blocking call on ``comm``, the call bmlmpi's native family
    makes for ``what`` (an allgather is an Allgatherv of bytes, a broadcast one of bytes)."""
    if what == "Allgather":
        send, out = args
        n = send.nbytes
        comm.Iallgatherv([send, MPI.BYTE], [out.view(np.uint8), [n] * size,
                                            [n * r for r in range(size)], MPI.BYTE]).Wait()
    elif what == "Bcast":
        comm.Ibcast([args[0], MPI.BYTE], args[1]).Wait()
    else:
        getattr(comm, "I" + what.lower())(*args).Wait()


def late_family(timeout: float) -> None:
    """Item 3 for the family's native calls and a native persistent allreduce: rank 1 is
    late; the others raise, write 42 into every output, and rank 1 then joins the abandoned
    MPI calls itself on the data communicator (what a late rank that joined in the instant
    before the notice arrived does): MPI completes them on the others, and must write
    memory bmlmpi holds, not the caller's. Non-blocking and persistent; with
    BMLMPI_BLOCKING=polled also a blocking call (a polled non-blocking one inside)."""
    m = 3
    polled = os.environ.get("BMLMPI_BLOCKING") == "polled"
    for kind in ("nonblocking", "blocking") if polled else ("nonblocking",):
        ctx = bmlmpi.Communicator(world, algorithm="native")
        label = f"late native family {kind}"
        for call in (1, 2):
            for what in FAMILY:
                family_good(label, ctx, what, kind, m, call, root=0)
        held = np.zeros(m)   # the persistent allreduce's recvbuf
        persistent = ctx.Allreduce_init(data(m, 0), held)
        persistent.Start()
        persistent.Wait()
        names = FAMILY if kind == "nonblocking" else FAMILY[:1]
        calls = [family_args(what, m, 3, root=0) for what in names]
        if rank == 1:
            time.sleep(timeout + 2)
            for what, (args, _, _) in zip(names, calls, strict=True):
                join_native(ctx.comm, what, args)
            if kind == "nonblocking":
                # the MPI library's persistent request itself (made at Allreduce_init)
                persistent.compiled.req.Start()
                persistent.compiled.req.Wait()
            world.Barrier()
            world.Barrier()
        else:
            outs = [out for _, out, _ in calls]
            if kind == "nonblocking":
                reqs = [getattr(ctx, "I" + what.lower())(*args)
                        for what, (args, _, _) in zip(names, calls, strict=True)]
                persistent.Start()
                waits = [r.Wait for r in reqs] + [persistent.Wait]
                names = (*names, "Allreduce_init")
                outs.append(held)
            else:
                waits = [lambda: ctx.Reduce_scatter_block(*calls[0][0])]
            expected = [want_out for _, _, want_out in calls] + [want(m, 0)]
            for what, wait, out, right in zip(names, waits, outs, expected, strict=False):
                k, msg, _ = outcome(wait)
                # a call that completed before the deadline (a broadcast at its root and the
                # root's direct receivers) returns with its result
                if not (k in ("DeadlineExceeded", "CommunicatorRevoked")
                        or (not k and np.array_equal(out, right))):
                    failures.append(f"{label}: {what} raised {k or 'nothing'}: {msg[:200]} "
                                    f"{out}")
            for out in outs:
                out[:] = 42
            world.Barrier()   # MPI progresses here: the calls rank 1 joined complete
            time.sleep(1)
            world.Barrier()
            for what, out in zip(names, outs, strict=True):
                if not np.all(out == 42):
                    failures.append(f"{label}: {what} wrote the caller's buffer after "
                                    f"DeadlineExceeded: {out}")
        ctx.Free()


def scenario_stopped() -> None:
    """Item 5b: a peer stopped (SIGSTOP) during a call; the others raise DeadlineExceeded
    (or CommunicatorRevoked naming the other waiting rank, when that rank's deadline came
    first) and end; the job must end (MPI_Finalize bounded)."""
    ctx = bmlmpi.Communicator(world, algorithm="bml")
    for call in (1, 2):
        good_call("stopped", ctx, "blocking", 6, call)
    if rank == 1:
        print("CONTRACT " + json.dumps({"rank": rank, "failures": failures, "stopping": True}),
              flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    k, msg, _ = outcome(lambda: ctx.Allreduce(data(6, 3), np.zeros(6)))
    other = 2 - rank
    revoked_by_other = (k == "CommunicatorRevoked"
                        and f"rank {other} gave up call 3 at its deadline" in msg)
    if k != "DeadlineExceeded" and not revoked_by_other:
        failures.append(f"stopped: raised {k or 'nothing'}: {msg[:200]}")
    notes["raised"] = k


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


def scenario_watchdog_ahead() -> None:
    """A rank whose part of a call is done goes ahead and rejects its next call while the
    others are still inside MPI in the call before: a blocking native Reduce whose root
    (rank 1) waits for a late rank 2, while rank 0 only sends. The watchdog lets that call
    complete with its right result; ranks 1 and 2 raise RemoteArgumentError naming rank 0
    at the next call (its notice was there before they started it), and the communicator
    goes on."""
    ctx = bmlmpi.Communicator(world, algorithm="native")
    n, root = 4, 1

    def reduce(call: int, send=None) -> np.ndarray:
        out = np.zeros(n)
        ctx.Reduce(data(n, call) if send is None else send, out, MPI.SUM, root)
        return out

    def good(label: str, call: int) -> None:
        got: list[np.ndarray] = []
        k, msg, _ = outcome(lambda: got.append(reduce(call)))
        if k:
            failures.append(f"{label}: call {call} raised {k}: {msg[:300]}")
        elif rank == root and not np.array_equal(got[0], want(n, call)):
            failures.append(f"{label}: call {call} gave {got[0]} not {want(n, call)}")

    for call in (1, 2):  # the first checked, the second on the fast path
        good("before", call)
    if rank == 2:
        time.sleep(3.0)
    start = time.monotonic()
    good("late rank 2", 3)
    notes["call3_s"] = round(time.monotonic() - start, 2)
    # rank 0's own error: MPI.IN_PLACE is the root's alone
    expect("ahead", lambda: reduce(4, MPI.IN_PLACE if rank == 0 else None), 0,
           "BufferSpecError", within=30)
    good("after", 5)


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
        # the family: every call agreed, so every rank raises (none completes its part)
        for what in FAMILY:
            for kind in ("blocking", "nonblocking"):
                label = f"ft {algorithm} {what} {kind}"
                for _ in range(3):
                    call += 1
                    family_good(label, ctx, what, kind, 5, call)
                call += 1
                args, out, _ = family_args(what, 5, call)
                if rank == 1:
                    out.flags.writeable = False
                expect(label + " read-only", lambda: family_run(ctx, what, kind, args), 1,
                       "BufferSpecError", within=quick)
                call += 1
                family_good(label + " (after)", ctx, what, kind, 5, call)
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
