#!/bin/bash
# Data-parallel training example (jobs/train_example.py), started with mpirun (bmlmpi-run, the
# embedded Open MPI's mpiexec, unless BMLMPI_MPIRUN says otherwise).
#   BMLMPI_RANKS=9 jobs/train-mpirun.sh
#   BMLMPI_RANKS=4 BMLMPI_TRAIN_ARGS="--epochs 10 --algorithm bml" jobs/train-mpirun.sh
# Every variable is listed in jobs/common.sh and explained in jobs/README.md.
set -euo pipefail
# shellcheck source=jobs/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export BMLMPI_LAUNCHER=mpiexec
bmlmpi_train
