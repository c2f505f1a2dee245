"""The program each rank runs inside its namespace (started by ``mpiexec`` through ``run``).

    python -m perf.testbed.ranks check --kind bcube --shape 3x3 --bytes 4194304 --algorithm bml
    python -m perf.testbed.ranks bench --kind bcube --shape 3x3 --bytes 33554432 --reps 5 \
        --algorithms bml,native --json out.json
    python -m perf.testbed.ranks steps --kind bcube --shape 3x3 --bytes 33554432 --reps 2 \
        --algorithm bml

``check``: (1) each rank exchanges a block with every 1-hop neighbour, one level at a time, and
reads its own NIC counters around each level, which proves the kernel routes send each level's
traffic out of that level's NIC; (2) one allreduce of position-dependent data, compared exactly
with the expected sum, with the NIC counters around it.
``bench``: per algorithm, warm-up calls, then timed repetitions (each a barrier, the call, and the
slowest rank's time), with the NIC and loopback counters around the timed calls. ``--collective``
picks the call: the allreduce of ``--bytes`` (default), ``reduce_scatter`` (``Reduce_scatter_block``
of a ``--bytes`` vector: each rank keeps its 1/N block) or ``allgather`` (each rank gives a 1/N
block of a ``--bytes`` result): BML's two halves, each with half the allreduce's bytes; or
``alltoall`` (each rank sends ``--bytes`` in all, a block of 1/N of it to every rank). An algorithm
may carry a BCube shape of the ranks, ``bml@2x2x2`` (several ranks a server, started with
``mpi.run(..., per_server=p)``: the shapes of all the ranks, not of the servers).
``pairs``: the intra-node tier: with two ranks a server, every rank swaps ``--bytes`` with its
partner, all at once (timed like ``bench``).
``first``: a new user's first ``bmlmpi.Allreduce`` (the drop-in, ``algorithm="auto"``) of
``--bytes`` on the job's communicator: every rank times ``import bmlmpi`` and the first and
second calls (each from a barrier; the slowest rank's time), and lists what bmlmpi's cache
directory holds afterwards (the calibration and tuning table a later job would read).
``steps``: where one call's time goes: after a warm-up, ``--reps`` calls of ``--algorithm``, each
rank timing (from a common barrier) when every schedule step was posted, when its transfers
completed and when its reductions were done; rank 0 prints every rank's timeline.

Each rank reads its counters from /sys/class/net, which ``ip netns exec`` mounts for the
rank's own namespace. Rank 0 prints one line ``RESULT <json>`` (and writes ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from .topology import build, digits, neighbours, split_label

NATIVE = "native"


def nic_counters() -> dict[str, dict[str, int]]:
    out = {}
    for nic in sorted(os.listdir("/sys/class/net")):
        if nic == "lo":
            continue
        base = Path("/sys/class/net") / nic / "statistics"
        out[nic] = {k: int((base / k).read_text()) for k in ("tx_bytes", "rx_bytes")}
    return out


def diff(before: dict, after: dict) -> dict:
    return {nic: {k: after[nic][k] - before[nic][k] for k in after[nic]} for nic in after}


def expected_sum(count: int, size: int) -> np.ndarray:
    i = np.arange(count, dtype=np.float64)
    return (1000.0 * size * (size - 1) / 2 + size * (i % 997)).astype(np.float32)


def rank_data(count: int, rank: int) -> np.ndarray:
    # Position- and rank-dependent small integers: exact in float32, a misplaced range fails.
    return (1000.0 * rank + np.arange(count) % 997).astype(np.float32)


COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")


def buffers(collective: str, count: int, rank: int, size: int):
    """(sendbuf, recvbuf, expected result) of one call on ``count`` float32 elements (the
    allreduce's vector; the halves use its N blocks of ``count // size``)."""
    block = count // size
    if collective == "allreduce":
        return rank_data(count, rank), np.zeros(count, np.float32), expected_sum(count, size)
    if collective == "reduce_scatter":
        whole = expected_sum(block * size, size)
        return (rank_data(block * size, rank), np.zeros(block, np.float32),
                whole[rank * block:(rank + 1) * block])
    if collective == "alltoall":
        # rank j's row is rank_data(block · size, j); rank r receives its block r of each
        column = np.concatenate([rank_data(block * size, j)[rank * block:(rank + 1) * block]
                                 for j in range(size)])
        return rank_data(block * size, rank), np.zeros(block * size, np.float32), column
    gathered = np.concatenate([rank_data(block, j) for j in range(size)])
    return rank_data(block, rank), np.zeros(block * size, np.float32), gathered


class Caller:
    """One callable per algorithm name for one collective: ``native`` is MPI's own call
    (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Alltoall), the rest go to
    bmlmpi."""

    METHODS = {"allreduce": "Allreduce", "reduce_scatter": "Reduce_scatter_block",
               "allgather": "Allgather", "alltoall": "Alltoall"}

    def __init__(self, comm: MPI.Comm, kind: str, shape: str, collective: str = "allreduce"):
        self.comm = comm
        self.kind, self.shape = kind, shape
        self.method = self.METHODS[collective]
        self.reduces = collective not in ("allgather", "alltoall")
        self.collective = collective
        self._bml = {}

    def available(self) -> list[str]:
        import bmlmpi  # an import failure must stop the run, not quietly drop algorithms

        return list(bmlmpi.algorithms(self.collective))

    def __call__(self, name: str, send: np.ndarray, recv: np.ndarray) -> None:
        args = (send, recv, MPI.SUM) if self.reduces else (send, recv)
        if name == NATIVE:
            getattr(self.comm, self.method)(*args)
            return
        if name not in self._bml:
            import bmlmpi
            algorithm, topo = split_label(name)
            if topo is None and self.kind == "bcube" and self.comm.Get_size() == build(
                    self.kind, self.shape).servers:
                # One rank a server: the BCube shape names the network for bml; on the
                # Fat-Tree twin bml still runs the same (default) factorisation over the one
                # NIC. With several ranks a server a shape comes with the label.
                topo = self.shape
            self._bml[name] = bmlmpi.Communicator(self.comm, algorithm=algorithm,
                                                  topology=topo)
        getattr(self._bml[name], self.method)(*args)


def loopback_counters() -> dict[str, int]:
    """The namespace's loopback byte counters: where two ranks of one server talk."""
    base = Path("/sys/class/net/lo/statistics")
    return {k: int((base / k).read_text()) for k in ("tx_bytes", "rx_bytes")}


def check(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    net = build(args.kind, args.shape)
    levels = []
    block = np.full(args.neighbour_bytes // 8, rank, dtype=np.float64)
    got = np.empty_like(block)
    for lv in range(net.nics if net.kind == "bcube" else 0):
        peers = neighbours(rank, lv, net.radices)
        # Counters are read before the barrier: a peer that leaves it first may already be
        # sending to this rank.
        before = nic_counters()
        comm.Barrier()
        ok = True
        for peer in peers:
            comm.Sendrecv(block, dest=peer, recvbuf=got, source=peer)
            ok &= bool(np.all(got == peer))
        comm.Barrier()
        levels.append({"level": lv, "peers": peers, "data_ok": ok,
                       "nics": diff(before, nic_counters())})
    count = args.bytes // 4
    send, recv = rank_data(count, rank), np.zeros(count, dtype=np.float32)
    run = Caller(comm, args.kind, args.shape)
    run(args.algorithm, send, recv)  # warm-up: connections, compilation
    recv[:] = 0
    before = nic_counters()
    comm.Barrier()
    t0 = time.perf_counter()
    run(args.algorithm, send, recv)
    elapsed = time.perf_counter() - t0
    comm.Barrier()
    nics = diff(before, nic_counters())
    mine = {"rank": rank, "digits": list(digits(rank, net.radices)) if net.kind == "bcube"
            else [rank], "levels": levels, "allreduce_ok": bool(np.array_equal(
                recv, expected_sum(count, size))), "allreduce_nics": nics, "seconds": elapsed}
    return {"mode": "check", "algorithm": args.algorithm, "bytes": args.bytes,
            "ranks": comm.gather(mine, root=0)}


def bench(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    count = args.bytes // 4
    send, recv, expected = buffers(args.collective, count, rank, size)
    run = Caller(comm, args.kind, args.shape, args.collective)
    available = run.available()
    results = []
    for name in args.algorithms.split(","):
        if name != NATIVE and split_label(name)[0] not in available:
            results.append({"algorithm": name, "skipped": f"not in bmlmpi.algorithms(): "
                                                          f"{available}"})
            continue
        for _ in range(args.warmup):
            run(name, send, recv)
        ok = bool(np.array_equal(recv, expected))
        before, lo_before = nic_counters(), loopback_counters()
        cpu0 = time.process_time()
        comm.Barrier()
        times = []
        for _ in range(args.reps):
            comm.Barrier()
            t0 = time.perf_counter()
            run(name, send, recv)
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        comm.Barrier()
        nics = diff(before, nic_counters())
        lo_after = loopback_counters()
        loopback = {k: lo_after[k] - lo_before[k] for k in lo_after}
        cpu = comm.allreduce(time.process_time() - cpu0, op=MPI.SUM)
        all_ok = comm.allreduce(ok, op=MPI.LAND)
        # Ranks of one server read the same namespace's counters (each server appears
        # once per rank on it).
        results.append({"algorithm": name, "seconds": times, "correct": all_ok,
                        "rank_cpu_s_per_call": cpu / args.reps,
                        "nics": comm.gather(nics, root=0),
                        "loopback": comm.gather(loopback, root=0)})
    return {"mode": "bench", "collective": args.collective, "bytes": args.bytes,
            "reps": args.reps, "warmup": args.warmup,
            "mpi": MPI.Get_library_version().splitlines()[0], "ranks": size,
            "results": results}


def first(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    comm.Barrier()
    t0 = time.perf_counter()
    import bmlmpi
    from bmlmpi import config
    imported = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    count = args.bytes // 4
    send, recv = rank_data(count, comm.Get_rank()), np.zeros(count, np.float32)
    calls = []
    for _ in range(2):
        comm.Barrier()
        t0 = time.perf_counter()
        bmlmpi.Allreduce(send, recv, comm=comm)
        calls.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    correct = comm.allreduce(bool(np.array_equal(recv, expected_sum(count, comm.Get_size()))),
                             op=MPI.LAND)
    cache = config.cache_dir()
    held = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()
                  and "kernels" not in p.parts) if cache.exists() else []
    settings = {k: v for k, v in os.environ.items() if k.startswith("BMLMPI_")}
    return {"mode": "first", "bytes": args.bytes, "ranks": comm.Get_size(),
            "import_s": imported, "first_call_s": calls[0], "second_call_s": calls[1],
            "correct": correct, "cache_dir": str(cache), "cache_files": held,
            "bmlmpi_settings": settings,
            "mpi": MPI.Get_library_version().splitlines()[0]}


def pairs(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    """Every rank swaps ``--bytes`` with its partner on the same server (rank ^ 1; two ranks a
    server), all servers at once: the intra-node tier's speed under the same load as a
    hierarchical local step (float32 payload, the slowest pair's time)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size % 2:
        raise SystemExit("pairs: needs two ranks a server (an even number of ranks)")
    peer = rank ^ 1
    send = np.full(args.bytes // 4, rank, dtype=np.float32)
    got = np.empty_like(send)
    times = []
    for i in range(args.warmup + args.reps):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Sendrecv(send, dest=peer, recvbuf=got, source=peer)
        t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= args.warmup:
            times.append(t)
    ok = comm.allreduce(bool(np.all(got == peer)), op=MPI.LAND)
    return {"mode": "pairs", "bytes": args.bytes, "seconds": times, "correct": ok}


def steps(args: argparse.Namespace, comm: MPI.Comm) -> dict:
    from bmlmpi import execute

    events: list[tuple[str, int, float]] = []

    class Timeline(execute.RunObserver):
        def post(self, run: execute.Run, lane: int) -> None:
            events.append(("posted", run.posting_step(lane), time.perf_counter()))

        def received(self, run: execute.Run, lane: int) -> None:
            events.append(("transferred", run.posting_step(lane), time.perf_counter()))

        def complete(self, run: execute.Run, lane: int) -> None:
            events.append(("reduced", run.posting_step(lane), time.perf_counter()))

    count = args.bytes // 4
    send, recv = rank_data(count, comm.Get_rank()), np.zeros(count, dtype=np.float32)
    run = Caller(comm, args.kind, args.shape)
    run(args.algorithm, send, recv)  # warm-up: connections, compilation
    calls = []
    with execute.observing(Timeline()):
        for _ in range(args.reps):
            events.clear()
            comm.Barrier()
            t0 = time.perf_counter()
            run(args.algorithm, send, recv)
            mine = [(kind, step, round(t - t0, 4)) for kind, step, t in events]
            calls.append(comm.gather(mine, root=0))
    ok = comm.allreduce(bool(np.array_equal(recv, expected_sum(count, comm.Get_size()))),
                        op=MPI.LAND)
    return {"mode": "steps", "algorithm": args.algorithm, "bytes": args.bytes, "correct": ok,
            "calls": calls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.testbed.ranks")
    p.add_argument("mode", choices=["check", "bench", "steps", "pairs", "first"])
    p.add_argument("--kind", choices=["bcube", "fattree"], required=True)
    p.add_argument("--shape", required=True)
    p.add_argument("--bytes", type=int, default=4 << 20)
    p.add_argument("--neighbour-bytes", type=int, default=1 << 20)
    p.add_argument("--algorithm", default=NATIVE)
    p.add_argument("--algorithms", default="bml,ring,native")
    p.add_argument("--collective", choices=COLLECTIVES, default="allreduce")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    out = {"check": check, "bench": bench, "steps": steps, "pairs": pairs,
           "first": first}[args.mode](args, comm)
    if comm.Get_rank() == 0:
        text = json.dumps(out)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text)
        print("RESULT " + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
