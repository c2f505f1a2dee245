"""Kernel benchmark: each back end's reduction as a fraction of the machine's memory bandwidth.

    python -m bmlmpi.kernels.bench [--sizes 4K:256M] [--dtype float32] [--op sum]
                                   [--sources 1] [--repeat 7] [--json FILE]

In the same run and for every size it measures a STREAM-like reference with the same access
pattern as ``reduce_into`` (read two arrays, write one): numpy ``np.add(a, b, out=c)`` and a
numba triad ``c[i] = a[i] + s * b[i]``, on float32 arrays of the same byte size; the faster of
the two is the reference bandwidth. Each
back end's reduction is then reported as bytes moved per second, with ``(2 + sources)``
arrays moved per call (read ``dst`` and every source, write ``dst``), and as a fraction of the
reference. On a GPU (cupy and a device present) it measures a device-to-device copy (read one,
write one) as the reference and the cupy back end against it.

Timing: a batch of calls long enough to last ``--min-time`` seconds, repeated ``--repeat``
times; the best batch gives the bandwidth (as STREAM reports), the median is saved too. CPU
back ends are timed through the public ``reduce_into``/``reduce_many_into``, with
``BMLMPI_KERNEL`` set to force one (``auto`` is the default choice), so call overheads count.

Note that the triad writes an array it does not read; unless the CPU uses non-temporal
stores, it moves a fourth array's worth of cache lines to write it (write-allocate), which
``reduce_into`` does not, since it writes back what it read. A reduction can therefore exceed
100% of the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import dispatch

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 64K, 256M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """``4K:256M`` (powers of 4 from 4 KiB to 256 MiB) or a comma list ``4K,1M,64M``."""
    if ":" in text:
        lo, hi = (parse_size(t) for t in text.split(":", 1))
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= 4
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def time_call(fn: Callable[..., Any], args: tuple, min_time: float, repeat: int,
              sync: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """(best, median) seconds per call of ``fn(*args)`` over ``repeat`` batches of at least
    ``min_time`` seconds each."""
    fn(*args)
    sync()
    inner = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        sync()
        dt = time.perf_counter() - t0
        if dt >= min_time or inner >= 1 << 20:
            break
        inner = max(inner * 2, int(inner * min_time / max(dt, 1e-9)))
    per_call = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        sync()
        per_call.append((time.perf_counter() - t0) / inner)
    return min(per_call), statistics.median(per_call)


CPU_BACKENDS = ("numpy", "numba-1", "numba-n", "auto")


@contextlib.contextmanager
def kernel_mode(backend: str) -> Iterator[None]:
    """Force a CPU back end for the block: ``numpy``, ``auto``, or numba in its one-thread
    (``numba-1``) or parallel (``numba-n``) form at every size."""
    mode, _, form = backend.partition("-")
    nb = dispatch.load_numba() if mode == "numba" else None
    dispatch.set_kernel_mode(mode)
    if nb is not None:
        nb.force_form(form == "n")
    try:
        yield
    finally:
        dispatch.set_kernel_mode(None)
        if nb is not None:
            nb.force_form(None)


def _numba_triad():
    from numba import njit, prange

    @njit(parallel=True, nogil=True)
    def triad(c, a, b, s):
        for i in prange(c.size):
            c[i] = a[i] + s * b[i]

    return triad


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "numpy": np.__version__,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(AttributeError, OSError):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(AttributeError, OSError):
        info["loadavg_start"] = os.getloadavg()
    mod = dispatch.load_numba()
    if mod is not None:
        import numba
        info["numba"] = numba.__version__
        info["numba_threads"] = mod.threads()
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _fill(dtype: np.dtype, n: int, op: str, rng: np.random.Generator) -> np.ndarray:
    # PROD on random data drifts into subnormals (slow on some CPUs): multiply ones instead.
    if op == "prod":
        return np.ones(n, dtype)
    if dtype.kind == "c":
        return (rng.random(n) + 1j * rng.random(n)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, n).astype(dtype)
    return rng.random(n).astype(dtype)


def bench_cpu(sizes: list[int], dtype: np.dtype, op: str, sources: int, backends: list[str],
              min_time: float, repeat: int, log=print) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    nb = dispatch.load_numba()
    triad = _numba_triad() if nb is not None else None
    numba_call = nb.call if nb is not None else None  # the kernels' thread count
    for size in sizes:
        n = max(1, size // dtype.itemsize)
        nbytes = n * dtype.itemsize
        a, b, c = (_fill(dtype, n, op, rng) for _ in range(3))
        srcs = [b] + [_fill(dtype, n, op, rng) for _ in range(sources - 1)]
        # The reference is about bytes, not the dtype: the triad runs on float32 (uint8 for
        # odd byte counts) views of the same memory, which both numpy and numba handle at
        # full speed (numpy's float16 loops would make a useless reference).
        tdt = np.float32 if nbytes % 4 == 0 else np.uint8
        ta, tb, tc = (x.view(np.uint8).view(tdt) for x in (a, b, c))
        tb[...] = 1  # any finite values; the byte pattern of other dtypes may be NaN
        ta[...] = 1
        results: dict[str, tuple[float, float, int]] = {}
        results["triad_numpy"] = (*time_call(np.add, (ta, tb, tc), min_time, repeat),
                                  3 * nbytes)
        if triad is not None:
            results["triad_numba"] = (*time_call(numba_call, (triad, tc, ta, tb, tdt(1)),
                                                 min_time, repeat), 3 * nbytes)
        ref = max(3 * nbytes / results[k][0] for k in results)
        a[...] = _fill(dtype, n, op, rng)  # the triad overwrote the operands
        b[...] = _fill(dtype, n, op, rng)
        moved = (2 + sources) * nbytes
        for backend in backends:
            with kernel_mode(backend):
                if sources == 1:
                    best_median = time_call(dispatch.reduce_into, (a, b, op), min_time, repeat)
                else:
                    best_median = time_call(dispatch.reduce_many_into, (a, srcs, op), min_time,
                                            repeat)
                results[backend] = (*best_median, moved)
        log(_rows(rows, results, ref, dtype, op, sources, nbytes, None))
        del a, b, c, srcs
    return rows


def _rows(rows: list[dict[str, Any]], results: dict[str, tuple[float, float, int]],
          ref: float, dtype: np.dtype, op: str, sources: int, nbytes: int,
          device: str | None) -> str:
    """Append one row per kernel timed at ``nbytes`` (``results``: name -> best and median
    seconds, bytes moved; ``ref``: the reference's bytes per second) and return the log line.
    Host rows carry no ``device`` (it reads as cpu), GPU rows ``device="gpu"``; on the host the
    triad, the reference itself, shows no fraction."""
    line = [f"{human(nbytes):>9}"]
    for name, (best, median, mv) in results.items():
        gbps = mv / best / 1e9
        frac = gbps * 1e9 / ref
        row = {"kernel": name, "dtype": str(dtype), "op": op, "sources": sources,
               "bytes": nbytes, "bytes_moved": mv, "best_s": best, "median_s": median,
               "gb_per_s": gbps, "fraction_of_reference": frac}
        if device is None:
            line.append(f"{name}={gbps:7.1f} GB/s" + ("" if name.startswith("triad")
                                                       else f" ({frac:4.0%})"))
        else:
            row["device"] = device
            line.append(f"{name}={gbps:8.1f} GB/s ({frac:4.0%})")
        rows.append(row)
    return "  ".join(line)


def bench_gpu(sizes: list[int], dtype: np.dtype, op: str, sources: int, min_time: float,
              repeat: int, log=print) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import cupy

    from . import cupy_backend

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    info = {"gpu": name.decode() if isinstance(name, bytes) else str(name),
            "cupy": cupy.__version__}
    sync = cupy.cuda.get_current_stream().synchronize
    rows: list[dict[str, Any]] = []
    for size in sizes:
        n = max(1, size // dtype.itemsize)
        nbytes = n * dtype.itemsize
        a = cupy.asarray(_fill(dtype, n, op, np.random.default_rng(1)))
        b, c = a.copy(), a.copy()
        srcs = [b] + [a.copy() for _ in range(sources - 1)]
        results = {
            "copy_cupy": (*time_call(cupy.copyto, (c, a), min_time, repeat, sync), 2 * nbytes),
            "triad_cupy": (*time_call(cupy.add, (a, b, c), min_time, repeat, sync), 3 * nbytes),
        }
        ref = 2 * nbytes / results["copy_cupy"][0]
        results["cupy"] = (*time_call(cupy_backend.reduce_many_into, (a, srcs, op), min_time,
                                      repeat, sync), (2 + sources) * nbytes)
        log(_rows(rows, results, ref, dtype, op, sources, nbytes, "gpu"))
        del a, b, c, srcs
    return rows, info


def summarise(rows: list[dict[str, Any]], target: float = 0.8,
              from_bytes: int = 1 << 20) -> dict[str, Any]:
    """Per kernel: the lowest fraction of the reference at sizes >= ``from_bytes``."""
    out: dict[str, Any] = {}
    for r in rows:
        if r["kernel"].startswith(("triad", "copy")) or r["bytes"] < from_bytes:
            continue
        key = f'{r["kernel"]} {r["dtype"]} {r["op"]} x{r["sources"]}'
        cur = out.setdefault(key, {"min_fraction": r["fraction_of_reference"]})
        cur["min_fraction"] = min(cur["min_fraction"], r["fraction_of_reference"])
    for v in out.values():
        v["meets_target"] = v["min_fraction"] >= target
    return out


def markdown(info: dict[str, Any], rows: list[dict[str, Any]], summary: dict[str, Any],
             command: str) -> str:
    """The results as Markdown: machine, one table per (device, dtype, op, sources), summary."""
    out = [f"Command: `{command}`", "",
           "Machine: " + ", ".join(f"{k}={v}" for k, v in info.items()), "",
           "GB/s = bytes moved per second (best of the batches); % = fraction of the reference "
           "at the same size (CPU: best STREAM-like triad; GPU: device copy).", ""]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        key = (r.get("device", "cpu"), r["dtype"], r["op"], r["sources"])
        groups.setdefault(key, []).append(r)
    for (device, dtype, op, sources), rs in groups.items():
        kernels = list(dict.fromkeys(r["kernel"] for r in rs))
        sizes = list(dict.fromkeys(r["bytes"] for r in rs))
        out += [f"### {device.upper()} {dtype} {op}, {sources} source(s)", "",
                "| size | " + " | ".join(kernels) + " |",
                "|---:|" + "---:|" * len(kernels)]
        cell = {(r["bytes"], r["kernel"]): r for r in rs}
        for size in sizes:
            line = [human(size)]
            for k in kernels:
                r = cell.get((size, k))
                if r is None:
                    line.append("")
                elif k.startswith(("triad", "copy")):
                    line.append(f"{r['gb_per_s']:.1f}")
                else:
                    line.append(f"{r['gb_per_s']:.1f} ({r['fraction_of_reference']:.0%})")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    out += ["### Sizes >= 1 MiB: lowest fraction of the reference (target 80%)", ""]
    out += [f"- {k}: {v['min_fraction']:.0%} ({'meets' if v['meets_target'] else 'misses'})"
            for k, v in summary.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bmlmpi.kernels.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4K:256M"),
                   help="4K:256M (powers of 4) or a list 4K,1M,64M (default 4K:256M)")
    p.add_argument("--dtype", default="float32", help="comma list (default float32)")
    p.add_argument("--op", default="sum", help="comma list of sum,prod,min,max (default sum)")
    p.add_argument("--sources", type=int, default=1,
                   help="sources per call; 1 = reduce_into, more = reduce_many_into")
    p.add_argument("--backends", default=",".join(CPU_BACKENDS),
                   help="CPU back ends, a comma list of numpy, numba-1 (numba on one thread), "
                        "numba-n (numba's parallel kernels), auto (the default choice); "
                        "default all four")
    p.add_argument("--repeat", type=int, default=7, help="timed batches per point (default 7)")
    p.add_argument("--min-time", type=float, default=0.02,
                   help="seconds per batch (default 0.02)")
    p.add_argument("--threads", type=int, default=None,
                   help="numba threads (default: bmlmpi's, see bmlmpi.kernels.numba_backend)")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU even if present")
    p.add_argument("--json", metavar="FILE", help="write results and machine info here")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown here")
    args = p.parse_args(argv)
    if args.sources < 1 or args.repeat < 1 or args.min_time <= 0:
        p.error("--sources and --repeat must be >= 1 and --min-time > 0")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in CPU_BACKENDS:
            p.error(f"unknown back end {b!r}; choose from {', '.join(CPU_BACKENDS)}")
        if b.startswith("numba") and dispatch.load_numba() is None:
            p.error(f"{b} needs numba, which cannot be imported")
    dtypes = [np.dtype(d.strip()) for d in args.dtype.split(",") if d.strip()]
    ops = [o.strip() for o in args.op.split(",") if o.strip()]
    for dt in dtypes:
        for op in ops:
            dispatch.check_op(op, dt)
    if args.threads is not None:
        mod = dispatch.load_numba()
        if mod is None:
            p.error("--threads needs numba")
        mod.set_threads(args.threads)

    info = machine_info()
    print("# " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    rows: list[dict[str, Any]] = []
    for dt in dtypes:
        for op in ops:
            print(f"## CPU {dt} {op}, {args.sources} source(s); percentages are of the best "
                  f"triad at the same size", flush=True)
            rows += bench_cpu(args.sizes, dt, op, args.sources, backends, args.min_time,
                              args.repeat, log=lambda s: print(s, flush=True))
    from .gpu import gpu_available
    if not args.no_gpu and gpu_available():
        for dt in dtypes:
            for op in ops:
                print(f"## GPU {dt} {op}; percentages are of the device copy bandwidth",
                      flush=True)
                gpu_rows, gpu_info = bench_gpu(args.sizes, dt, op, args.sources,
                                               args.min_time, args.repeat,
                                               log=lambda s: print(s, flush=True))
                rows += gpu_rows
                info.update(gpu_info)
    with contextlib.suppress(AttributeError, OSError):
        info["loadavg_end"] = os.getloadavg()
    if dispatch.load_numba() is not None:
        import numba
        with contextlib.suppress(ValueError):  # no parallel kernel ran
            info["numba_threading_layer"] = numba.threading_layer()
    summary = summarise(rows)
    print("## sizes >= 1 MiB: lowest fraction of the reference (target 80%)")
    for k, v in summary.items():
        print(f"{k}: {v['min_fraction']:.0%} {'meets' if v['meets_target'] else 'misses'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": {k: v for k, v in vars(args).items()},
                       "rows": rows, "summary_from_1MiB": summary}, f, indent=1)
            f.write("\n")
    if args.markdown:
        command = "python -m bmlmpi.kernels.bench " + " ".join(argv if argv is not None
                                                               else sys.argv[1:])
        with open(args.markdown, "w") as f:
            f.write(markdown(info, rows, summary, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
