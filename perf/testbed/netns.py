"""Builds and removes a :class:`~perf.testbed.topology.Network` with namespaces, veth, bridges, tc.

Layout: one namespace per server (``bml-s<r>``), one namespace ``bml-sw`` holding every switch as
a Linux bridge. Each veth pair is created with its two ends directly in those namespaces, so the
host's own namespace never holds an interface of the testbed and nothing can reach it.

Rate limits: every veth end gets a tbf root qdisc at the link rate, so each link is limited in
both directions (server→switch on the server's NIC, switch→server on the bridge port). The burst
is at least 256 KiB: with a smaller bucket the qdisc wakes so often that the CPU, not the token
rate, sets the throughput. The kernel has no netem, so links have bandwidth but no added delay.

TCP congestion control: every server namespace is set to :data:`DEFAULT_CC` (``reno``) unless
told otherwise. A new namespace otherwise inherits the host's default, which on this machine is
``bbr``, and BBR leaves these links partly idle when flows share a queue, as every NIC does
during a BML step (our reading: BBR bounds its data in flight by its bandwidth estimate times
the smallest RTT it has seen, tens of microseconds over a veth; measured at 200 Mbit/s: BML on
BCube 3x3 1.63 s with bbr, 1.28 s with reno; bmlmpi's ring on the Fat-Tree twin, one flow per
link, 2.59 s and 2.50 s). ``cubic``, Linux's usual default, is listed as available but refused
inside a namespace on this kernel (EIO).

Everything is named with the prefix ``bml-`` so :func:`down` removes leftovers of any earlier run
by name, including processes still running inside those namespaces.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .topology import PREFIX, SWITCH_NS, Network, build, server_ns

STATE_FILE = Path("/run") / f"{PREFIX}testbed.json"
LOCK_FILE = Path("/run") / f"{PREFIX}testbed.lock"
CMD_TIMEOUT = 30.0
MIN_BURST = 256 * 1024
DEFAULT_CC = "reno"
DEFAULT_MTU = 1500


class TestbedError(RuntimeError):
    pass


def sh(args: list[str], *, stdin: str | None = None, check: bool = True,
       timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}"
                           + (f"\ninput:\n{stdin}" if stdin else ""))
    return proc


def ip_batch(ns: str | None, lines: list[str]) -> None:
    """Runs many ``ip`` commands in one process (inside ``ns`` when given)."""
    if lines:
        sh(["ip", *(["-n", ns] if ns else []), "-batch", "-"], stdin="\n".join(lines) + "\n")


def tc_batch(ns: str, lines: list[str]) -> None:
    if lines:
        sh(["tc", "-n", ns, "-batch", "-"], stdin="\n".join(lines) + "\n")


def ns_sysctl(ns: str, settings: dict[str, str]) -> None:
    # /proc/sys/net is per network namespace: write it from a shell inside the namespace.
    script = "; ".join(f"echo {v} > /proc/sys/{k.replace('.', '/')}" for k, v in settings.items())
    sh(["ip", "netns", "exec", ns, "sh", "-ec", script])


def parse_rate(rate: str) -> float:
    """``'200mbit'`` → bits per second (tc's decimal units)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    text = rate.strip().lower()
    for unit, scale in units.items():
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * scale
            except ValueError:
                break
    raise ValueError(f"bad rate {rate!r}: expected e.g. '200mbit' or '1gbit'")


def shaper(dev: str, rate: str) -> str:
    bps = parse_rate(rate)
    # A 50 ms queue, but never less than two bursts: enough for TCP to keep the link busy.
    burst = max(MIN_BURST, int(bps / 8 * 0.002))
    limit = max(2 * burst, int(bps / 8 * 0.05))
    return f"qdisc replace dev {dev} root tbf rate {rate} burst {burst} limit {limit}"


@contextmanager
def lock() -> Iterator[None]:
    """Exclusive use of the testbed for one command or experiment; fails at once when another
    process holds it (one machine holds one testbed: 'up' would tear down the other's)."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            raise TestbedError(f"the testbed is in use by process {holder or '?'}; wait for "
                               f"it, or 'down --force' to break in") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def busy() -> bool:
    """Whether another process holds the testbed lock right now."""
    try:
        with lock():
            return False
    except TestbedError:
        return True


def existing_namespaces() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.split()[0].startswith(PREFIX)]


def check_link_settings(cc: str, mtu: int) -> None:
    """Rejects a congestion control the kernel does not offer and an MTU veth cannot take."""
    avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    offered = avail.read_text().split() if avail.exists() else []
    if offered and cc not in offered:
        raise ValueError(f"congestion control {cc!r} is not available here "
                         f"(available: {' '.join(offered)})")
    if not 68 <= mtu <= 65535:
        raise ValueError(f"MTU {mtu} out of range (68-65535)")


def link_options(parser) -> None:
    """The ``--cc`` and ``--mtu`` options of every command that builds a testbed."""
    parser.add_argument("--cc", default=DEFAULT_CC,
                        help=f"TCP congestion control in every server (default {DEFAULT_CC}; "
                             f"see perf/testbed/README.md for why not the host's default)")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU,
                        help=f"MTU of every NIC, port and bridge (default {DEFAULT_MTU})")


def up(kind: str, shape: str, rate: str, *, cc: str = DEFAULT_CC,
       mtu: int = DEFAULT_MTU) -> Network:
    """Builds the network (after removing any leftover); on any failure removes it again."""
    net = build(kind, shape)
    parse_rate(rate)
    check_link_settings(cc, mtu)
    down()
    try:
        _create(net, rate, cc, mtu)
        STATE_FILE.write_text(json.dumps({**net.describe(), "rate": rate,
                                          "rate_bps": parse_rate(rate), "cc": cc, "mtu": mtu,
                                          "created": time.time()}))
    except BaseException:
        down()
        raise
    return net


def _create(net: Network, rate: str, cc: str, mtu: int) -> None:
    quiet = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
    ip_batch(None, [f"netns add {ns}" for ns in [SWITCH_NS, *net.namespaces()]])
    ns_sysctl(SWITCH_NS, quiet)
    for ns in net.namespaces():
        # Forwarding carries 2-hop paths; rp_filter off because a reply may arrive on a NIC other
        # than the one holding the address it was sent to (the weak host model).
        try:
            ns_sysctl(ns, {**quiet, "net.ipv4.ip_forward": "1" if net.kind == "bcube" else "0",
                           "net.ipv4.conf.all.rp_filter": "0",
                           "net.ipv4.conf.default.rp_filter": "0",
                           "net.ipv4.tcp_congestion_control": cc})
        except TestbedError as exc:
            raise TestbedError(f"could not set up {ns} (congestion control {cc!r} refused "
                               f"inside a namespace?): {exc}") from exc
    sw = [f"link add {b} type bridge stp_state 0" for b in net.bridges]
    sw += [f"link set {b} up" for b in net.bridges]
    ip_batch(SWITCH_NS, sw)
    ip_batch(None, [f"link add name {ln.nic} mtu {mtu} netns {server_ns(ln.server)} type veth "
                    f"peer name {ln.port} mtu {mtu} netns {SWITCH_NS}" for ln in net.links])
    ip_batch(SWITCH_NS, [f"link set {ln.port} master {ln.bridge} up" for ln in net.links]
             + [f"link set {b} mtu {mtu}" for b in net.bridges])
    tc_batch(SWITCH_NS, [shaper(ln.port, rate) for ln in net.links])
    for r, ns in enumerate(net.namespaces()):
        mine = [ln for ln in net.links if ln.server == r]
        cmds = ["link set lo up"]
        for ln in mine:
            cmds.append(f"addr add {net.addresses(r)[ln.level]}/{net.prefix_len} dev {ln.nic}")
            cmds.append(f"link set {ln.nic} up")
        for rt in net.routes:
            if rt.server == r:
                via = f"via {rt.via} " if rt.via else ""
                cmds.append(f"route add {rt.dest}/32 {via}dev {rt.nic} onlink")
        ip_batch(ns, cmds)
        tc_batch(ns, [shaper(ln.nic, rate) for ln in mine])


def down() -> list[str]:
    """Removes every ``bml-`` namespace (killing what still runs in it) and the state file."""
    names = existing_namespaces()
    for ns in names:
        _kill_namespace_processes(ns)
    # Deleting a namespace deletes its veth ends, and with them their peers.
    for ns in names:
        sh(["ip", "netns", "del", ns], check=False)
    # Host-side leftovers by name (an interrupted 'link add' before it was moved).
    out = sh(["ip", "-o", "link", "show"], check=False).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            sh(["ip", "link", "del", name], check=False)
    STATE_FILE.unlink(missing_ok=True)
    return names


def _kill_namespace_processes(ns: str) -> None:
    pids = [int(p) for p in sh(["ip", "netns", "pids", ns], check=False).stdout.split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def state() -> dict:
    if not STATE_FILE.exists():
        raise TestbedError("no testbed is up: run 'python -m perf.testbed up bcube 3x3' first")
    return json.loads(STATE_FILE.read_text())


def current() -> Network:
    st = state()
    return build(st["kind"], st["shape"])


@contextmanager
def testbed(kind: str, shape: str, rate: str, *, cc: str = DEFAULT_CC,
            mtu: int = DEFAULT_MTU) -> Iterator[Network]:
    """A network that is removed on leaving the block, also on error or Ctrl-C; the testbed
    lock is held throughout."""
    with lock():
        net = up(kind, shape, rate, cc=cc, mtu=mtu)
        try:
            yield net
        finally:
            down()


def available() -> tuple[bool, str]:
    """Whether this machine lets us build namespaces (root, iproute2, netns)."""
    if os.geteuid() != 0:
        return False, "needs root"
    probe = f"{PREFIX}probe"
    try:
        proc = sh(["ip", "netns", "add", probe], check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"ip not usable: {exc}"
    if proc.returncode != 0:
        return False, f"ip netns add failed: {proc.stderr.strip()}"
    try:
        tc = sh(["tc", "-n", probe, "qdisc", "show"], check=False, timeout=10)
        if tc.returncode != 0:
            return False, f"tc not usable: {tc.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"tc not usable: {exc}"
    finally:
        sh(["ip", "netns", "del", probe], check=False, timeout=10)
    return True, "ok"
