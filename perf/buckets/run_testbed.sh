#!/bin/bash
# Per-iteration time of jobs/train_buckets.py's model for every plan on the emulated BCube
# testbed at 100 Mbit/s (perf/testbed; needs root), bml underneath, ibatch planned on costs
# measured on that network (--cost measured). Settings of perf/buckets/README.md: BCube 2x2 at
# 900 and 449 samples per rank, 3x3 at 199, 2x2 at 32. Each setting brings a testbed up, runs
# perf/buckets/interleaved.py in it, tears it down and plots (perf/buckets/plot.py).
# Hold the shared testbed lock around it, with your own MPICH venv:
#   export BML_TESTBED_VENV=/tmp/venv-testbed-<name>    # python -m perf.testbed setup; pip install scikit-learn
#   flock /tmp/bmlmpi-testbed.lock perf/buckets/run_testbed.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
py=${BMLMPI_PYTHON:-python3}          # runs perf.testbed (as root); the ranks use the venv's
plot_py=${BMLMPI_PLOT_PYTHON:-$root/.venv/bin/python}
rate=${RATE:-100mbit}
suffix=${SUFFIX:-}                    # e.g. SUFFIX=-rep2 keeps an earlier run's files
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 BMLMPI_ALGORITHM=bml
out=$here/results
mkdir -p "$out"
trap 'timeout 120 "$py" -m perf.testbed down >/dev/null 2>&1 || true' EXIT
one() {  # shape, batch per rank, rounds, name
  uptime
  timeout 120 "$py" -m perf.testbed up bcube "$1" --rate "$rate"
  timeout 700 "$py" -m perf.testbed run --timeout 600 -- python perf/buckets/interleaved.py \
      --batch "$2" --rounds "$3" --cost measured --note "BCube $1, $rate, bml" \
      --out "$out/interleaved-$4.json"
  uptime
  timeout 120 "$py" -m perf.testbed down
  local shape=$1
  "$plot_py" "$here/plot.py" "$out" $(( ${shape%x*} * ${shape#*x} )) "$4"
}
one 2x2 900 8 "tb-2x2-b900$suffix"
one 2x2 449 8 "tb-2x2-b449$suffix"
one 3x3 199 6 "tb-3x3-b199$suffix"
one 2x2 32 6 "tb-2x2-b32$suffix"
