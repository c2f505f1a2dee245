"""Hung-rank detection and fencing for the fault-tolerant communicator (MPI-free at run time).

Open MPI's ULFM reports a rank that died (a signal, ``os._exit(0)``) within milliseconds, but
never a rank that is alive and stuck: a stopped process (SIGSTOP), an endless loop, a deadlock
in native code. Its own heartbeat detector misbehaved on the development machine (false deaths,
hangs in Finalize), so bmlmpi runs its own:

* every rank's daemon thread writes ``time.monotonic()`` every ``period`` seconds into a small
  file of its own (``/dev/shm/bmlmpi-hb-<token>/<original rank>``, the token drawn by rank 0 and
  broadcast when the communicator is built; the system temp folder when /dev/shm is missing);
  the file also records the pid, the process start time and the host name;
* while the main thread waits inside bmlmpi (:meth:`Heartbeat.watching`), the same thread reads
  its peers' files; a peer whose beat is older than ``hang_timeout`` and whose process still
  exists (same pid *and* start time, so a recycled pid is never hit) is **fenced**: SIGKILL.
  ULFM then reports it like any other death, and recovery proceeds;
* a peer whose process no longer exists and which MPI has still not reported another
  ``hang_timeout`` later (Open MPI's runtime never reports a rank that exited with a non-zero
  status) is recorded in :attr:`vanished`; the communicator raises a clear error instead of
  waiting for it forever. (The grace matters: a peer fenced by another rank is gone before MPI
  has told everyone.)

The thread does no MPI, so it needs no thread support from the MPI library, and keeps beating
while the main thread sits in a blocking MPI call (mpi4py releases the GIL there).

Fencing is local only: ranks on other hosts have no file here, so they are not watched; a hung
remote rank surfaces at the communicator's deadline. Fencing across hosts needs the launcher
(e.g. a PMIx or Slurm job step signal), which this library does not drive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator

# pid, process start time (clock ticks since boot), host name, last beat (monotonic seconds)
_HEADER = struct.Struct("<qq64s")
_BEAT = struct.Struct("<d")
_BEAT_OFFSET = _HEADER.size


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[1].split()
    state = fields[0]
    if state in (b"Z", b"X"):  # a zombie has exited: only its parent has not reaped it yet
        return None
    return int(fields[19])


def heartbeat_root() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


class Heartbeat:
    """This rank's beat, and the watch over its peers' beats (see the module docstring)."""

    def __init__(self, token: str, me: int, period: float, hang_timeout: float):
        if period <= 0 or hang_timeout <= 0:
            raise ValueError(f"heartbeat period and hang timeout must be positive, got "
                             f"{period}, {hang_timeout}")
        self.token = token   # the communicator's: names the folder of its beats
        self.period = period
        self.hang_timeout = hang_timeout
        self.me = me
        self.host = socket.gethostname()[:64]
        self.folder = os.path.join(heartbeat_root(), f"bmlmpi-hb-{token}")
        os.makedirs(self.folder, exist_ok=True)
        self._path = os.path.join(self.folder, str(me))
        pid = os.getpid()
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(self._fd, _HEADER.pack(pid, _start_time(pid) or 0,
                                         self.host.encode()) + _BEAT.pack(time.monotonic()), 0)
        self._peers: tuple[int, ...] = ()
        self._busy = 0
        self._lock = threading.Lock()
        self.fenced: dict[int, float] = {}    # peer -> when it was SIGKILLed
        self.vanished: dict[int, str] = {}    # peer -> why it is considered gone unreported
        self._gone_since: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"bmlmpi-heartbeat-{me}",
                                        daemon=True)
        self._thread.start()

    # -- main-thread side -----------------------------------------------------------------
    def watch(self, peers: Iterable[int]) -> None:
        """The original ranks to watch (this rank's own is ignored)."""
        self._peers = tuple(p for p in peers if p != self.me)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Peers are checked (and fenced) while the main thread is inside this block."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1

    def forget(self, peers: Iterable[int]) -> None:
        """Remove the files of peers known dead (their processes cannot)."""
        for p in peers:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, str(p)))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.period + 1)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            os.unlink(self._path)
        self._sweep()
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)  # the last rank out removes the folder

    def _sweep(self) -> None:
        """Remove the files of this host's processes that are gone (killed ranks leave theirs)."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            if not name.isdigit():
                continue
            info = self._read(int(name))
            if info is not None and info[2] == self.host and _start_time(info[0]) != info[1]:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, name))

    # -- the daemon thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                os.pwrite(self._fd, _BEAT.pack(time.monotonic()), _BEAT_OFFSET)
            except OSError:
                return
            if self._busy:
                self._check()

    def _read(self, peer: int) -> tuple[int, int, str, float] | None:
        try:
            with open(os.path.join(self.folder, str(peer)), "rb") as f:
                data = f.read(_HEADER.size + _BEAT.size)
        except OSError:
            return None
        if len(data) < _HEADER.size + _BEAT.size:
            return None
        pid, start, host = _HEADER.unpack_from(data)
        (beat,) = _BEAT.unpack_from(data, _BEAT_OFFSET)
        return pid, start, host.rstrip(b"\0").decode(errors="replace"), beat

    def _check(self) -> None:
        now = time.monotonic()
        for peer in self._peers:
            if peer in self.fenced or peer in self.vanished:
                continue
            info = self._read(peer)
            if info is None:
                continue  # not on this host, or not started: nothing to judge by
            pid, start, host, beat = info
            if host != self.host or now - beat <= self.hang_timeout:
                continue
            if _start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                self.fenced[peer] = now
                continue
            # Gone. Usually MPI reports it within milliseconds (a signal, another rank's
            # fencing, os._exit(0)); only if it has not after another hang_timeout is it
            # treated as gone unreported.
            since = self._gone_since.setdefault(peer, now)
            if now - since > self.hang_timeout:
                self.vanished[peer] = (f"rank {peer} (pid {pid}) stopped beating "
                                       f"{now - beat:.1f} s ago and its process is gone")
