"""Same-block ratios of two sets of all-to-all sweeps (``bmlmpi-bench --collective alltoall
--blocks B --json``), each against mpi4py's ``comm.Alltoall`` of the same run:
``python perf/alltoall/compare.py DIR BEFORE AFTER`` reads ``DIR/{BEFORE,AFTER}-*.json``.

Per algorithm and block size it prints, for each set, the median over every timed block of
(the schedule's block time ÷ native's block time in the same block: the two ran back to
back, under the same load), and the ratio of the quietest blocks (the least block time of
the schedule ÷ native's least), < 1 faster than native."""

import glob
import json
import statistics
import sys


def load(pattern: str) -> dict:
    rows: dict = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            for row in json.load(f)["rows"]:
                rows.setdefault((row["algorithm"], row["size"]), []).append(row["block_us"])
    if not rows:
        raise SystemExit(f"no sweep matches {pattern}")
    return rows


def ratios(rows: dict, algorithm: str, size: int) -> tuple[float, float]:
    mine, native = rows[(algorithm, size)], rows[("native", size)]
    per_block = [a / n for ab, nb in zip(mine, native, strict=True)
                 for a, n in zip(ab, nb, strict=True)]
    return (statistics.median(per_block),
            min(map(min, mine)) / min(map(min, native)))


def main() -> None:
    folder, before, after = sys.argv[1:4]
    sets = [load(f"{folder}/{before}-*.json"), load(f"{folder}/{after}-*.json")]
    algorithms = sorted({a for a, _ in sets[1]} - {"native"})
    sizes = sorted({s for _, s in sets[1]})
    print(f"{'algorithm':10} {'block B':>9}  median {before:>8} {after:>8}   "
          f"quietest {before:>8} {after:>8}")
    for algorithm in algorithms:
        for size in sizes:
            (mb, qb), (ma, qa) = (ratios(rows, algorithm, size) for rows in sets)
            print(f"{algorithm:10} {size:>9}  {'':6} {mb:8.2f} {ma:8.2f}   {'':8} "
                  f"{qb:8.2f} {qa:8.2f}")


if __name__ == "__main__":
    main()
