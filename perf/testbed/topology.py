"""The emulated networks as plain data: servers, NICs, switches, addresses and routes.

Nothing here touches the system; :mod:`perf.testbed.netns` turns a :class:`Network` into
namespaces, veth pairs, bridges, tc qdiscs and routes.

BCube(n_0, …, n_{k-1}) (level 0 first): N = prod(n_l) servers, each with k NICs ``eth0…eth{k-1}``;
server r's digit l is ``(r // (n_0·…·n_{l-1})) % n_l``; the level-l switch of server r is the
number made of r's other digits, and the n_l servers on it differ from r only in digit l.

Addresses (all inside 198.18.0.0/15, the benchmarking range): server r's NIC on level l is
``198.18.l.(r+1)``. On BCube each address is a /32 with explicit routes, because one level's
addresses sit on several isolated bridges. A server reaches another by digit correction: the
next hop fixes the lowest digit in which the two differ, over that level's NIC, so 1-hop
neighbours (one digit apart) are reached directly on the NIC of their shared switch, and servers
k digits apart through k-1 forwarding servers. The Fat-Tree twin has one NIC per server on a single
bridge and one on-link /24.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

PREFIX = "bml-"
SWITCH_NS = PREFIX + "sw"
NET = ipaddress.ip_network("198.18.0.0/15")
MAX_SERVERS = 254


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3x3"`` → ``(3, 3)``; radices ≥ 2, level 0 first."""
    try:
        radices = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad BCube shape {text!r}: expected radices like '3x3' or '2x2x2'") \
            from None
    if not radices or any(r < 2 for r in radices):
        raise ValueError(f"bad BCube shape {text!r}: every radix must be >= 2")
    return radices


def digits(r: int, radices: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in radices:
        out.append(r % n)
        r //= n
    return tuple(out)


def undigits(ds: tuple[int, ...], radices: tuple[int, ...]) -> int:
    r, scale = 0, 1
    for d, n in zip(ds, radices, strict=True):
        r += d * scale
        scale *= n
    return r


def server_ns(r: int) -> str:
    return f"{PREFIX}s{r}"


def address(level: int, r: int) -> str:
    return f"198.18.{level}.{r + 1}"


@dataclass(frozen=True)
class Link:
    """A veth pair: ``nic`` inside the server's namespace, ``port`` on a bridge in SWITCH_NS."""
    server: int
    level: int
    nic: str
    port: str
    bridge: str


@dataclass(frozen=True)
class Route:
    server: int
    dest: str
    nic: str
    via: str | None  # None: the destination is on the link itself


@dataclass
class Network:
    kind: str            # "bcube" or "fattree"
    shape: str           # "3x3" or the server count for a Fat-Tree
    radices: tuple[int, ...]
    links: list[Link] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    prefix_len: int = 32  # the length of each NIC address

    @property
    def servers(self) -> int:
        return math.prod(self.radices) if self.kind == "bcube" else self.radices[0]

    @property
    def nics(self) -> int:
        return len(self.radices) if self.kind == "bcube" else 1

    @property
    def bridges(self) -> list[str]:
        return sorted({link.bridge for link in self.links})

    def namespaces(self) -> list[str]:
        return [server_ns(r) for r in range(self.servers)]

    def host_address(self, r: int) -> str:
        """The address MPI uses for server r (its eth0)."""
        return address(0, r)

    def addresses(self, r: int) -> list[str]:
        return [address(lv, r) for lv in range(self.nics)]

    def describe(self) -> dict:
        return {"kind": self.kind, "shape": self.shape, "radices": list(self.radices),
                "servers": self.servers, "nics_per_server": self.nics,
                "switches": len(self.bridges)}


def bcube(shape: str) -> Network:
    radices = parse_shape(shape)
    n = math.prod(radices)
    if n > MAX_SERVERS:
        raise ValueError(f"BCube {shape} has {n} servers; the addressing allows {MAX_SERVERS}")
    net = Network("bcube", "x".join(map(str, radices)), radices)
    for r in range(n):
        ds = digits(r, radices)
        for lv in range(len(radices)):
            # The switch number: r's digits without digit lv, as a mixed-radix number.
            rest = tuple(d for i, d in enumerate(ds) if i != lv)
            sw = undigits(rest, tuple(x for i, x in enumerate(radices) if i != lv))
            net.links.append(Link(r, lv, f"eth{lv}", f"s{r}l{lv}", f"br{lv}-{sw}"))
    for r in range(n):
        for m in range(n):
            if m == r:
                continue
            lv, hop = next_hop(r, m, radices)
            for dest in net.addresses(m):
                net.routes.append(Route(r, dest, f"eth{lv}", address(lv, hop)))
    return net


def next_hop(r: int, m: int, radices: tuple[int, ...]) -> tuple[int, int]:
    """(level, server) of the first hop from r towards m: fix the lowest differing digit."""
    dr, dm = digits(r, radices), digits(m, radices)
    lv = next(i for i in range(len(radices)) if dr[i] != dm[i])
    return lv, undigits(dr[:lv] + (dm[lv],) + dr[lv + 1:], radices)


def fattree(servers: int) -> Network:
    """The one-NIC twin: every server on one bridge (a non-blocking switch) at the same rate."""
    if not 2 <= servers <= MAX_SERVERS:
        raise ValueError(f"a Fat-Tree needs 2..{MAX_SERVERS} servers, not {servers}")
    net = Network("fattree", str(servers), (servers,), prefix_len=24)
    for r in range(servers):
        net.links.append(Link(r, 0, "eth0", f"s{r}l0", "br0-0"))
    return net


def build(kind: str, shape: str) -> Network:
    if kind == "bcube":
        return bcube(shape)
    if kind == "fattree":
        try:
            servers = int(shape)
        except ValueError:
            # "3x3" names the BCube whose twin is wanted
            servers = math.prod(parse_shape(shape))
        return fattree(servers)
    raise ValueError(f"unknown topology {kind!r}: expected 'bcube' or 'fattree'")


def neighbours(r: int, level: int, radices: tuple[int, ...]) -> list[int]:
    """The other servers on r's level-``level`` switch."""
    ds = digits(r, radices)
    return [undigits(ds[:level] + (b,) + ds[level + 1:], radices)
            for b in range(radices[level]) if b != ds[level]]


def split_label(name: str) -> tuple[str, str | None]:
    """``"bml@2x2x2"`` → ``("bml", "2x2x2")``: an algorithm run on a BCube shape of the ranks
    (several ranks a server: the shape whose level 0 is the local rank, or any other);
    ``"ring"`` → ``("ring", None)``."""
    algorithm, _, shape = name.partition("@")
    return algorithm, shape or None
