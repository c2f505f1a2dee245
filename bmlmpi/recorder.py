"""The flight recorder: each communicator's last ``BMLMPI_TRACE_CALLS`` calls, dumped as JSON
when something goes wrong, for ``bmlmpi-trace`` to read across ranks.

Every :class:`bmlmpi.Communicator` owns a :class:`FlightRecorder` (``BMLMPI_TRACE_CALLS``,
default 256; 0: none). It is a ring of preallocated :class:`Slot` s, one per call: the call's
sequence number on this communicator, its :class:`Signature` (collective, count, dtype, op,
root, algorithm asked for and run: one tuple per signature, made when the signature is first
seen and shared by its calls), its start and end time, and, for a call that failed or is still
running, the step it is in and the peers it waits on. A call writes four fields when it starts
and one when it ends; nothing is allocated for it beyond the numbers themselves, so the blocking
fast path pays two clock reads and a few stores, 0.14–0.33 µs (perf/trace/README.md). The
state is read off the end time: 0 while the call runs, the end time once done, minus the end
time when it failed. A running scheduled call keeps its :class:`~bmlmpi.execute.Run` in the
slot (dropped when it ends), and the dump asks it which step it is in and which transfers are
incomplete (without completing any).

:meth:`FlightRecorder.dump` writes the ring, oldest call first, to
``BMLMPI_TRACE_DIR/bmlmpi-trace-<host>-p<pid>-w<world rank>-c<communicator>.json`` (default
folder: ``bmlmpi-trace-<job>`` under the system's temporary directory, the job named by
Slurm's, PMIx's or the launcher's id, so every rank of a job on a node writes into one
folder), and says so on stderr. The communicator dumps for a hang or a failure between ranks
(:func:`bmlmpi.calls.earns_dump`): a call that raises :class:`~bmlmpi.execute.DeadlineExceeded`
or an MPI error, ranks that disagree on a call's arguments; and when the watchdog aborts a
hung call, when the fault-tolerant communicator notices a failure, on ``SIGUSR1`` (every live
recorder of the process; the handler is installed only where the signal's disposition is
still the default) and on ``Communicator.dump_trace()``. A refused argument earns none. A
process writes at most ``BMLMPI_TRACE_FILES`` files on its own. At a clean end
(:func:`end_cleanly`) each recorder of several ranks that wrote nothing writes one, kept only
where the job's folder shows a failure once every rank has finalized. Calls are numbered per
communicator from 1, as the call sequence numbers them in exceptions, so the dumps of one
communicator on all ranks line up by call number; communicators are told apart by their
creation order in the process (``c<index>``), which is the same on every rank of an SPMD
program.

Where ``BMLMPI_TRACE_TORCH`` names a file-name prefix, every dump also writes all recorders of
the process into ``<prefix><world rank>`` in PyTorch's Flight Recorder format
(:mod:`bmlmpi.fr_format`), one file per rank, which torch's analyzer ``python -m
torch.distributed.flight_recorder.fr_trace`` reads; a clean end's is removed with the clean
end's own files. Each recorder names its process group there: ``c<index>`` and the MPI
communicator's name, or torch's group name and description (:meth:`FlightRecorder.name_group`,
which the torch backend calls), with its members' ranks in ``MPI_COMM_WORLD``.

Core layer: imports only :mod:`bmlmpi.config` and :mod:`bmlmpi.fr_format`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

from . import config, fr_format

FORMAT = "bmlmpi-flight-recorder/1"
#: the clock of start and end times: ``perf_counter`` (the cheapest Python clock, half the
#: cost of ``time.time``), turned into seconds since the epoch when written (:data:`EPOCH`),
#: which are comparable across the ranks of a node and across nodes as far as their clocks
#: agree
now = time.perf_counter
EPOCH = time.time() - time.perf_counter()


class Signature(NamedTuple):
    """What a call was asked to do; the same on every rank for the same call of a correct
    program (``bmlmpi-trace`` compares them by sequence number)."""

    collective: str
    count: int | None     # elements (None: the call was refused before its count was known)
    dtype: str | None     # numpy's name of the element type
    op: str | None        # bmlmpi's op name (sum, prod, min, max, avg); None for copies
    root: int | None      # rooted collectives; None otherwise
    asked: str            # the algorithm asked for ("auto" stays "auto")
    chosen: str | None    # the algorithm that ran


class Slot:
    """One call in the ring (reused every ``capacity`` calls)."""

    __slots__ = ("seq", "sig", "t0", "t1", "run", "error", "step", "steps", "peers")

    def __init__(self) -> None:
        self.seq = 0                  # 0: never used (calls are numbered from 1)
        self.sig: Signature | None = None
        self.t0 = 0.0                 # start
        self.t1 = 0.0                 # 0: running; > 0: done at t1; < 0: failed at -t1
        self.run: Any = None          # the running call's Run (scheduled), else None
        self.error = ""               # a failed call's exception
        self.step = 0                 # a failed call's step (1-based; 0: none recorded)
        self.steps = 0
        self.peers: list[tuple[str, int]] | None = None


_live: weakref.WeakSet[FlightRecorder] = weakref.WeakSet()
#: the recorders of communicators of more than one rank, kept past their communicator's end
#: (a recorder holds no MPI object) so that a clean end can write them: the newest
#: BMLMPI_TRACE_FILES (a recorder is a few KiB)
_ending: deque[FlightRecorder] = deque(maxlen=max(1, config.get("BMLMPI_TRACE_FILES")))
#: the dump files this process wrote (BMLMPI_TRACE_FILES bounds the automatic ones)
_files: set[str] = set()
#: the files in PyTorch's format it wrote (BMLMPI_TRACE_TORCH; not counted: one per process)
_torch_files: set[str] = set()
_capped = [False]
_created = [0]
_signal_lock = threading.Lock()
_signal_installed = [False]


class FlightRecorder:
    """The ring of one communicator's calls (module docstring). ``rank``/``size``: in the
    communicator; ``kind``: the communicator's class name."""

    __slots__ = ("slots", "next", "capacity", "rank", "size", "kind", "index", "timeline",
                 "timeout", "dumps", "members", "group", "__weakref__")

    def __init__(self, capacity: int, rank: int, size: int, kind: str = "Communicator",
                 timeout: float = 0.0, members: tuple[int, ...] | None = None,
                 description: str = ""):
        if capacity < 1:
            raise ValueError("a flight recorder keeps at least one call (0 means none: "
                             "build no recorder)")
        self.slots = [Slot() for _ in range(capacity)]
        self.next = 1                 # the next call's number (the call sequence's own)
        self.capacity = capacity
        self.rank = rank
        self.size = size
        self.kind = kind
        self.timeout = timeout
        self.index = _created[0]      # this process's communicator number (c<index>)
        _created[0] += 1
        self.timeline: Any = None     # a bmlmpi.timeline.Timeline fed each finished call
        self.dumps: list[str] = []    # paths written
        #: the members' ranks in MPI_COMM_WORLD (default: the communicator's own ranks)
        self.members = tuple(range(size)) if members is None else tuple(members)
        #: the process group torch's format names it by: (name, description)
        self.group = (f"c{self.index}", description)
        _live.add(self)
        if size > 1:
            if not _ending:
                # registered late, so that it runs after the exit handlers bmlmpi and the
                # program register later (they may still call MPI)
                atexit.register(end_cleanly)
            _ending.append(self)
        _install_signal_handler()

    # -- recording (the blocking fast path inlines begin and done) ------------------------
    def begin(self, sig: Signature, run: Any = None) -> Slot:
        n = self.next
        self.next = n + 1
        s = self.slots[n % self.capacity]
        s.seq = n
        s.sig = sig
        s.t1 = 0.0
        s.run = run
        s.t0 = now()
        return s

    def name_group(self, name: str | None = None, description: str | None = None) -> None:
        """Name this communicator's process group in torch's format (the torch backend gives
        torch's group name and description); None keeps what it was."""
        old_name, old_desc = self.group
        self.group = (old_name if name is None else str(name),
                      old_desc if description is None else str(description))

    def withdraw(self, s: Slot) -> None:
        """Take back ``s``, the newest entry: its call never started (mpi4py refused the
        arguments of a fast path's call before anything was sent), and the checked path that
        takes the call over enters it again, so every rank's recorder numbers the same calls
        alike."""
        self.next = s.seq

    def done(self, s: Slot) -> None:
        if s.t1 == 0.0:
            s.t1 = now()
            s.run = None
            if self.timeline is not None:
                self.timeline.call(self, s)

    def fail(self, s: Slot, exc: BaseException, run: Any = None) -> bool:
        """Mark ``s`` failed with ``exc``; the step and peers from ``run`` (or the slot's own
        run). False when it had already ended."""
        if s.t1 != 0.0:
            return False
        run = run if run is not None else s.run
        s.step, s.steps, s.peers = _where(run)
        s.error = f"{type(exc).__name__}: {exc}"[:2000]
        s.run = None
        s.t1 = -now()
        if self.timeline is not None:
            self.timeline.call(self, s)
        return True

    def failed_call(self, s: Slot, exc: BaseException, run: Any = None,
                    dump: bool = True) -> Path | None:
        """:meth:`fail`, then (``dump``) write the ring and add its path to the exception's
        notes; the path, or None when nothing was written."""
        if not self.fail(s, exc, run) or not dump:
            return None
        try:
            path = self.dump(f"call {s.seq} raised {type(exc).__name__}")
        except OSError:
            return None
        if path is None:
            return None
        exc.add_note(f"bmlmpi flight recorder: {path} (every rank's: bmlmpi-trace "
                     f"{path.parent})")
        return path

    # -- reading ------------------------------------------------------------------------
    def calls(self) -> list[dict[str, Any]]:
        """The recorded calls, oldest first, as the dump writes them."""
        used = [s for s in self.slots if s.seq > 0]
        return [_describe(s) for s in sorted(used, key=lambda s: s.seq)]

    def snapshot(self, reason: str) -> dict[str, Any]:
        return {
            "format": FORMAT, "reason": reason, "time": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(), "world_rank": world_rank(), "comm": self.index,
            "kind": self.kind, "rank": self.rank, "size": self.size,
            "capacity": self.capacity, "recorded": self.next - 1, "next": self.next,
            "timeout": self.timeout, "group": list(self.group), "members": list(self.members),
            "calls": self.calls(),
        }

    def path(self, directory: Path | None = None) -> Path:
        d = trace_dir() if directory is None else Path(directory)
        return d / (f"bmlmpi-trace-{file_slug(socket.gethostname())}-p{os.getpid()}"
                    f"-w{world_rank()}-c{self.index}.json")

    def dump(self, reason: str, directory: Path | None = None, announce: bool = True,
             counted: bool = True) -> Path | None:
        """Write the ring as JSON (replacing this communicator's earlier dump); say where on
        stderr (``announce``). A ``counted`` dump (one bmlmpi writes on its own) that would
        add a file past the process's ``BMLMPI_TRACE_FILES`` writes nothing and returns
        None (said once on stderr)."""
        target = self.path(directory)
        if counted and str(target) not in _files and not _file_allowed():
            return None
        _files.add(str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(json.dumps(self.snapshot(reason), indent=1))
        os.replace(tmp, target)
        self.dumps.append(str(target))
        torch_file = write_torch_format(self.rank)
        if announce:
            _to_stderr(f"bmlmpi flight recorder: rank {self.rank} of {self.size} wrote "
                       f"{target} ({reason}); read every rank's with: bmlmpi-trace "
                       f"{target.parent}")
            if torch_file is not None:
                _to_stderr(f"bmlmpi flight recorder: and {torch_file} in PyTorch's Flight "
                           f"Recorder format (python -m torch.distributed.flight_recorder."
                           f"fr_trace {torch_file.parent})")
        return target


def write_torch_format(rank: int = -1) -> Path | None:
    """Where ``BMLMPI_TRACE_TORCH`` names a prefix: write every recorder of this process into
    ``<prefix><world rank>`` in PyTorch's Flight Recorder format (:mod:`bmlmpi.fr_format`),
    one file per rank (``rank``: the file's number where MPI does not give a world rank);
    its path, or None when the variable is unset or the file could not be written (said on
    stderr: bmlmpi's own dump, written before, stays)."""
    prefix = config.get("BMLMPI_TRACE_TORCH")
    if prefix is None:
        return None
    wr = world_rank()
    try:
        recorders = {id(r): r for r in (*_ending, *_live)}
        doc = fr_format.document([r.snapshot("torch") for r in recorders.values()],
                                 fr_format.library_version())
        target = fr_format.write(prefix, wr if wr >= 0 else rank, doc)
    except Exception as exc:  # noqa: BLE001 - bmlmpi's own dump is written: keep its path
        _to_stderr(f"bmlmpi flight recorder: could not write PyTorch's format to "
                   f"{prefix}{wr}: {exc}")
        return None
    _torch_files.add(str(target))
    return target


def world_members(comm: Any) -> tuple[int, ...]:
    """The ranks in ``MPI_COMM_WORLD`` of ``comm``'s members, in ``comm``'s order (its own
    ranks where a member is not in the world: a communicator joined from another job)."""
    from mpi4py import MPI
    size = comm.Get_size()
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(size)), world)
    finally:
        group.Free()
        world.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        return tuple(range(size))
    return tuple(int(r) for r in ranks)


