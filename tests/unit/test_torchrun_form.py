"""bmlmpi-run for torch users, without MPI: torchrun's form read into mpiexec's arguments,
torch's per-rank variables from each launcher's (Open MPI, MPICH's hydra, Slurm's srun), and
the Python program of each part started behind them."""

import os
import subprocess
import sys

import pytest

from bmlmpi.cli import launch, rank_env, torchrun_form

PY = sys.executable
SHIM = [PY, "-S", "-I", str(launch.RANK_ENV)]


def test_torchrun_flags_become_ranks_and_the_script_runs_under_this_python():
    for flag in (["--nproc_per_node", "3"], ["--nproc-per-node=3"], ["--nproc_per_node=3"]):
        args = [*flag, "--standalone", "train.py", "--epochs", "2", "--nnodes", "9"]
        assert torchrun_form.applies(args)
        form = torchrun_form.parse(args)
        assert (form.nproc, form.nnodes) == (3, 1)
        # the script's own arguments are its own, a --nnodes among them included
        assert form.program == ["train.py", "--epochs", "2", "--nnodes", "9"]
        assert torchrun_form.mpiexec_args(form, PY, "openmpi") == [
            "-n", "3", PY, "-u", "train.py", "--epochs", "2", "--nnodes", "9"]
    assert not torchrun_form.applies(["-n", "2", "python", "t.py", "--nproc_per_node", "2"])


def test_nodes_are_placed_per_node_and_mpiexec_options_pass():
    form = torchrun_form.parse(["--nnodes", "2:2", "--nproc_per_node", "4", "--hostfile", "h",
                                "--mca", "btl", "tcp,self", "-m", "pkg.train", "--lr", "1"])
    assert (form.nproc, form.nnodes, form.module) == (4, 2, True)
    assert torchrun_form.mpiexec_args(form, PY, "openmpi") == [
        "-n", "8", "--map-by", "ppr:4:node", "--hostfile", "h", "--mca", "btl", "tcp,self",
        PY, "-u", "-m", "pkg.train", "--lr", "1"]
    assert torchrun_form.mpiexec_args(form, PY, "mpich")[:4] == ["-n", "8", "-ppn", "4"]
    cpu = torchrun_form.parse(["--nproc_per_node", "cpu", "t.py"])
    assert cpu.nproc == (os.cpu_count() or 1)


@pytest.mark.parametrize("args,says", [
    (["--nnodes", "1:4", "t.py"], "elastic"),
    (["--node_rank", "1", "t.py"], "every node"),
    (["--nproc_per_node", "0", "t.py"], "positive number"),
    (["--nproc_per_node", "2", "--max_restarts", "3", "t.py"], "--max_restarts is not taken"),
    (["--nproc_per_node", "2"], "needs the script"),
    (["--standalone=1", "t.py"], "takes no value"),
])
def test_what_one_mpi_launch_cannot_do_is_refused_by_name(args, says):
    with pytest.raises(SystemExit, match=says):
        torchrun_form.parse(args)


def test_build_command_in_torchrun_form_wraps_the_script_behind_rank_env():
    cmd = launch.build_command(["--ft", "--nproc_per_node", "2", "train.py", "-x"],
                               mpiexec="/x/mpiexec", kind="openmpi")
    assert cmd[-8:] == [*SHIM, PY, "-u", "train.py", "-x"]
    assert cmd[cmd.index("-n") + 1] == "2" and "--with-ft" in cmd
    assert "MASTER_ADDR" not in cmd        # one node: mpiexec's environment reaches every rank
    hosts = launch.build_command(["--nproc_per_node", "2", "--nnodes", "2", "--host", "a,b",
                                  "t.py"], mpiexec="/x/mpiexec", kind="openmpi")
    assert " ".join(hosts).count("-x MASTER_") == 2


def test_each_python_part_starts_behind_rank_env_and_nothing_else_does():
    args = ["-n", "2", PY, "a.py", ":", "--mca", "btl", "self", "-x", "A", "--oversubscribe",
            "/opt/py/bin/python3.11", "b.py", ":", "-n", "1", "./a.out", "python"]
    assert launch.with_rank_env(args) == [
        "-n", "2", *SHIM, PY, "a.py", ":", "--mca", "btl", "self", "-x", "A", "--oversubscribe",
        *SHIM, "/opt/py/bin/python3.11", "b.py", ":", "-n", "1", "./a.out", "python"]


def test_job_environment_one_node_and_given_values():
    env = launch.job_environment(["-n", "2", "python", "t.py"], {})
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
    given = launch.job_environment(["-n", "2", "python", "t.py"],
                                   {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert given == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    form = launch.job_environment(["--nproc_per_node", "2", "--master_addr", "h0",
                                   "--master_port=999", "t.py"], {"MASTER_ADDR": "x"})
    assert form == {"MASTER_ADDR": "h0", "MASTER_PORT": "999"}
    several = launch.job_environment(["-n", "2", "python", "t.py"], {"SLURM_JOB_NUM_NODES": "3"})
    assert several["MASTER_ADDR"] == launch.socket.gethostname()


@pytest.mark.parametrize("env,want", [
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
      "SLURM_PROCID": "0", "RANK": "7"},
     {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}),
    ({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"},
     {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}),
    ({"SLURM_PROCID": "6", "SLURM_STEP_NUM_TASKS": "7", "SLURM_NTASKS": "99",
      "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
      "SLURM_STEP_NODELIST": "gpu[07-09,12]", "SLURM_JOB_ID": "1000", "SLURM_STEP_ID": "2"},
     {"RANK": "6", "WORLD_SIZE": "7", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
      "MASTER_ADDR": "gpu07", "MASTER_PORT": str(20000 + (1000 * 16 + 2) % 9000)}),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
      "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n1", "MASTER_ADDR": "me",
      "MASTER_PORT": "5"},
     {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),
    ({"PATH": "/bin"}, {}),
])
def test_torch_variables_from_each_launcher(env, want):
    assert rank_env.torch_variables(env) == want


def test_slurm_lists():
    assert rank_env.tasks_on_node("2(x3),1", 2) == 2 and rank_env.tasks_on_node("4", 0) == 4
    assert rank_env.tasks_on_node("2(x3)", 3) is None and rank_env.tasks_on_node("x", 0) is None
    assert rank_env.first_host("node[007-009],gpu1") == "node007"
    assert rank_env.first_host("a1,b[1-2]") == "a1" and rank_env.first_host("c[3]-ib") == "c3-ib"


def test_rank_env_sets_the_variables_and_becomes_the_program():
    """Started as bmlmpi-run starts it (a file, ``python -S -I``), under Open MPI's names."""
    env = {"PATH": os.environ.get("PATH", ""), "OMPI_COMM_WORLD_RANK": "1",
           "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "7"}
    code = ("import os; print(os.getpid(), *(os.environ[k] for k in ('RANK', 'LOCAL_RANK', "
            "'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')))")
    probe = f"import os, subprocess; print(os.getpid(), flush=True); os.execv({PY!r}, " \
            f"[{PY!r}, *{SHIM[1:]!r}, {PY!r}, '-c', {code!r}])"
    res = subprocess.run([PY, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    before, after = res.stdout.splitlines()
    assert after.split() == [before, "1", "1", "2", "2", "127.0.0.1", "7"]  # one process
    missing = subprocess.run([*SHIM, "/nonexistent/prog"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 127 and "cannot start /nonexistent/prog" in missing.stderr
