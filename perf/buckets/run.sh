#!/bin/bash
# Per-iteration time of jobs/train_buckets.py at N ranks (default 4) for the plans layer,
# single, ibatch and threshold at three caps, with one iteration's timeline per rank and plan;
# then perf/buckets/plot.py. Results in perf/buckets/results/ (JSON, with `uptime` beside them).
#   perf/buckets/run.sh            # N=4 on this machine
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${BMLMPI_PYTHON:-$root/.venv/bin/python}
n=${BMLMPI_RANKS:-4}
out=$here/results
mkdir -p "$out"
args=(--epochs "${EPOCHS:-3}" --batch 32)
cd "$root/jobs"
uptime > "$out/load-n$n.txt"
timeout 1200 "$py" -m bmlmpi.launch -n "$n" "$py" train_buckets.py --plan layer,single,ibatch \
    "${args[@]}" --out "$out/fixed-n$n.json" --timeline "$out/timeline-n$n.json"
for cap in 131072 524288 1572864; do
    timeout 1200 "$py" -m bmlmpi.launch -n "$n" "$py" train_buckets.py --plan threshold \
        --fusion-bytes "$cap" "${args[@]}" --out "$out/threshold-$cap-n$n.json" \
        --timeline "$out/timeline-n$n-threshold-$cap.json"
done
uptime >> "$out/load-n$n.txt"
"$py" "$here/plot.py" "$out" "$n"
