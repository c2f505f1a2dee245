"""Verifies a running testbed end to end and says what it found.

Runs :mod:`perf.testbed.ranks` ``check`` over the namespaces and judges it:
- per BCube level, each rank's exchange with its 1-hop neighbours left through that level's NIC
  (at least the bytes sent) while its other NICs stayed near idle;
- the allreduce result is exact on every rank;
- under bml on a BCube, each NIC of each server carried its theoretical share (at least it, at
  most ``BALANCE`` times it, MPI and TCP headers included), so NICs of equal radix carry equal
  shares within 10%;
- the network is closed (addresses and routes in 198.18.0.0/15, no interface in the host's
  namespace) and every byte the servers sent entered a switch port, and vice versa;
- every server runs the congestion control and every NIC, port and bridge the MTU that ``up``
  was given.
"""

from __future__ import annotations

import json

from . import counters, mpi, netns
from .theory import bml_nic_shares

BALANCE = 1.10
IDLE_BYTES = 64 * 1024  # what MPI's own chatter may put on an uninvolved NIC during one level


def parse_result(stdout: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"the ranks printed no RESULT line; output:\n{stdout[-4000:]}")


def link_settings(net, st: dict) -> list[str]:
    """Differences between the congestion control and MTUs in place and those asked for."""
    problems = []
    want_cc, want_mtu = st.get("cc", netns.DEFAULT_CC), st.get("mtu", netns.DEFAULT_MTU)
    for ns in net.namespaces():
        cc = netns.sh(["ip", "netns", "exec", ns, "cat",
                       "/proc/sys/net/ipv4/tcp_congestion_control"]).stdout.strip()
        if cc != want_cc:
            problems.append(f"{ns}: congestion control {cc}, not {want_cc}")
    for ns in [*net.namespaces(), netns.SWITCH_NS]:
        for link in json.loads(netns.sh(["ip", "-n", ns, "-j", "link", "show"]).stdout):
            if link["ifname"] != "lo" and link.get("mtu") != want_mtu:
                problems.append(f"{ns} {link['ifname']}: MTU {link.get('mtu')}, not {want_mtu}")
    return problems


def check(algorithm: str = "bml", nbytes: int = 4 << 20, *, timeout: float = 120.0,
          neighbour_bytes: int = 1 << 20) -> dict:
    st = netns.state()
    net = netns.current()
    before = counters.settled_snapshot()
    proc = mpi.run(net, ["python", "-m", "perf.testbed.ranks", "check", "--kind", net.kind,
                         "--shape", net.shape, "--algorithm", algorithm, "--bytes", str(nbytes),
                         "--neighbour-bytes", str(neighbour_bytes)], timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    result = parse_result(proc.stdout)
    job = counters.delta(before, counters.settled_snapshot())
    problems: list[str] = []
    for rank in result["ranks"]:
        r = rank["rank"]
        if not rank["allreduce_ok"]:
            problems.append(f"rank {r}: wrong allreduce result")
        for level in rank["levels"]:
            lv, nics = level["level"], level["nics"]
            sent = neighbour_bytes * len(level["peers"])
            if not level["data_ok"]:
                problems.append(f"rank {r} level {lv}: wrong data from a neighbour")
            if nics[f"eth{lv}"]["tx_bytes"] < sent:
                problems.append(f"rank {r} level {lv}: eth{lv} sent "
                                f"{nics[f'eth{lv}']['tx_bytes']} < {sent} bytes")
            for nic, v in nics.items():
                if nic != f"eth{lv}" and v["tx_bytes"] > IDLE_BYTES:
                    problems.append(f"rank {r} level {lv}: {nic} sent {v['tx_bytes']} bytes")
    spreads = []
    if net.kind == "bcube" and algorithm == "bml":
        shares = bml_nic_shares(net.radices)
        for rank in result["ranks"]:
            for key in ("tx_bytes", "rx_bytes"):
                # Each NIC against its theoretical share (equal shares when the radices are
                # equal), so the spread is that of measured/expected across a server's NICs.
                ratios = [rank["allreduce_nics"][f"eth{lv}"][key] / (share * nbytes)
                          for lv, share in enumerate(shares)]
                spread = max(ratios) / max(min(ratios), 1e-9)
                spreads.append(spread)
                if spread > BALANCE or not 1.0 <= min(ratios) <= max(ratios) <= BALANCE:
                    problems.append(f"rank {rank['rank']}: NIC {key} / expected share = "
                                    f"{[round(x, 3) for x in ratios]}")
    closed = counters.isolation(net)
    problems += closed["problems"]
    problems += link_settings(net, st)
    flow = counters.conservation(net, job)
    if not flow["balanced"]:
        problems.append(f"bytes not conserved between servers and switch ports: {flow}")
    return {"ok": not problems, "problems": problems, "testbed": st, "algorithm": algorithm,
            "bytes": nbytes, "worst_nic_spread": max(spreads) if spreads else None,
            "allreduce_seconds": max(rk["seconds"] for rk in result["ranks"]),
            "allreduce_nic_bytes": {rk["rank"]: rk["allreduce_nics"] for rk in result["ranks"]},
            "conservation": flow}
