"""OSU-style allreduce latency sweep: ``python -m bmlmpi.cli.bench`` / ``bmlmpi-bench``.

Options and output follow OSU's ``osu_allreduce`` so existing parsers read the tables: sizes
in bytes of MPI_FLOAT data, powers of two from ``-m MIN:MAX`` (default 4:1048576), 1000
iterations and 100 warm-up iterations up to 8 KiB, 100 and 10 above (``-i``/``-x`` set both),
one timed call per iteration followed by a barrier; per-rank average, then average, minimum
and maximum over ranks. ``-f`` adds Min/Max/Iterations, ``-c`` a Validation column (Pass/Fail,
checked on every rank against position-dependent data). One table per algorithm
(``--algorithms bml,native``; all algorithms are measured at each size before the next size,
so they share the machine's conditions, and ``--blocks B`` interleaves them within a size).

The baseline row ``native`` is the MPI library's ``MPI_Allreduce`` exactly as user code calls
it: mpi4py's blocking ``comm.Allreduce(sendbuf, recvbuf, MPI.SUM)`` on the user's communicator
(here ``MPI.COMM_WORLD``), no bmlmpi code on the path. bmlmpi's own pass-through (its
algorithm ``native``: ``MPI_Iallreduce`` on bmlmpi's duplicate communicator, completed by
bmlmpi's polling ``Wait``) is the row ``passthrough``; ``auto`` is the public
``Communicator.Allreduce``; every schedule goes through the same call with its algorithm named.
``--busbw`` adds nccl-tests style bandwidths (algbw = bytes/time, busbw = algbw·2(N−1)/N).
``--collective`` times another collective of the family with the table of its OSU benchmark
(``osu_reduce_scatter``: the size is the whole send buffer, ``Reduce_scatter_block``;
``osu_allgather``: each rank's contribution; ``osu_reduce`` and ``osu_bcast``: the buffer,
root 0), its ``native`` row mpi4py's blocking call of the same name on the user's
communicator, and nccl-tests' busbw for it (reduce-scatter, allgather: algbw·(N−1)/N over the
whole buffer, N times the contribution for allgather; reduce, broadcast: algbw).
``--csv``/``--json`` save every row with the machine, rank count, library versions and the
load average at the start and the end of the run; a ratio-to-native table closes the output
when native is among the algorithms. ``-d cuda`` (OSU's flag) puts both buffers on the GPU as
cupy arrays; every bmlmpi row (``passthrough`` included) then goes through bmlmpi's
device-array path (staging through pinned host memory), and ``native`` does what user code
must do with an MPI that is not CUDA-aware (the embedded wheel): copy to a host array, call
``comm.Allreduce``, copy back; so every time includes the copies to and from the device.
``--overview`` is README command 1's main job: its rows, sizes, iterations and blocks, and the
reading printed after the tables, come from :mod:`.overview`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from .. import __version__, config
from ..api import Communicator
from ..selection import algorithms as implemented
from ..tuner import size_class
from . import overview

LARGE_MESSAGE = 8192
FIELD = 18
#: The sweep's row names beyond bmlmpi's algorithms. ``native`` is the baseline (mpi4py's
#: blocking ``comm.Allreduce`` on the user's communicator); ``passthrough`` is bmlmpi's
#: algorithm ``native`` (its ``MPI_Iallreduce`` on its duplicate, polled).
BASELINE = "native"
PASSTHROUGH = "passthrough"
#: What each row times, saved in the CSV/JSON column ``call``.
CALLS = {BASELINE: "mpi4py comm.Allreduce (blocking, user's communicator)",
         PASSTHROUGH: "bmlmpi algorithm 'native' (MPI_Iallreduce on bmlmpi's duplicate, "
                      "polled Wait)",
         "auto": "bmlmpi Communicator.Allreduce (algorithm 'auto')"}


class SweepTest(NamedTuple):
    """How the sweep times one collective (``--collective``)."""

    title: str    # OSU's test title
    method: str   # the mpi4py method the baseline calls
    #: Timed by :func:`timed_call`'s rows on host or device buffers (``--device``), and the
    #: one ``--overview`` sweeps; False: by :class:`FamilyCase` on host buffers.
    devices: bool = False
    #: What rows time where the words :func:`call_name` derives from ``method`` do not say it.
    calls: dict[str, str] = {}
    #: What a bmlmpi algorithm's row times, ``{name!r}`` its name; None: derived from ``method``.
    algorithm_row: str | None = None


#: ``--collective`` -> how the sweep times it.
COLLECTIVE_TESTS = {
    "allreduce": SweepTest("Allreduce", "Allreduce", devices=True, calls=CALLS,
                           algorithm_row="bmlmpi.Allreduce(..., algorithm={name!r})"),
    "reduce_scatter": SweepTest("Reduce_scatter", "Reduce_scatter_block"),
    "allgather": SweepTest("Allgather", "Allgather"),
    "reduce": SweepTest("Reduce", "Reduce"),
    "bcast": SweepTest("Broadcast", "Bcast"),
    "alltoall": SweepTest("All-to-All Personalized Exchange", "Alltoall"),
}


def sweep_names(collective: str = "allreduce") -> list[str]:
    """The rows the sweep can time: bmlmpi's algorithms for ``collective`` (its ``native``
    renamed ``passthrough``), then the baseline ``native``."""
    return [a for a in implemented(collective) if a != "native"] + [PASSTHROUGH, BASELINE]


def bmlmpi_algorithm(name: str) -> str | None:
    """The bmlmpi algorithm a sweep row runs (None for the baseline, which runs none)."""
    if name == BASELINE:
        return None
    return "native" if name == PASSTHROUGH else name


def _parse_range(text: str) -> tuple[int, int]:
    if ":" in text:
        lo, hi = text.split(":", 1)
        return int(lo or 4), int(hi)
    return 4, int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bmlmpi-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--overview", action="store_true",
                   help="the main job: every schedule but hierarchical, auto and native "
                        "at 8 B - 64 MiB in 4 interleaved blocks, validated, then a reading of "
                        "where bmlmpi is faster and where native is (-i/-x still apply)")
    p.add_argument("-m", "--message-size", metavar="[MIN:]MAX",
                   help="message sizes in bytes, powers of two (default 4:1048576)")
    p.add_argument("-i", "--iterations", type=int, help="timed iterations (default 1000/100)")
    p.add_argument("-x", "--warmup", type=int, help="warm-up iterations (default 100/10)")
    p.add_argument("-f", "--full", action="store_true", help="print min/max and iterations")
    p.add_argument("-c", "--validation", action="store_true", help="check every result")
    p.add_argument("--algorithms",
                   help=f"comma list, or 'all' ({','.join(sweep_names())}); 'native' is "
                        f"mpi4py's blocking comm.Allreduce, 'passthrough' bmlmpi's "
                        f"algorithm 'native' (default bml,native; auto,native for a "
                        f"collective bml does not serve)")
    p.add_argument("--blocks", type=int,
                   help="cut each size's timed iterations into this many blocks, taken by "
                        "every algorithm in turn (default 1: OSU's order)")
    p.add_argument("-d", "--device", choices=["host", "cuda"], default="host",
                   help="where the buffers live (cuda: cupy arrays on the current GPU)")
    p.add_argument("--topology", help="BCube shape for bml, e.g. 3x3 (default BMLMPI_BCUBE)")
    p.add_argument("--collective", default="allreduce", choices=list(COLLECTIVE_TESTS),
                   help="the collective timed, with its OSU benchmark's table "
                        "(default allreduce)")
    p.add_argument("--busbw", action="store_true", help="add algbw/busbw columns (GB/s)")
    p.add_argument("--csv", help="write every row to this CSV file")
    p.add_argument("--json", help="write rows and run metadata to this JSON file")
    p.add_argument("--expect-size", type=int,
                   default=config.get("BMLMPI_EXPECT_SIZE"),
                   help="fail unless the MPI world has exactly this many ranks "
                        "(catches a launcher that started N one-rank worlds)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)
    if args.overview:
        fixed = [flag for flag, value in (("-m", args.message_size),
                                          ("--algorithms", args.algorithms),
                                          ("--blocks", args.blocks),
                                          ("--collective",
                                           not COLLECTIVE_TESTS[args.collective].devices))
                 if value]
        if fixed:
            p.error(f"--overview chooses its own sizes, algorithms and blocks for the "
                    f"allreduce; leave out {', '.join(fixed)}")
        args.message_size = f"{overview.SIZES[0]}:{overview.SIZES[-1]}"
        args.algorithms = ",".join(overview.ALGORITHMS)
        args.blocks, args.full, args.validation = overview.BLOCKS, True, True
    args.message_size = args.message_size or "4:1048576"
    known = sweep_names(args.collective)
    # bml against native, where bml serves the collective (all-to-all: auto against native)
    args.algorithms = args.algorithms or ("bml,native" if "bml" in known else "auto,native")
    args.blocks = 1 if args.blocks is None else args.blocks
    args.min_size, args.max_size = _parse_range(args.message_size)
    if args.blocks < 1:
        p.error(f"--blocks must be at least 1, got {args.blocks}")
    if args.min_size < 1 or args.max_size < args.min_size:
        p.error(f"bad message size range {args.message_size!r}")
    if not COLLECTIVE_TESTS[args.collective].devices and args.device != "host":
        p.error("--collective other than allreduce runs on host buffers only")
    names = known if args.algorithms == "all" else args.algorithms.split(",")
    names = [n.strip().lower() for n in names if n.strip()]
    for n in names:
        if n not in known:
            p.error(f"unknown algorithm {n!r}; the {args.collective} sweep times: "
                    f"{', '.join(known)}")
    args.algorithm_list = names
    return args


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], 1
    while s <= hi:
        if s >= lo:
            out.append(s)
        s *= 2
    return out


def elements(collective: str, nbytes: int, ranks: int) -> int:
    """The float32 elements a ``collective`` sweep row of ``nbytes`` moves: at least one; for
    reduce-scatter the whole send buffer, a whole number of elements per rank (rounded down,
    at least one per rank)."""
    n = max(1, nbytes // 4)
    if collective == "reduce_scatter":
        n = max(ranks, n - n % ranks)
    return n


def size_list(collective: str, lo: int, hi: int, ranks: int) -> list[int]:
    """The sizes in bytes a sweep times, one row each: the powers of two from ``lo`` to
    ``hi`` as :func:`elements` makes them, each once (at 4 ranks a reduce-scatter's 4, 8 and
    16 B are all one 16 B buffer)."""
    out: list[int] = []
    for nbytes in sizes(lo, hi):
        size = elements(collective, nbytes, ranks) * 4
        if size not in out:
            out.append(size)
    return out


def machine_info(comm: MPI.Comm) -> dict[str, Any]:
    import numba

    cores = os.cpu_count() or 1
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": cores,
        "ranks": comm.Get_size(),
        "oversubscribed": comm.Get_size() > cores,
        "mpi_library": MPI.Get_library_version().replace("\0", "").strip().splitlines()[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "mpi4py": __import__("mpi4py").__version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "python": platform.python_version(),
        "bmlmpi": __version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": loadavg(),
    }


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them ('' where unknown)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fill(buf: np.ndarray, rank: int) -> None:
    # Small integers in float32: every partial sum is exact, and a misplaced range shows.
    n = buf.size
    buf[:] = (np.arange(n) % 64) + rank


def _expected(n: int, size: int) -> np.ndarray:
    return ((np.arange(n) % 64) * size + size * (size - 1) // 2).astype(np.float32)


def device_buffers(device: str):
    """(to_device, to_host) for ``device``: identity for host, cupy copies for cuda."""
    if device == "host":
        return (lambda a: a), (lambda a: a)
    from ..kernels import gpu

    if not gpu.gpu_available():
        raise SystemExit("bmlmpi-bench: -d cuda needs cupy and a CUDA device "
                         "(pip install '.[gpu]' in bmlmpi's checkout)")
    import cupy

    return cupy.asarray, cupy.asnumpy


def timed_call(name: str, ctx: Communicator, comm: MPI.Comm, send: Any, recv: Any,
               device: str = "host") -> Callable[[], None]:
    """The call one iteration of row ``name`` times, as user code makes it.

    ``native``: ``comm.Allreduce(send, recv, MPI.SUM)`` on the user's ``comm``, blocking,
    nothing of bmlmpi on the path (on a device, staged through host arrays as user code with
    a non-CUDA-aware MPI must). ``auto``: ``ctx.Allreduce`` when ``ctx``'s algorithm is auto
    (the public call). A named schedule: the blocking call ``bmlmpi.Allreduce(send, recv,
    comm=..., algorithm=name)`` makes (its fast path included). ``passthrough``: bmlmpi's
    ``native`` started and waited on (``Iallreduce(...).Wait()``), which keeps it
    ``MPI_Iallreduce`` polled by bmlmpi, not the blocking fast path.
    """
    if name == BASELINE:
        if device == "host":
            return lambda: comm.Allreduce(send, recv, MPI.SUM)
        _, to_host = device_buffers(device)
        host_recv = np.empty(recv.shape, dtype=recv.dtype)

        def staged() -> None:
            comm.Allreduce(to_host(send), host_recv, MPI.SUM)
            recv.set(host_recv)
        return staged
    algorithm = bmlmpi_algorithm(name)
    if algorithm == "auto" and ctx.algorithm == "auto":
        return lambda: ctx.Allreduce(send, recv, MPI.SUM)
    if name == PASSTHROUGH:
        return lambda: ctx.Iallreduce(send, recv, MPI.SUM, algorithm=algorithm).Wait()
    return lambda: ctx.Allreduce(send, recv, MPI.SUM, algorithm=algorithm)


class FamilyCase:
    """One size of a ``--collective`` sweep: the buffers (float32, position- and
    rank-dependent data), the call each row times, the check of the result, the bytes the
    table's Size column shows and nccl-tests' busbw factor."""

    def __init__(self, collective: str, ctx: Communicator, comm: MPI.Comm, nbytes: int):
        rank, size = comm.Get_rank(), comm.Get_size()
        self.collective = collective
        self.rank, self.root = rank, 0
        n = elements(collective, nbytes, size)
        if collective == "reduce_scatter":
            self.send = np.empty(n, np.float32)
            _fill(self.send, rank)
            self.recv = np.empty(n // size, np.float32)
            block = n // size
            self.expected = _expected(n, size)[rank * block:(rank + 1) * block]
            self.size_bytes, self.bus_bytes = n * 4, n * 4
            self.factor = (size - 1) / size
        elif collective == "allgather":
            self.send = np.empty(n, np.float32)
            _fill(self.send, rank)
            self.recv = np.empty(n * size, np.float32)
            self.expected = np.concatenate([(np.arange(n) % 64 + r).astype(np.float32)
                                            for r in range(size)])
            self.size_bytes, self.bus_bytes = n * 4, n * 4 * size
            self.factor = (size - 1) / size
        elif collective == "reduce":
            self.send = np.empty(n, np.float32)
            _fill(self.send, rank)
            self.recv = np.empty(n, np.float32)
            self.expected = _expected(n, size) if rank == self.root else None
            self.size_bytes = self.bus_bytes = n * 4
            self.factor = 1.0
        elif collective == "alltoall":
            # the size is one rank-pair block (osu_alltoall's); block j of rank r's send
            # buffer holds r and j in every element, so a block at the wrong place fails
            self.send = np.empty(n * size, np.float32)
            _fill(self.send, rank)
            self.send += np.repeat(np.arange(size, dtype=np.float32) * 64, n)
            self.recv = np.empty(n * size, np.float32)
            mine = np.arange(rank * n, (rank + 1) * n) % 64 + rank * 64
            self.expected = np.concatenate([(mine + r).astype(np.float32)
                                            for r in range(size)])
            self.size_bytes, self.bus_bytes = n * 4, n * 4 * size
            self.factor = (size - 1) / size
        else:
            self.send = None
            self.recv = np.empty(n, np.float32)
            self.expected = (np.arange(n) % 64 + self.root).astype(np.float32)
            self.size_bytes = self.bus_bytes = n * 4
            self.factor = 1.0
        # the elements of all ranks' blocks together (Communicator.explain's count)
        self.total = {"reduce_scatter": self.recv.size * size, "allgather": self.recv.size,
                      "alltoall": n * size * size}.get(collective, n)
        self.ctx, self.comm = ctx, comm

    def reset(self) -> None:
        """Before a checked call: a broadcast's receivers hold something else again (else
        a call that moved nothing would pass); the others' inputs never change."""
        if self.collective != "bcast":
            return
        if self.rank == self.root:
            _fill(self.recv, self.rank)
        else:
            self.recv.fill(-1)

    def check(self) -> bool:
        return self.expected is None or bool(np.array_equal(self.recv, self.expected))

    def call(self, name: str) -> Callable[[], None]:
        """The call row ``name`` times (:func:`timed_call`'s rules, for this collective)."""
        send, recv, root, ctx = self.send, self.recv, self.root, self.ctx
        method = COLLECTIVE_TESTS[self.collective].method
        if name == BASELINE:
            own = getattr(self.comm, method)
        else:
            algorithm = bmlmpi_algorithm(name)
            if name == PASSTHROUGH:
                start = getattr(ctx, "I" + method.lower())

                def own(*args: Any) -> None:
                    start(*args, algorithm="native").Wait()
            else:
                mine = getattr(ctx, method)

                def own(*args: Any) -> None:
                    mine(*args, algorithm=algorithm)
        if self.collective in ("reduce_scatter", "allgather", "alltoall"):
            if self.collective == "reduce_scatter":
                return lambda: own(send, recv, MPI.SUM)
            return lambda: own(send, recv)
        if self.collective == "reduce":
            return lambda: own(send, recv, MPI.SUM, root)
        return lambda: own(recv, root)


