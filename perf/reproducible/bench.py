"""Throughput of the reproducible format's numba kernels on one thread (block exponents,
encode, decode, the fused sum of two contributions, the accumulator's add and export),
beside numpy's ``np.add(a, b, out=c)`` on the same arrays in the same run (a memory-bound
pass, for scale).

GB/s counts the bytes each pass reads and writes: exponents reads the values; encode reads
the values and writes the words (8 B per value, float64 16 B); decode reads the words and
writes the values; sum (what a rank of two does where the addends meet: the values as two
contributions of half the positions each) reads the values and writes half as many; add
reads the values and updates the bins (4 B per bin: float32 5 bins, float64 9); export reads
the bins and writes the words; np.add reads two arrays and writes one. Median of
``--repeats`` timed calls after a warm-up call.

    python perf/reproducible/bench.py [--sizes 1M,16M] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bmlmpi.reproducible import Accumulator
from bmlmpi.reproducible import format as rf


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M", help="bytes of values, comma separated")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"one thread; load average {os.getloadavg()[0]:.2f}; GB/s (1e9 bytes a second)")
    print("| dtype | values | exponents | encode | decode | sum | acc add | acc export | "
          "np.add |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64"):
        for nbytes in (size(s) for s in args.sizes.split(",")):
            cells = " | ".join(f"{b / t / 1e9:.2f}"
                               for b, t in measure(dtype, nbytes, args.repeats, rng))
            print(f"| {dtype} | {nbytes >> 20} MiB | {cells} |")


def measure(dtype: str, nbytes: int, repeats: int, rng: np.random.Generator
            ) -> list[tuple[int, float]]:
    """(bytes moved, median seconds) of each pass, in the table's order."""
    fmt = rf.get(dtype)
    n = nbytes // np.dtype(dtype).itemsize
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(dtype)
    agreed = rf.block_exponents(x, parallel=False)
    words = rf.encode(x, agreed, parallel=False)
    out = np.empty_like(x)
    rows = x[:n - n % 2].reshape(2, -1)
    half = np.empty(rows.shape[1], x.dtype)
    met = np.maximum(*(rf.block_exponents(r, parallel=False) for r in rows))
    acc = Accumulator(x.shape, dtype)
    acc.add(x, parallel=False)
    wb = words.nbytes
    bins = n * fmt.bins * 4
    return [
        (x.nbytes, timed(lambda: rf.block_exponents(x, parallel=False), repeats)),
        (x.nbytes + wb, timed(lambda: rf.encode(x, agreed, out=words, parallel=False),
                              repeats)),
        (wb + x.nbytes, timed(lambda: rf.decode(words, agreed, dtype, out=out,
                                                parallel=False), repeats)),
        (rows.nbytes + half.nbytes, timed(lambda: rf.sum_contributions(
            rows, met, out=half, parallel=False), repeats)),
        (x.nbytes + 2 * bins, timed(lambda: acc.add(x, parallel=False), repeats)),
        (bins + wb, timed(lambda: acc.export(agreed, parallel=False), repeats)),
        (3 * x.nbytes, timed(lambda: np.add(x, x, out=out), repeats)),
    ]


if __name__ == "__main__":
    main()
