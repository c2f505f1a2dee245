#!/bin/bash
# PyTorch data-parallel training (jobs/train_torch.py: DDP on the backend bmlmpi), started with
# mpirun (bmlmpi-run, the embedded Open MPI's mpiexec, unless BMLMPI_MPIRUN says otherwise).
#   BMLMPI_RANKS=4 jobs/train-torch-mpirun.sh
#   BMLMPI_RANKS=4 BMLMPI_TRAIN_ARGS="--compression fp16" jobs/train-torch-mpirun.sh
# For --fault-tolerant set BMLMPI_MPIRUN="bmlmpi-run --ft". Every variable is listed in
# jobs/common.sh and explained in jobs/README.md.
set -euo pipefail
# shellcheck source=jobs/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export BMLMPI_LAUNCHER=mpiexec
bmlmpi_train_torch