def _where(run: Any) -> tuple[int, int, list[tuple[str, int]] | None]:
    """(step, steps, peers) of a running call: a schedule Run says which step and which
    transfers are incomplete; anything else (a native MPI call) waits on every rank."""
    if run is None:
        return 0, 0, None
    waiting = getattr(run, "waiting", None)
    if waiting is None:
        return 0, 0, None
    try:
        step, peers = waiting()
    except Exception:  # noqa: BLE001 - a dump must not fail on a broken run
        return 0, 0, None
    return step, run.plan.nsteps, list(peers)


def _describe(s: Slot) -> dict[str, Any]:
    sig = s.sig
    d: dict[str, Any] = {"seq": s.seq}
    d.update(sig._asdict() if sig is not None else {})
    d["start"] = s.t0 + EPOCH
    if s.t1 > 0:
        d["state"], d["end"] = "done", s.t1 + EPOCH
    elif s.t1 < 0:
        d["state"], d["end"], d["error"] = "failed", -s.t1 + EPOCH, s.error
        if s.steps:
            d["step"], d["steps"] = s.step, s.steps
        d["peers"] = _peers(s.peers)
    else:
        step, steps, peers = _where(s.run)
        d["state"] = f"step {step} of {steps}" if steps else "posted"
        d["end"] = None
        if steps:
            d["step"], d["steps"] = step, steps
        d["peers"] = _peers(peers)
    return d


