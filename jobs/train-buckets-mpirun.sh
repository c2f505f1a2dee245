#!/bin/bash
# Data-parallel training with GradientBuckets (jobs/train_buckets.py), started with mpirun
# (bmlmpi-run, the embedded Open MPI's mpiexec, unless BMLMPI_MPIRUN says otherwise).
#   BMLMPI_RANKS=4 BMLMPI_PLAN=layer,threshold,ibatch jobs/train-buckets-mpirun.sh
# Every variable is listed in jobs/common.sh and explained in jobs/README.md.
set -euo pipefail
# shellcheck source=jobs/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export BMLMPI_LAUNCHER=mpiexec
bmlmpi_train_buckets
