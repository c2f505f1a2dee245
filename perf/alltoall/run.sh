#!/usr/bin/env bash
# bmlmpi's all-to-all against mpi4py's comm.Alltoall in the same run (the sweep's "native"
# row), every algorithm, validated: perf/alltoall/run.sh [N ...] (default: 2 4).
# 8 B - 16 MiB per rank-pair block at N <= 4; 8 B - 1 MiB beyond (each rank holds N blocks
# twice, plus each schedule's work buffer: 16 MiB blocks at N = 9 would need ~10 GiB).
# Each run starts as a new user's first job: an empty calibration cache and tuning table of
# its own (not the user's ~/.cache/bmlmpi, whose entries would commit auto at once).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=perf/alltoall/results
mkdir -p "$out"
cache=$(mktemp -d "${TMPDIR:-/tmp}/bmlmpi-perf-alltoall-XXXXXX")
trap 'rm -rf "$cache"' EXIT
export BMLMPI_CACHE_DIR="$cache" BMLMPI_TUNING="$cache/tuning.jsonl"
ranks=("$@")
if [ ${#ranks[@]} -eq 0 ]; then ranks=(2 4); fi
for n in "${ranks[@]}"; do
    max=16777216
    if [ "$n" -gt 4 ]; then max=1048576; fi
    { date -u +%FT%TZ; cat /proc/loadavg; } > "$out/load-n$n.txt"
    timeout 1800 python -m bmlmpi.cli.launch -n "$n" python -m bmlmpi.cli.bench \
        --collective alltoall -m "8:$max" -f -c --busbw --algorithms all --blocks 4 \
        -i 20 -x 3 --no-progress --json "$out/bench-n$n.json" > "$out/bench-n$n.txt"
    { date -u +%FT%TZ; cat /proc/loadavg; } >> "$out/load-n$n.txt"
done