def _peers(peers: list[tuple[str, int]] | None) -> Any:
    """The peers a call waits on: [{"kind": "recv"|"send", "rank": r}, ...], or "all" for a
    call MPI runs itself (it may wait on any rank)."""
    if peers is None:
        return "all"
    return [{"kind": k, "rank": int(r)} for k, r in peers]


# -- where dumps go ----------------------------------------------------------------------------

def file_slug(text: str) -> str:
    """``text`` as a file-name part: letters, digits, ``_.-`` (never empty)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def job_id(env: dict[str, str] | None = None) -> str:
    """A name the ranks of one job share: Slurm's job id, PMIx's namespace (Open MPI 5), Open
    MPI's job id, else the launcher's process (the parent) on this node."""
    env = os.environ if env is None else env
    for var, prefix in (("SLURM_JOB_ID", "slurm"), ("PMIX_NAMESPACE", ""),
                        ("OMPI_MCA_ess_base_jobid", "ompi"), ("PMI_KVS_NAME", "")):
        value = env.get(var)
        if value:
            return file_slug(f"{prefix}-{value}" if prefix else value)
    return f"ppid{os.getppid()}"


def trace_dir(env: dict[str, str] | None = None) -> Path:
    """``BMLMPI_TRACE_DIR``, else ``bmlmpi-trace-<job>`` in the system's temporary folder."""
    d = config.get("BMLMPI_TRACE_DIR", env)
    if d is not None:
        return d
    return Path(tempfile.gettempdir()) / f"bmlmpi-trace-{job_id(env)}"


