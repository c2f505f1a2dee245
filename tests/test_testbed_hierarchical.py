"""The testbed with several ranks per server (perf/testbed, perf/hierarchical/testbed.py).

Without system access: where ``mpiexec`` puts each rank, the algorithm labels with a BCube
shape, and the experiment's theory (the cost model of the schedules the ranks run) against the
closed forms of :mod:`bmlmpi.schedules.hierarchical`. On real namespaces (root, ``ip netns``,
``tc``, the MPICH venv; skipped with the reason otherwise): BCube 2x2 with 2 ranks per server
runs hierarchical and flat BML with exact results, the two ranks of a server talk over the
namespace's loopback (its byte counter carries the schedule's intra-node bytes) and the NICs
carry the inter-node bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # perf/ is not an installed package
    sys.path.insert(0, str(REPO))

from test_testbed_smoke import namespaces_allowed  # noqa: E402

from bmlmpi.schedules.hierarchical import theory_t_f  # noqa: E402
from perf.hierarchical import testbed as hier_testbed  # noqa: E402
from perf.testbed import mpi, topology  # noqa: E402
from perf.testbed.topology import split_label  # noqa: E402


def test_consecutive_ranks_share_a_server_namespace():
    net = topology.build("bcube", "2x2")
    cmd = mpi.mpmd_command(net, ["python", "x.py"], per_server=2)
    namespaces = [cmd[i + 5] for i, word in enumerate(cmd) if word == "-n"]
    assert namespaces == [topology.server_ns(s) for s in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert len(mpi.mpmd_command(net, ["x"], ranks=5, per_server=2)) == 1 + 5 * 7 + 4
    with pytest.raises(ValueError, match="do not fit"):
        mpi.mpmd_command(net, ["x"], ranks=9, per_server=2)
    with pytest.raises(ValueError, match="at least one rank"):
        mpi.mpmd_command(net, ["x"], per_server=0)
    assert mpi.node_env(2) == {"BMLMPI_RANKS_PER_NODE": "2"} and mpi.node_env(1) == {}


def test_labels_name_every_shape_of_the_ranks():
    assert split_label("bml@2x2x2") == ("bml", "2x2x2")
    assert split_label("ring") == ("ring", None)
    assert hier_testbed.labels(8) == ["hierarchical", "bml@2x2x2", "bml@2x4", "bml@4x2",
                                      "bml@8", "ring"]


@pytest.mark.parametrize("shape", [(2, 2), (3, 3)])
def test_theory_matches_the_docstring_formulas(shape):
    m, r, nbytes = shape[0] * shape[1], 2, 4 * 2**6 * 3**4 * 5 * 7  # no range rounds
    for b in (4, 16):
        got = hier_testbed.model("hierarchical", shape, r, nbytes, b)
        assert got["t_f_b"] == pytest.approx(float(theory_t_f("hierarchical", m, r, b)))
        assert got["t_f"] == pytest.approx(float(Fraction(2 * (m - 1), 2 * m)), rel=1e-4)
        # two ranks a server: each sends half the buffer in the local reduce-scatter and
        # half in the allgather; the NICs carry the BCube-of-nodes BML's bytes, both levels
        assert got["intra_bytes_per_server"] == pytest.approx(2 * nbytes, rel=1e-6)
        assert got["nic_bytes_per_server"] == pytest.approx(
            2 * nbytes * 2 * (m - 1) / (2 * m), rel=1e-6)
        flat = hier_testbed.model(f"bml@{r}x{shape[0]}x{shape[1]}", shape, r, nbytes, b)
        assert flat["t_f_b"] == pytest.approx(float(theory_t_f("bml", m, r, b)))
        ring = hier_testbed.model("ring", shape, r, nbytes)
        assert ring["t_f"] == pytest.approx(2 * (2 * m - 1) / (2 * m))


@pytest.fixture
def bcube_2x2():
    why = namespaces_allowed()
    if why:
        pytest.skip(f"no emulated testbed here: {why}")
    from perf.testbed import netns
    with netns.testbed("bcube", "2x2", "200mbit") as net:
        yield net
    assert netns.existing_namespaces() == []


def test_two_ranks_per_server_on_bcube_2x2(bcube_2x2):
    nbytes = 2 << 20
    algs = ["hierarchical", "bml@2x2x2"]
    proc = mpi.run(bcube_2x2, ["python", "-m", "perf.testbed.ranks", "bench", "--kind",
                               "bcube", "--shape", "2x2", "--bytes", str(nbytes), "--reps", "1",
                               "--warmup", "1", "--algorithms", ",".join(algs)],
                   timeout=240, per_server=2)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:]
    out = json.loads(line[0][len("RESULT "):])
    assert out["ranks"] == 8
    for res in out["results"]:
        assert res["correct"], res["algorithm"]
        want = hier_testbed.model(res["algorithm"], (2, 2), 2, nbytes)
        row = hier_testbed.row(res, want, "200mbit", nbytes, 1.0, 2, 1)
        # TCP/IP headers and ACKs add a few per cent; a transfer on the wrong tier would
        # move whole megabytes between the two counters
        assert want["intra_bytes_per_server"] <= row["measured_loopback_bytes_per_server"] \
            <= 1.15 * want["intra_bytes_per_server"], row
        assert want["nic_bytes_per_server"] <= row["measured_nic_bytes_per_server"] \
            <= 1.15 * want["nic_bytes_per_server"], row


def test_the_experiment_cli_explains_itself():
    proc = subprocess.run([sys.executable, "-m", "perf.hierarchical.testbed", "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--per-server" in proc.stdout
