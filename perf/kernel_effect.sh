#!/usr/bin/env bash
# How the reduction kernel changes bml and ring at >= 1 MiB: the same sweep with the numpy
# reference kernels (BMLMPI_KERNEL=numpy) and with the default choice (numba where it pays),
# run back to back. Usage: perf/kernel_effect.sh [ranks...] (default 2 4); results in
# perf/results/kernel-effect/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=perf/results/kernel-effect
mkdir -p "$out"
for n in "${@:-2 4}"; do
  for kernel in numpy auto; do
    BMLMPI_KERNEL=$kernel timeout 1200 python -m bmlmpi.cli.launch -n "$n" python -m bmlmpi.cli.bench \
      -m 1048576:67108864 -i 10 -x 2 --algorithms bml,ring,native --no-progress \
      --json "$out/n$n-$kernel.json" > "$out/n$n-$kernel.txt"
  done
done
python - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
lines = ["| ranks | algorithm | size (B) | numpy kernel (us) | default kernel (us) | default / numpy |",
         "|---|---|---|---|---|---|"]
for f in sorted(out.glob("n*-numpy.json")):
    n = f.name.split("-")[0][1:]
    a = {(r["algorithm"], r["size"]): r["avg_us"] for r in json.loads(f.read_text())["rows"]}
    b = {(r["algorithm"], r["size"]): r["avg_us"]
         for r in json.loads((out / f"n{n}-auto.json").read_text())["rows"]}
    for (alg, size), t in sorted(a.items()):
        if alg != "native":
            lines.append(f"| {n} | {alg} | {size} | {t:.0f} | {b[(alg, size)]:.0f} | "
                         f"{b[(alg, size)] / t:.2f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