def world_rank() -> int:
    """This process's rank in ``MPI.COMM_WORLD``, -1 when MPI is not running."""
    try:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank()
    except Exception:  # noqa: BLE001 - a dump names the rank it can
        pass
    return -1


def _to_stderr(message: str) -> None:
    # os.write: the dump may come from the watchdog thread while the main one holds
    # sys.stderr's lock
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass


def _file_allowed() -> bool:
    """Whether an automatic dump may add a file (``BMLMPI_TRACE_FILES``); the first refusal
    is said on stderr."""
    limit = config.get("BMLMPI_TRACE_FILES")
    if len(_files) < limit:
        return True
    if not _capped[0]:
        _capped[0] = True
        _to_stderr(f"bmlmpi flight recorder: this process wrote {len(_files)} dump files "
                   f"(BMLMPI_TRACE_FILES={limit}); later failures on other communicators "
                   f"write none")
    return False


def dump_all(reason: str) -> list[Path]:
    """Dump every live recorder of this process (asked for: not counted against
    ``BMLMPI_TRACE_FILES``)."""
    out = []
    for rec in list(_live):
        try:
            path = rec.dump(reason, counted=False)
        except OSError as exc:
            _to_stderr(f"bmlmpi flight recorder: could not write its dump: {exc}")
            continue
        if path is not None:
            out.append(path)
    return out


