# shellcheck shell=bash
# Shared by the jobs/ scripts (sourced, not run).
#
# Environment (all optional; jobs/README.md has the full story):
#   BMLMPI_RANKS       ranks to start (default: the allocation's tasks under Slurm, else 4)
#   BMLMPI_OUT         output folder (default: bmlmpi-results/<kind>-<job id> in the submit dir)
#   BMLMPI_PYTHON      the Python that has bmlmpi and mpi4py (default: the active venv's, else
#                      the checkout's .venv made by README command 1, else python3 on PATH)
#   BMLMPI_LAUNCHER    srun (default inside a Slurm job) or mpiexec (default elsewhere)
#   BMLMPI_SRUN_MPI    the value for `srun --mpi=` (default: chosen from mpi4py's MPI library)
#   BMLMPI_MPIRUN      the mpirun command line (default: bmlmpi-run or mpiexec beside
#                      BMLMPI_PYTHON, else bmlmpi-run or mpiexec on PATH)
#   sweep: BMLMPI_ALGORITHMS, BMLMPI_SIZES, BMLMPI_ITERS, BMLMPI_WARMUP, BMLMPI_BENCH_ARGS
#   train: BMLMPI_TRAIN_ARGS, BMLMPI_TRAIN_EPOCHS, BMLMPI_TRAIN_STEPS, BMLMPI_TRAIN_BATCH
#   train-buckets: the train variables and BMLMPI_PLAN, BMLMPI_FUSION_BYTES

die() {
    echo "bmlmpi job: error: $*" >&2
    exit 2
}

# The folder of this file: the scripts source it by its real path (under sbatch, a script runs
# from a spool copy, so each one finds jobs/ through Slurm before sourcing this).
BMLMPI_JOBS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The Python of the environment the job was started from: the active venv's, else the
# checkout's own .venv (README command 1), else python3 on PATH.
bmlmpi_default_python() {
    local venv
    for venv in "${VIRTUAL_ENV:-}" "$(dirname "$BMLMPI_JOBS_DIR")/.venv"; do
        if [[ -n $venv && -x $venv/bin/python ]]; then
            echo "$venv/bin/python"
            return
        fi
    done
    echo python3
}
BMLMPI_PYTHON=${BMLMPI_PYTHON:-$(bmlmpi_default_python)}

# bmlmpi_require_mpi: fails the job, before it creates anything, unless BMLMPI_PYTHON imports
# bmlmpi and mpi4py and (outside Slurm) an mpirun is found; sets BMLMPI_MPIRUN.
bmlmpi_require_mpi() {
    "$BMLMPI_PYTHON" -c 'import bmlmpi, mpi4py' 2>/dev/null \
        || die "$BMLMPI_PYTHON cannot import bmlmpi and mpi4py: activate the venv of README" \
               "command 1 (source .venv/bin/activate) or set BMLMPI_PYTHON"
    local launcher=${BMLMPI_LAUNCHER:-}
    if [[ $launcher == srun || ( -z $launcher && -n ${SLURM_JOB_ID:-} ) ]]; then
        return
    fi
    if [[ -n ${BMLMPI_MPIRUN:-} ]]; then
        return
    fi
    local beside candidate
    beside=$(dirname "$(command -v "$BMLMPI_PYTHON")")
    for candidate in "$beside/bmlmpi-run" "$beside/mpiexec"; do
        if [[ -x $candidate ]]; then
            BMLMPI_MPIRUN=$candidate
            return
        fi
    done
    for candidate in bmlmpi-run mpiexec mpirun; do
        if command -v "$candidate" >/dev/null; then
            BMLMPI_MPIRUN=$candidate
            return
        fi
    done
    die "no MPI launcher: neither bmlmpi-run nor mpiexec beside $BMLMPI_PYTHON or on PATH" \
        "(activate the venv of README command 1, load your MPI, or set BMLMPI_MPIRUN)"
}

# The MPI library mpi4py is linked to, read without initialising MPI (MPI_Get_library_version
# may be called before MPI_Init).
bmlmpi_mpi_library() {
    "$BMLMPI_PYTHON" -c '
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print(MPI.Get_library_version().replace(chr(0), "").splitlines()[0])
'
}

# srun's PMI must match the MPI: Open MPI 5 speaks PMIx only; MPICH (and Intel MPI, MVAPICH)
# speak PMI-2. With Open MPI a mismatch does not fail: every task becomes a world of one rank.
bmlmpi_srun_mpi() {
    if [[ -n ${BMLMPI_SRUN_MPI:-} ]]; then
        echo "$BMLMPI_SRUN_MPI"
        return
    fi
    local lib
    lib=$(bmlmpi_mpi_library) || die "cannot read the MPI library version with $BMLMPI_PYTHON"
    case $lib in
        *"Open MPI"*) echo pmix ;;
        *MPICH* | *"Intel(R) MPI"* | *MVAPICH*) echo pmi2 ;;
        *) die "unknown MPI library '$lib': set BMLMPI_SRUN_MPI (see srun --mpi=list)" ;;
    esac
}

