#!/bin/bash
# OSU-style allreduce sweep of every bmlmpi algorithm and native MPI_Allreduce, started with
# mpirun (bmlmpi-run, the embedded Open MPI's mpiexec, unless BMLMPI_MPIRUN says otherwise).
#   BMLMPI_RANKS=9 jobs/sweep-mpirun.sh
#   BMLMPI_RANKS=16 BMLMPI_MPIRUN="mpirun --hostfile hosts" BMLMPI_OUT=results/n16 \
#       jobs/sweep-mpirun.sh
# Every variable is listed in jobs/common.sh and explained in jobs/README.md.
set -euo pipefail
# shellcheck source=jobs/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export BMLMPI_LAUNCHER=mpiexec
bmlmpi_sweep