# -- a clean end -------------------------------------------------------------------------------

CLEAN_END = "clean end"


def _is_clean_end(path: Path) -> bool:
    """Whether the dump at ``path`` is a clean end's (its reason is among the first bytes:
    the snapshot's keys keep their order)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return True  # gone already: another rank's clean end, removed
    return f'"reason": "{CLEAN_END}"'.encode() in head


def end_cleanly() -> list[Path]:
    """At the end of a program: every kept recorder that recorded calls and wrote no dump
    writes one (reason ``clean end``), so that ``bmlmpi-trace`` sees a rank that finished
    while the others waited (one that skipped a call) instead of a missing rank. Then
    ``MPI_Finalize``, which waits for every rank of the job; once it returned, every other
    rank's dumps of a failure are in its folder, and where none is (every dump there is a
    clean end's) this rank's own are removed, and the per-job default folder when it is left
    empty (a folder ``BMLMPI_TRACE_DIR`` names is the user's: kept): a job that went well
    leaves nothing. Without an ``MPI_Finalize`` to wait on (MPI finalized
    already, or mpi4py told not to finalize), nothing is written. Returns the files kept."""
    try:
        import mpi4py
        from mpi4py import MPI
    except ImportError:
        return []
    if (not MPI.Is_initialized() or MPI.Is_finalized()
            or getattr(mpi4py.rc, "finalize", None) is False):
        return []
    written = []
    for rec in list(_ending):
        if rec.dumps or rec.next <= 1:
            continue
        try:
            path = rec.dump(CLEAN_END, announce=False)
        except OSError:
            continue
        if path is not None:
            written.append(path)
    if not written:
        return []
    try:
        MPI.Finalize()
    except Exception:  # noqa: BLE001 - a failed finalize keeps the records
        return written
    folders = {p.parent for p in written}
    if any(not _is_clean_end(q) for d in folders for q in d.glob("bmlmpi-trace-*.json")):
        return written
    for p in written:
        with contextlib.suppress(OSError):
            p.unlink()
    if _files <= {str(p) for p in written}:
        # the file in torch's format holds nothing but the clean ends just removed
        for name in _torch_files:
            with contextlib.suppress(OSError):
                os.unlink(name)
    if config.get("BMLMPI_TRACE_DIR") is None:
        for d in folders:
            with contextlib.suppress(OSError):
                d.rmdir()
    return []


def _on_sigusr1(signum: int, frame: Any) -> None:
    dump_all("SIGUSR1")


def _install_signal_handler() -> None:
    """``SIGUSR1`` dumps every recorder, where the signal still has its default action (a
    program's own handler is left alone) and this is the main thread (Python's rule)."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or _signal_installed[0]:
        return
    with _signal_lock:
        if _signal_installed[0] or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_sigusr1)
        _signal_installed[0] = True


def recorder_capacity() -> int:
    """``BMLMPI_TRACE_CALLS``: the calls each recorder keeps; 0: no recorder."""
    return config.get("BMLMPI_TRACE_CALLS")