# Open MPI busy-polls while it waits; with more ranks than cores and a launcher that does not
# tell it so (srun), ranks spin against each other and run orders of magnitude slower. So do
# compute threads: srun binds nothing here, so each rank's torch (OpenMP) would start a thread
# per core of the node (mpirun binds each rank to a core, and torch then starts one).
bmlmpi_yield_if_oversubscribed() {
    local ranks=$1 cores
    cores=$(nproc 2>/dev/null || echo 1)
    if [[ ${SLURM_JOB_NUM_NODES:-1} == 1 && $ranks -gt $cores ]]; then
        export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    fi
}

# Open MPI's osc/ucx prints "OSC UCX component priority set inside component query failed" on
# every rank for every window where UCX has no one-sided transport, which is the case on a node
# without an RDMA device (open-mpi/ompi#14086); bmlmpi's shared-memory windows are served by
# osc/sm. bmlmpi-run does the same for its own launches.
bmlmpi_quiet_osc() {
    if [[ -z ${OMPI_MCA_osc:-} ]] && ! compgen -G '/sys/class/infiniband/*' >/dev/null; then
        export OMPI_MCA_osc=^ucx
    fi
}

# libnbc's default MPI_Ireduce at up to 4 ranks from 64 KiB is a chain of 16 KiB segments
# that advance only inside a poll: bmlmpi's polled native reduce paid thousands of polls
# (2.6 s for 16 MiB at N = 2); binomial takes one round per tree level. bmlmpi-run does the
# same for its own launches.
bmlmpi_binomial_ireduce() {
    export OMPI_MCA_coll_libnbc_ireduce_algorithm=${OMPI_MCA_coll_libnbc_ireduce_algorithm:-binomial}
}

# bmlmpi_launch N CMD...: runs CMD on N ranks with the chosen launcher; every rank checks that
# the world it joined has N ranks (BMLMPI_EXPECT_SIZE, honoured by the bmlmpi programs).
# The callers run Python under `python -m mpi4py`, which turns an exception or a non-zero exit
# on any rank into MPI_Abort: the job ends at once, instead of the failed rank blocking in
# MPI_Finalize while the others wait for it.
bmlmpi_launch() {
    local ranks=$1
    shift
    export BMLMPI_EXPECT_SIZE=$ranks
    bmlmpi_yield_if_oversubscribed "$ranks"
    bmlmpi_quiet_osc
    bmlmpi_binomial_ireduce
    local launcher=${BMLMPI_LAUNCHER:-}
    if [[ -z $launcher ]]; then
        if [[ -n ${SLURM_JOB_ID:-} ]]; then launcher=srun; else launcher=mpiexec; fi
    fi
    case $launcher in
        srun)
            local pmi
            pmi=$(bmlmpi_srun_mpi) || exit 2
            echo "bmlmpi job: srun -n $ranks --mpi=$pmi $*" >&2
            srun --ntasks="$ranks" --mpi="$pmi" --kill-on-bad-exit=1 "$@"
            ;;
        mpiexec)
            [[ -n ${BMLMPI_MPIRUN:-} ]] || bmlmpi_require_mpi
            local mpirun=$BMLMPI_MPIRUN
            echo "bmlmpi job: $mpirun -n $ranks $*" >&2
            # shellcheck disable=SC2086  # BMLMPI_MPIRUN may carry options
            $mpirun -n "$ranks" "$@"
            ;;
        *) die "BMLMPI_LAUNCHER must be srun or mpiexec, not '$launcher'" ;;
    esac
}

# bmlmpi_check_world N: a first, cheap step that fails the job with a clear message when the
# launcher and the MPI library disagree, before any real work starts.
bmlmpi_check_world() {
    bmlmpi_launch "$1" "$BMLMPI_PYTHON" -m mpi4py "$BMLMPI_JOBS_DIR/check_world.py" \
        --expect-size "$1"
}

# The number of ranks: BMLMPI_RANKS, else the tasks of the Slurm allocation, else 4.
bmlmpi_ranks() {
    local ranks=${BMLMPI_RANKS:-${SLURM_NTASKS:-4}}
    [[ $ranks =~ ^[1-9][0-9]*$ ]] || die "BMLMPI_RANKS must be a positive integer, not '$ranks'"
    echo "$ranks"
}

# bmlmpi_out_dir KIND: BMLMPI_OUT, else bmlmpi-results/KIND-<job id or time> where the job was
# submitted.
bmlmpi_out_dir() {
    local out=${BMLMPI_OUT:-}
    if [[ -z $out ]]; then
        local base=${SLURM_SUBMIT_DIR:-$PWD}/bmlmpi-results
        out=$base/$1-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}
    fi
    mkdir -p "$out" || die "cannot create the output folder $out"
    (cd "$out" && pwd)
}

