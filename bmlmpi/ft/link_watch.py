"""A failed link masks the server at its end (the BML slides): the NIC watch that makes it so.

A link that goes down does not kill a process, and MPI does not report it: the server behind it
is alive, its heartbeat keeps beating (the heartbeat is a file, not the network), and its peers
only see transfers that stop making progress, until the deadline ends the call on every rank.
Seed 001 handles a link failure as the failure of a server at its end. The watch does that at
the server whose NIC went down: a daemon thread reads the state of the given interfaces (in the
process's own network namespace, i.e. the emulated server's under ``ip netns exec``) every
``period`` seconds, and when one is down it SIGKILLs its own process. ULFM reports that death
to the others within milliseconds (the runtime's connections do not use the emulated links),
and the survivors recover as from any death: the interrupted call finishes with the exact
reduction over them, and the next calls run on the recovery schedule without that server.

An interface counts as down when it is administratively down (``ip link set … down``: no
``IFF_UP`` in ``/sys/class/net/<name>/flags``) or its operational state is ``down`` or
``lowerlayerdown`` (the other end of a veth pair went down). Detection takes at most ``period``
plus the time MPI needs to report the death.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

IFF_UP = 0x1
_SYS = "/sys/class/net"


def link_down(name: str) -> bool:
    """True when interface ``name`` of this network namespace is down (or has vanished)."""
    try:
        with open(os.path.join(_SYS, name, "flags")) as f:
            flags = int(f.read().strip(), 16)
        with open(os.path.join(_SYS, name, "operstate")) as f:
            state = f.read().strip()
    except (OSError, ValueError):
        return True
    return not flags & IFF_UP or state in ("down", "lowerlayerdown")


class LinkWatch:
    """Fences this process (SIGKILL) as soon as one of ``names`` is down."""

    def __init__(self, names: Sequence[str], period: float):
        names = tuple(names)
        if not names:
            raise ValueError("watch_links needs at least one interface name")
        if period <= 0:
            raise ValueError(f"the link watch period must be positive, got {period}")
        missing = [n for n in names if not os.path.isdir(os.path.join(_SYS, n))]
        if missing:
            raise ValueError(f"watch_links: no interface {missing} in this network namespace "
                             f"(have {sorted(os.listdir(_SYS))})")
        down = [n for n in names if link_down(n)]
        if down:
            raise ValueError(f"watch_links: interface(s) {down} are already down")
        self.names = names
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bmlmpi-link-watch",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            down = [n for n in self.names if link_down(n)]
            if down:
                sys.stderr.write(f"bmlmpi: link {down[0]} is down; masking this server "
                                 f"(SIGKILL on pid {os.getpid()}) so the others go on\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        self._stop.set()
