"""MPI across the namespaces: a dedicated MPICH venv and the MPMD ``mpiexec`` line.

Why MPICH and not the project's default Open MPI wheel: MPICH's Hydra hands each rank its PMI
connection as an inherited socket (``PMI_FD``), which crosses namespaces untouched, and with the
settings below its ranks talk over the emulated links. Open MPI 5.0.11 (the /tmp/venv wheel),
started the same way with ``--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0``,
failed in MPI_Init on this machine ("PML add procs failed: Not found"); we kept MPICH.

The settings (all found on this machine):
- ``MPIR_CVAR_NOLOCAL=1``: Hydra starts every rank on one host, so MPICH would otherwise move
  all traffic through shared memory and no NIC would see a byte.
- ``MPIR_CVAR_CH4_NETMOD=ofi`` with ``FI_PROVIDER=tcp``: libfabric's tcp provider is stable here;
  the UCX netmod over tcp was erratic.
- ``FI_TCP_IFACE=eth0``: each rank publishes its eth0 address (198.18.0.(r+1)); the kernel routes
  then send traffic to a 1-hop neighbour out of the NIC on the shared switch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .topology import Network, server_ns

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("BML_TESTBED_VENV", "/tmp/venv-testbed"))
PACKAGES = ["mpich", "mpi4py", "numpy", "numba", "tqdm", "matplotlib", "pytest", "pytest-mpi"]

MPI_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": "eth0",
}


def venv_python() -> Path:
    return VENV / "bin" / "python"


def mpiexec() -> Path:
    return VENV / "bin" / "mpiexec"


def setup(force: bool = False, timeout: float = 900.0) -> str:
    """Creates the MPICH venv (mpich, mpi4py, numpy, numba, bmlmpi editable, without Open MPI)."""
    if force and VENV.exists():
        shutil.rmtree(VENV)
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
    pip = [str(venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *PACKAGES], check=True, timeout=timeout)
    # --no-deps: the package's own dependencies include the Open MPI wheel, which would put a
    # second libmpi beside MPICH's in the venv.
    subprocess.run([*pip, "--no-deps", "-e", str(REPO)], check=True, timeout=timeout)
    return check()


def ensure(allow_setup: bool = True) -> str | None:
    """None when the MPICH venv is ready (made now, as ``setup`` would, if it is missing and
    ``allow_setup``), else why it is not. For tests, which skip with the reason."""
    try:
        check()
    except (RuntimeError, OSError, subprocess.SubprocessError):
        if not allow_setup:
            return "no MPICH venv and BML_TESTBED_SETUP=0 (python -m perf.testbed setup)"
        try:
            setup(timeout=600)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            return f"could not create the MPICH venv: {exc}"
    return None


def check(timeout: float = 60.0) -> str:
    """The MPI library that mpi4py loads in the venv; raises unless it is MPICH and the venv
    imports this checkout's bmlmpi (kernels included) the way the ranks will."""
    if not venv_python().exists():
        raise RuntimeError(f"no venv at {VENV}: run 'python -m perf.testbed setup'")
    # A venv made for another checkout may import that checkout's bmlmpi (and its kernels,
    # linked into it): check both.
    probe = ("from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0]); "
             "import bmlmpi, bmlmpi.kernels; print(bmlmpi.__file__); "
             "print(bmlmpi.kernels.__file__)")
    out = subprocess.run([str(venv_python()), "-c", probe], capture_output=True, text=True,
                         timeout=timeout, cwd=REPO, env=environment())
    lines = out.stdout.strip().splitlines()
    version = lines[0] if lines else ""
    if "MPICH" not in version:
        raise RuntimeError(f"mpi4py in {VENV} does not load MPICH: {version or out.stderr}")
    if out.returncode != 0 or len(lines) < 3 or not all(
            line.startswith(str(REPO)) for line in lines[1:3]):
        raise RuntimeError(f"{VENV} does not import bmlmpi from {REPO} "
                           f"(python -m perf.testbed setup --force): {out.stderr[-500:]}")
    return version


def mpmd_command(net: Network, argv: Sequence[str], ranks: int | None = None,
                 per_server: int = 1) -> list[str]:
    """``mpiexec -n 1 ip netns exec bml-s0 ARGV : -n 1 ip netns exec bml-s1 ARGV : ...``.

    ``per_server`` ranks run in each server's namespace, consecutive ranks on one server
    (ranks r·p … r·p+p−1 on server r), sharing its NICs. Hydra starts them all on one host and
    ``MPIR_CVAR_NOLOCAL=1`` keeps MPICH off shared memory, so two ranks of one server talk
    over TCP to their own eth0 address, which the kernel delivers over the namespace's
    loopback: the fast tier, which no NIC counter sees. MPI cannot tell these servers apart
    (``COMM_TYPE_SHARED`` gives one node of all ranks), so hierarchical is told the nodes with
    ``BMLMPI_RANKS_PER_NODE=per_server`` (see :func:`node_env`)."""
    if per_server < 1:
        raise ValueError(f"need at least one rank per server, not {per_server}")
    capacity = net.servers * per_server
    n = capacity if ranks is None else ranks
    if not 1 <= n <= capacity:
        raise ValueError(f"{n} ranks do not fit on {net.servers} servers of {per_server}")
    cmd = [str(mpiexec())]
    for r in range(n):
        if r:
            cmd.append(":")
        cmd += ["-n", "1", "ip", "netns", "exec", server_ns(r // per_server), *argv]
    return cmd


def node_env(per_server: int) -> dict[str, str]:
    """The environment that tells bmlmpi which ranks share a server (none for one a server)."""
    return {"BMLMPI_RANKS_PER_NODE": str(per_server)} if per_server > 1 else {}


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "VIRTUAL_ENV",
                "PYTHONHOME"):
        env.pop(key, None)
    env.update(MPI_ENV)
    # 'python' in a rank's command is the venv's python (ip netns exec searches PATH).
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    # The ranks start in the repository root ('python -m perf.testbed.ranks' finds it there);
    # bmlmpi comes from the venv's editable install of the same checkout.
    env.update(extra or {})
    return env


def run(net: Network, argv: Sequence[str], *, timeout: float, ranks: int | None = None,
        env: dict[str, str] | None = None, capture: bool = True,
        per_server: int = 1) -> subprocess.CompletedProcess:
    """Runs one MPMD job over the namespaces (``per_server`` consecutive ranks in each); kills
    the whole job when it overruns ``timeout``."""
    cmd = mpmd_command(net, argv, ranks, per_server)
    proc = subprocess.Popen(cmd, env=environment({**node_env(per_server), **(env or {})}),
                            cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.STDOUT if capture else None, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out or "", "")


def _kill_group(proc: subprocess.Popen) -> None:
    # mpiexec, its proxy and the ranks share the session started for mpiexec.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=3)
            break
        except subprocess.TimeoutExpired:
            continue
    time.sleep(0.1)