# The OSU-style sweep: every algorithm (BMLMPI_ALGORITHMS, default all) over the message sizes
# BMLMPI_SIZES (-m [MIN:]MAX, bytes), BMLMPI_ITERS (-i), BMLMPI_WARMUP (-x), extra options in
# BMLMPI_BENCH_ARGS (e.g. "-f -c --busbw"); writes sweep.csv and sweep.json to the output folder.
bmlmpi_sweep() {
    local ranks out
    ranks=$(bmlmpi_ranks) || exit 2
    bmlmpi_require_mpi
    out=$(bmlmpi_out_dir sweep) || exit 2
    local args=(--algorithms "${BMLMPI_ALGORITHMS:-all}" --no-progress
                --csv "$out/sweep.csv" --json "$out/sweep.json")
    if [[ -n ${BMLMPI_SIZES:-} ]]; then args+=(-m "$BMLMPI_SIZES"); fi
    if [[ -n ${BMLMPI_ITERS:-} ]]; then args+=(-i "$BMLMPI_ITERS"); fi
    if [[ -n ${BMLMPI_WARMUP:-} ]]; then args+=(-x "$BMLMPI_WARMUP"); fi
    local extra=()
    read -r -a extra <<< "${BMLMPI_BENCH_ARGS:-}"
    bmlmpi_check_world "$ranks"
    bmlmpi_launch "$ranks" "$BMLMPI_PYTHON" -m mpi4py -m bmlmpi.cli.bench "${args[@]}" "${extra[@]}"
    [[ -s $out/sweep.csv ]] || die "the sweep wrote no $out/sweep.csv"
    echo "bmlmpi job: sweep results in $out"
}

# The training example: options in BMLMPI_TRAIN_ARGS (e.g. "--epochs 3 --algorithm bml") and
# the BMLMPI_TRAIN_* variables train_example.py reads; writes train.json to the output folder.
bmlmpi_train() {
    local ranks out
    ranks=$(bmlmpi_ranks) || exit 2
    bmlmpi_require_mpi
    out=$(bmlmpi_out_dir train) || exit 2
    local extra=()
    read -r -a extra <<< "${BMLMPI_TRAIN_ARGS:-}"
    bmlmpi_check_world "$ranks"
    bmlmpi_launch "$ranks" "$BMLMPI_PYTHON" -m mpi4py "$BMLMPI_JOBS_DIR/train_example.py" \
        --out "$out/train.json" "${extra[@]}"
    [[ -s $out/train.json ]] || die "the training wrote no $out/train.json"
    echo "bmlmpi job: training results in $out"
}

# The bucketed training job (train_buckets.py): plans in BMLMPI_PLAN (a comma list, e.g.
# "layer,threshold,ibatch"; default threshold), the cap in BMLMPI_FUSION_BYTES, more options in
# BMLMPI_TRAIN_ARGS; writes train-buckets.json and one timeline per plan to the output folder.
bmlmpi_train_buckets() {
    local ranks out
    ranks=$(bmlmpi_ranks) || exit 2
    bmlmpi_require_mpi
    out=$(bmlmpi_out_dir train-buckets) || exit 2
    local extra=()
    read -r -a extra <<< "${BMLMPI_TRAIN_ARGS:-}"
    bmlmpi_check_world "$ranks"
    bmlmpi_launch "$ranks" "$BMLMPI_PYTHON" -m mpi4py "$BMLMPI_JOBS_DIR/train_buckets.py" \
        --plan "${BMLMPI_PLAN:-threshold}" --out "$out/train-buckets.json" \
        --timeline "$out/timeline.json" "${extra[@]}"
    [[ -s $out/train-buckets.json ]] || die "the training wrote no $out/train-buckets.json"
    echo "bmlmpi job: bucketed training results in $out"
}

# The PyTorch job (train_torch.py: DDP on the torch.distributed backend bmlmpi); options in
# BMLMPI_TRAIN_ARGS (e.g. "--compression fp16", "--plan ibatch --bucket-cap-mb 0.01",
# "--fault-tolerant"); needs torch in BMLMPI_PYTHON (pip install '.[torch,train]'); writes
# train-torch.json to the output folder.
bmlmpi_train_torch() {
    local ranks out
    ranks=$(bmlmpi_ranks) || exit 2
    out=$(bmlmpi_out_dir train-torch) || exit 2
    local extra=()
    read -r -a extra <<< "${BMLMPI_TRAIN_ARGS:-}"
    bmlmpi_check_world "$ranks"
    bmlmpi_launch "$ranks" "$BMLMPI_PYTHON" "$BMLMPI_JOBS_DIR/train_torch.py" \
        --out "$out/train-torch.json" "${extra[@]}"
    [[ -s $out/train-torch.json ]] || die "the training wrote no $out/train-torch.json"
    echo "bmlmpi job: PyTorch training results in $out"
}
