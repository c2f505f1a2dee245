#!/bin/bash
# Per-iteration time of jobs/train_buckets.py's model at N ranks (default 4) for the plans layer,
# single, ibatch and threshold at three caps, interleaved in one run (perf/buckets/interleaved.py:
# every plan sees the same drifting load), one iteration's timeline per rank and plan, then the
# plots (perf/buckets/plot.py). Results in perf/buckets/results/.
#   perf/buckets/run.sh                  # N=4 on this machine
#   BMLMPI_RANKS=8 ROUNDS=12 perf/buckets/run.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${BMLMPI_PYTHON:-$root/.venv/bin/python}
n=${BMLMPI_RANKS:-4}
# one BLAS thread per rank: N ranks (and their progress threads) already oversubscribe the cores
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
out=$here/results
mkdir -p "$out"
timeout 1800 "$py" -m bmlmpi.cli.launch -n "$n" "$py" "$here/interleaved.py" \
    --rounds "${ROUNDS:-8}" --out "$out/interleaved-n$n.json"
"$py" "$here/plot.py" "$out" "$n"
