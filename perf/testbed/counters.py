"""Per-NIC byte counters of the testbed, and the checks made on them.

Counters come from the kernel (``ip -s -j link``) inside every ``bml-`` namespace: each server's
NICs and each bridge port. They count everything the links carried, MPI's headers and TCP's
acknowledgements included.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from statistics import mean

from .netns import existing_namespaces, sh
from .topology import NET, SWITCH_NS, Network, server_ns


def read_namespace(ns: str) -> dict[str, dict[str, int]]:
    out = sh(["ip", "-n", ns, "-s", "-j", "link", "show"]).stdout
    nics = {}
    for link in json.loads(out):
        if link["ifname"] == "lo":
            continue
        stats = link.get("stats64", link.get("stats", {}))
        nics[link["ifname"]] = {"tx_bytes": int(stats["tx"]["bytes"]),
                                "rx_bytes": int(stats["rx"]["bytes"]),
                                "tx_packets": int(stats["tx"]["packets"]),
                                "rx_packets": int(stats["rx"]["packets"])}
    return nics


def snapshot() -> dict[str, dict[str, dict[str, int]]]:
    """``{namespace: {interface: {tx_bytes, rx_bytes, tx_packets, rx_packets}}}``."""
    return {ns: read_namespace(ns) for ns in sorted(existing_namespaces())}


def settled_snapshot(timeout: float = 3.0) -> dict:
    """A snapshot taken once the counters stop moving (namespaces are read one after another,
    so a packet in flight between two reads would break the server/switch comparison)."""
    deadline = time.monotonic() + timeout
    last = snapshot()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        cur = snapshot()
        if cur == last:
            return cur
        last = cur
    return last


def delta(before: dict, after: dict) -> dict:
    return {ns: {nic: {key: after[ns][nic][key] - before.get(ns, {}).get(nic, {}).get(key, 0)
                       for key in after[ns][nic]}
                 for nic in after[ns]}
            for ns in after}


def server_bytes(net: Network, diff: dict) -> list[dict[str, int]]:
    """Per server, per NIC: the bytes it sent (``eth<l>`` tx)."""
    return [{nic: v["tx_bytes"] for nic, v in sorted(diff[server_ns(r)].items())}
            for r in range(net.servers)]


def nic_balance(net: Network, diff: dict) -> dict:
    """How evenly each server's NICs carried its traffic: max/min of tx bytes and rx bytes."""
    worst = 1.0
    per_server = []
    for r in range(net.servers):
        nics = diff[server_ns(r)]
        entry = {}
        for key in ("tx_bytes", "rx_bytes"):
            values = [nics[n][key] for n in sorted(nics)]
            spread = max(values) / min(values) if min(values) > 0 else float("inf")
            entry[key] = values
            entry[key.split("_")[0] + "_spread"] = spread
            worst = max(worst, spread)
        per_server.append(entry)
    return {"worst_spread": worst, "servers": per_server}


def conservation(net: Network, diff: dict) -> dict:
    """Every byte a server sent entered a bridge port, every byte it received left one.

    A mismatch would mean traffic went somewhere other than the testbed's own links.
    """
    sent = sum(diff[server_ns(r)][n]["tx_bytes"] for r in range(net.servers)
               for n in diff[server_ns(r)])
    received = sum(diff[server_ns(r)][n]["rx_bytes"] for r in range(net.servers)
                   for n in diff[server_ns(r)])
    ports = diff.get(SWITCH_NS, {})
    port_rx = sum(v["rx_bytes"] for name, v in ports.items() if not name.startswith("br"))
    port_tx = sum(v["tx_bytes"] for name, v in ports.items() if not name.startswith("br"))
    return {"servers_tx": sent, "ports_rx": port_rx, "servers_rx": received, "ports_tx": port_tx,
            "balanced": sent == port_rx and received == port_tx}


def isolation(net: Network) -> dict:
    """Proof that the testbed is closed: every server address and route lies in 198.18.0.0/15
    (no default route), every switch port is one of the testbed's veth ends on one of its
    bridges, and the host's own namespace holds no interface of the testbed."""
    problems = []
    for r in range(net.servers):
        ns = server_ns(r)
        for link in json.loads(sh(["ip", "-n", ns, "-j", "addr", "show"]).stdout):
            for a in link.get("addr_info", []):
                if a.get("family") == "inet" and link["ifname"] != "lo" \
                        and ipaddress.ip_address(a["local"]) not in NET:
                    problems.append(f"{ns} {link['ifname']} has {a['local']}")
        for route in json.loads(sh(["ip", "-n", ns, "-j", "route", "show"]).stdout):
            dst = route.get("dst", "")
            if dst == "default" or not ipaddress.ip_network(dst, strict=False).subnet_of(NET):
                problems.append(f"{ns} routes {dst}")
    expected = {ln.port: ln.bridge for ln in net.links}
    for link in json.loads(sh(["ip", "-n", SWITCH_NS, "-j", "link", "show"]).stdout):
        name = link["ifname"]
        if name == "lo" or name in net.bridges:
            continue
        if expected.get(name) != link.get("master"):
            problems.append(f"switch port {name} on {link.get('master')}")
    for link in json.loads(sh(["ip", "-j", "link", "show"]).stdout):
        if re.fullmatch(r"bml-.*|s\d+l\d+", link["ifname"]):
            problems.append(f"host namespace holds {link['ifname']}")
    return {"ok": not problems, "problems": problems}


def summary(net: Network, diff: dict) -> dict:
    tx = [sum(v["tx_bytes"] for v in diff[server_ns(r)].values()) for r in range(net.servers)]
    return {"total_tx_bytes": sum(tx), "mean_server_tx_bytes": mean(tx),
            "per_server_nic_tx": server_bytes(net, diff), "balance": nic_balance(net, diff),
            "conservation": conservation(net, diff)}