def tuning_calls(ctx: Communicator, collective: str = "allreduce", nbytes: int = 0) -> int:
    """The calls ``auto`` may spend on one signature of ``collective`` (a work buffer of
    ``nbytes``) before it runs its choice: the job's first ``auto`` call, after which the
    prices are taken and exploring starts afresh, then a key's exploration (each candidate's
    warm-up or settling calls and counted rounds of blocks, :meth:`bmlmpi.tuner.Tuner.
    calls_per_candidate`, over at most ``k`` + 1 candidates, or, with nothing
    priced, every algorithm the collective has, docs/tuning.md; and a runoff of two,
    :meth:`bmlmpi.tuner.Tuner.most_calls`). The sweep gives ``auto`` these on top of its
    warm-up, so that its row times ``auto`` after its tuning calls, as a job's later calls
    run."""
    tuner = ctx.tuning.tuner
    most = max(tuner.k + 1, len(implemented(collective)) - 1)   # (auto is not a candidate)
    return 1 + tuner.most_calls(size_class(nbytes), most)


def measure(ctx: Communicator, algorithms: list[str], nbytes: int, iters: int, skip: int,
            validate: bool, blocks: int = 1, device: str = "host",
            comm: MPI.Comm | None = None, collective: str = "allreduce") -> list[dict[str, Any]]:
    """Time every algorithm at one size; one row per algorithm (:func:`timed_call`: the
    baseline ``native`` runs on ``comm``, the user's communicator, default COMM_WORLD).

    Each algorithm first runs its ``skip`` warm-up iterations (``auto`` also its
    :func:`tuning_calls`), then the ``iters`` timed ones
    are cut into ``blocks`` blocks taken in turn (block 1 of every algorithm, then block 2,
    ...), so a drift in the machine's load during the size hits all algorithms alike. With
    ``blocks=1`` that is OSU's order. ``avg_us`` is the mean over all timed iterations (OSU's
    number); ``median_block_us`` the median of the per-block means, which one disturbed block
    cannot move.
    """
    user_comm = MPI.COMM_WORLD if comm is None else comm
    comm = ctx.comm
    n = elements(collective, nbytes, comm.Get_size())
    if COLLECTIVE_TESTS[collective].devices:
        total = n
        to_device, to_host = device_buffers(device)
        host_send = np.empty(n, dtype=np.float32)
        _fill(host_send, comm.Get_rank())
        send, recv = to_device(host_send), to_device(np.empty(n, dtype=np.float32))
        expected = _expected(n, comm.Get_size()) if validate else None
        calls = {a: timed_call(a, ctx, user_comm, send, recv, device) for a in algorithms}
        size_bytes = bus_bytes = n * 4
        factor = 2 * (comm.Get_size() - 1) / comm.Get_size()

        def reset() -> None:
            pass

        def correct() -> bool:
            return bool(np.array_equal(to_host(recv), expected))
    else:
        case = FamilyCase(collective, ctx, user_comm, nbytes)
        total = case.total
        calls = {a: case.call(a) for a in algorithms}
        size_bytes, bus_bytes, factor = case.size_bytes, case.bus_bytes, case.factor
        reset, correct = case.reset, case.check
    blocks = max(1, min(blocks, iters)) if iters else 1
    bounds = [iters * b // blocks for b in range(blocks + 1)]
    ok = {a: True for a in algorithms}
    times: dict[str, list[float]] = {a: [] for a in algorithms}

    def run(algorithm: str, count: int, timed: bool, check: bool) -> None:
        call = calls[algorithm]
        for i in range(count):
            checked = check and i in (0, count - 1)
            if checked:
                reset()
            t0 = MPI.Wtime()
            call()
            t1 = MPI.Wtime()
            if timed:
                times[algorithm].append(t1 - t0)
            if checked:
                ok[algorithm] &= correct()
            comm.Barrier()

    for a in algorithms:
        run(a, skip + (tuning_calls(ctx, collective, size_bytes) if a == "auto" else 0),
            False, validate)
    for b in range(blocks):
        for a in algorithms:
            run(a, bounds[b + 1] - bounds[b], True, validate)
    size = comm.Get_size()
    rows = []
    for a in algorithms:
        t = times[a]
        block_means = [float(np.mean(t[bounds[b]:bounds[b + 1]])) * 1e6
                       for b in range(blocks) if bounds[b + 1] > bounds[b]]
        mine = np.array([sum(t) * 1e6 / max(iters, 1),
                         float(np.median(block_means)) if block_means else 0.0])
        # per block, over the ranks: the mean and the median call (which a few calls slowed
        # by a busy machine do not move); the overview compares rows block by block
        block_medians = [float(np.median(t[bounds[b]:bounds[b + 1]])) * 1e6
                         for b in range(blocks) if bounds[b + 1] > bounds[b]]
        block_sum = np.empty(2 * len(block_means))
        comm.Allreduce(np.array(block_means + block_medians), block_sum, MPI.SUM)
        mn, mx, sm = np.empty(2), np.empty(2), np.empty(2)
        comm.Allreduce(mine, mn, MPI.MIN)
        comm.Allreduce(mine, mx, MPI.MAX)
        comm.Allreduce(mine, sm, MPI.SUM)
        passed = comm.allreduce(ok[a], op=MPI.LAND)
        avg = float(sm[0]) / size
        algbw = bus_bytes / (avg * 1e-6) / 1e9 if avg > 0 else 0.0
        rows.append({
            "algorithm": a, "call": call_name(a, collective), "collective": collective,
            "size": size_bytes, "avg_us": avg, "min_us": float(mn[0]),
            "max_us": float(mx[0]), "iterations": iters, "blocks": blocks,
            "median_block_us": float(sm[1]) / size,
            "block_us": [float(b) / size for b in block_sum[:len(block_means)]],
            "block_median_us": [float(b) / size for b in block_sum[len(block_means):]],
            "validation": ("Pass" if passed else "Fail") if validate else "",
            "device": device,
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * factor if size > 1 else 0.0})
        if a == "auto":  # what auto ran: its last call's (a test holds them equal)
            rows[-1]["chose"] = _auto_ran(ctx, total, collective)
    return rows


def _auto_ran(ctx: Any, total: int, collective: str) -> str:
    """What the auto row's last call ran: the flight recorder's last call where it holds
    one (while ``auto`` times its candidates on a signature's first calls, the candidate of
    that call), else what ``explain`` says the next call runs."""
    recorder = ctx.recorder
    last = recorder.calls()[-1:] if recorder is not None else []
    if last and last[0].get("collective") == collective and last[0].get("asked") == "auto":
        return last[0]["chosen"]
    return ctx.explain(total, np.float32, collective=collective).chosen


def call_name(name: str, collective: str) -> str:
    """What row ``name`` of a ``collective`` sweep times (the CSV/JSON column ``call``)."""
    test = COLLECTIVE_TESTS[collective]
    method = test.method
    if name in test.calls:
        return test.calls[name]
    if test.algorithm_row is not None and name not in (BASELINE, PASSTHROUGH):
        return test.algorithm_row.format(name=name)
    if name == BASELINE:
        return f"mpi4py comm.{method} (blocking, user's communicator)"
    if name == PASSTHROUGH:
        return f"bmlmpi algorithm 'native' (I{method.lower()} on bmlmpi's duplicate, polled Wait)"
    return f"bmlmpi Communicator.{method}(..., algorithm={name!r})"


def format_table(rows: list[dict], args: argparse.Namespace, info: dict) -> str:
    algo = rows[0]["algorithm"] if rows else "?"
    title = COLLECTIVE_TESTS[getattr(args, "collective", "allreduce")].title
    lines = [f"# OSU MPI {title} Latency Test (bmlmpi {__version__}, algorithm: {algo})",
             f"# Ranks: {info['ranks']}{' (oversubscribed)' if info['oversubscribed'] else ''}"
             f"; MPI: {info['mpi_library']}",
             "# Datatype: MPI_FLOAT."]
    if getattr(args, "collective", "allreduce") == "reduce_scatter":
        lines.append("# Size: the whole send buffer, a whole number of floats per rank "
                     "(a size that does not divide is rounded down, at least one float a rank)")
    if rows and rows[0].get("device", "host") != "host":
        how = ("copied to and from host arrays around comm.Allreduce, as user code must with "
               "an MPI that is not CUDA-aware" if algo == BASELINE
               else "staged through pinned host memory")
        lines.append(f"# Buffers on device: {rows[0]['device']} ({how}; times include the "
                     f"copies)")
    # OSU's layout: the size left-aligned in 10 columns, every other field right-aligned
    cols = [("Avg Latency(us)", "avg_us", FIELD, ".2f")]
    if args.full:
        cols += [("Min Latency(us)", "min_us", FIELD, ".2f"),
                 ("Max Latency(us)", "max_us", FIELD, ".2f"), ("Iterations", "iterations", 12, "d")]
    if args.busbw:
        cols += [("Algbw(GB/s)", "algbw_GBps", FIELD, ".3f"),
                 ("Busbw(GB/s)", "busbw_GBps", FIELD, ".3f")]
    if args.validation:
        cols += [("Validation", "validation", 12, "")]
    if rows and "chose" in rows[0]:
        cols += [("Auto chose", "chose", 14, "")]  # what auto ran (Communicator.explain)
    lines.append(f"{'# Size':<10}" + "".join(f"{t:>{w}}" for t, _, w, _ in cols))
    lines += [f"{r['size']:<10d}" + "".join(f"{r[k]:>{w}{f}}" for _, k, w, f in cols)
              for r in rows]
    return "\n".join(lines)


def ratio_table(rows: list[dict], names: list[str]) -> str:
    others = [n for n in names if n != "native"]
    by = {(r["algorithm"], r["size"]): r for r in rows}
    sizes_ = sorted({r["size"] for r in rows})
    coll = rows[0].get("collective", "allreduce") if rows else "allreduce"
    method = COLLECTIVE_TESTS[coll].method
    lines = [f"# Latency ratio to native MPI_{method} (mpi4py comm.{method}, blocking; same "
             "run; < 1 is faster than native)",
             f"{'# Size':<10}" + "".join(f"{n:>{FIELD}}" for n in others)]
    for s in sizes_:
        nat = by[("native", s)]["avg_us"]
        lines.append(f"{s:<10d}" + "".join(
            f"{by[(n, s)]['avg_us'] / nat if nat > 0 else float('nan'):>{FIELD}.3f}"
            for n in others))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if args.expect_size and size != args.expect_size:
        sys.stderr.write(f"bmlmpi-bench: rank {rank}: MPI world has {size} ranks, expected "
                         f"{args.expect_size} (wrong launcher/PMI? e.g. srun --mpi= mismatch "
                         f"starts N separate one-rank worlds)\n")
        return 3
    ctx = Communicator(world, topology=args.topology)
    info = machine_info(world)
    todo = (list(overview.SIZES) if args.overview
            else size_list(args.collective, args.min_size, args.max_size, size))
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm
        bar = tqdm(total=len(todo) * len(args.algorithm_list), file=sys.stderr, unit="case",
                   leave=False, desc="bmlmpi-bench")
    rows = []
    for nbytes in todo:
        large = nbytes > LARGE_MESSAGE
        iters, skip = overview.iterations(nbytes) if args.overview else (
            (100, 10) if large else (1000, 100))
        iters = args.iterations if args.iterations is not None else iters
        skip = args.warmup if args.warmup is not None else skip
        rows += measure(ctx, args.algorithm_list, nbytes, iters, skip, args.validation,
                        args.blocks, args.device, comm=world, collective=args.collective)
        if bar is not None:
            bar.set_postfix_str(f"{nbytes} B")
            bar.update(len(args.algorithm_list))
    if bar is not None:
        bar.close()
    info["loadavg_end"] = loadavg()
    nodes = len(set(world.allgather(MPI.Get_processor_name())))
    failed = any(r["validation"] == "Fail" for r in rows)
    if rank == 0:
        for algo in args.algorithm_list:
            print(format_table([r for r in rows if r["algorithm"] == algo], args, info))
            print()
        if "native" in args.algorithm_list and len(args.algorithm_list) > 1:
            print(ratio_table(rows, args.algorithm_list))
        if args.overview:
            print()
            print(overview.reading(rows, size, info["cores"], nodes, info["oversubscribed"]))
        sys.stdout.flush()
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                keys = list(dict.fromkeys(k for r in rows for k in r))
                w = csv.DictWriter(f, fieldnames=[*keys, *info.keys()])
                w.writeheader()
                for r in rows:
                    w.writerow({**r, **info})
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "argv": sys.argv, "rows": rows}, f, indent=1)
    ctx.Free()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except Exception:
        # One rank failing must not leave the others waiting out their deadlines.
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
