import json

import numpy as np
import pytest

from bmlmpi.topology.bcube import BCube
from bmlmpi.topology.links import (
    bcube_links,
    flat_links,
    is_connected,
    links_from_env,
    links_from_nodes,
    links_from_placement,
    load_links,
    parse_links,
    parse_nvidia_smi_topo,
    preset,
    validate_links,
)

P3_ROWS = """
0 2 2 3 3 1 1 1
2 0 3 2 1 3 1 1
2 3 0 3 1 1 2 1
3 2 3 0 1 1 1 2
3 1 1 1 0 2 2 3
1 3 1 1 2 0 3 2
1 1 2 1 2 3 0 3
1 1 1 2 3 2 3 0
"""


def test_p3_preset_is_the_issue_matrix_and_dgx1_alias():
    issue = np.array([[float(x) for x in row.split()] for row in P3_ROWS.strip().splitlines()])
    np.testing.assert_array_equal(preset("p3.16xlarge"), issue)
    np.testing.assert_array_equal(preset("DGX1"), issue)
    # hybrid cube-mesh: every GPU has two double and two single NVLinks
    w = preset("dgx1")
    assert ((w == 3).sum(axis=1) == 2).all() and ((w == 2).sum(axis=1) == 2).all()


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown link preset"):
        preset("p4d")


def test_flat_links():
    w = flat_links(5)
    assert w.shape == (5, 5) and (np.diag(w) == 0).all() and w.sum() == 20
    with pytest.raises(ValueError):
        flat_links(0)


@pytest.mark.parametrize("radices", [(2, 2, 2), (3, 3), (4, 4), (2, 3), (3, 2, 2), (5,)])
def test_bcube_links_join_servers_differing_in_one_digit(radices):
    w = bcube_links(radices)
    cube = BCube(radices)
    n = cube.size
    for a in range(n):
        for b in range(n):
            differ = sum(x != y for x, y in zip(cube.digits(a), cube.digits(b), strict=True))
            assert w[a, b] == (1.0 if differ == 1 else 0.0)
    # every server sits on one switch per level, with n_l - 1 neighbours there
    assert (w.sum(axis=1) == sum(r - 1 for r in radices)).all()


def test_bcube_links_mixed_radix_digit_order():
    w = bcube_links((2, 3))  # rank = d0 + 2*d1
    assert w[0, 1] == 1 and w[0, 2] == 1 and w[0, 4] == 1  # d0 differs / d1 differs
    assert w[1, 2] == 0 and w[0, 3] == 0  # both digits differ


@pytest.mark.parametrize("bad, match", [
    ([[0, 1], [2, 0]], "symmetric"),
    ([[0, -1], [-1, 0]], "negative"),
    ([[1, 1], [1, 0]], "diagonal"),
    ([[0, 1, 1], [1, 0, 1]], "square"),
    ([], "square"),
    ([[0, float("nan")], [float("nan"), 0]], "finite"),
    ([["a", "b"], ["c", "d"]], "numeric"),
])
def test_validate_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        validate_links(bad)


def test_parse_json_list_and_object():
    p3 = preset("p3.16xlarge")
    np.testing.assert_array_equal(parse_links(json.dumps(p3.tolist())), p3)
    np.testing.assert_array_equal(parse_links(json.dumps({"matrix": p3.tolist()})), p3)
    with pytest.raises(ValueError, match="matrix"):
        parse_links('{"weights": [[0]]}')
    with pytest.raises(ValueError, match="JSON"):
        parse_links("[[0, 1], [1, 0]")


def test_parse_whitespace_matrix_with_comments():
    text = "# p3.16xlarge\n" + P3_ROWS.replace("1 1 1\n", "1 1 1  # GPU0 X NV1\n", 1)
    np.testing.assert_array_equal(parse_links(text), preset("p3.16xlarge"))
    with pytest.raises(ValueError, match="different lengths"):
        parse_links("0 1\n1 0 0\n")


def _nvidia_smi_text(w):
    code = {3: "NV2", 2: "NV1", 1: "SYS"}
    n = len(w)
    head = "\t" + "\t".join(f"\x1b[4mGPU{i}\x1b[0m" for i in range(n)) + \
        "\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [head]
    for i in range(n):
        cells = ["X" if i == j else code[int(w[i, j])] for j in range(n)]
        if i == 5:  # a PCIe switch path, also weight 1
            cells = [c.replace("SYS", "PXB") for c in cells]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\tPHB\t0-23,48-71\t0\t\tN/A")
    rows.append("NIC0\t" + "\t".join(["PHB"] * n) + "\t X")
    rows += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded "
             "set of # NVLinks", "", "NIC Legend:", "", "  NIC0: mlx5_0"]
    return "\n".join(rows)


def test_parse_nvidia_smi_topo():
    p3 = preset("p3.16xlarge")
    sym = p3.copy()
    # GPU5's row says PXB where the others say SYS: both are PCIe (1), so still symmetric
    np.testing.assert_array_equal(parse_links(_nvidia_smi_text(sym)), p3)
    np.testing.assert_array_equal(parse_nvidia_smi_topo(_nvidia_smi_text(sym)), p3)


def test_parse_nvidia_smi_nv_counts_and_errors():
    text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tNV4\tNODE\t0-7\n" \
           "GPU1\tNV4\t X \tPIX\t0-7\nGPU2\tNODE\tPIX\t X \t0-7\n"
    np.testing.assert_array_equal(parse_nvidia_smi_topo(text),
                                  [[0, 5, 1], [5, 0, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match="unknown connection"):
        parse_nvidia_smi_topo(text.replace("NV4", "QPI"))
    with pytest.raises(ValueError, match="no row for GPU2"):
        parse_nvidia_smi_topo(text.rsplit("GPU2\t", 1)[0])


def test_load_links_and_env(tmp_path, monkeypatch):
    p3 = preset("p3.16xlarge")
    f = tmp_path / "links.json"
    f.write_text(json.dumps(p3.tolist()))
    np.testing.assert_array_equal(load_links(f), p3)
    assert links_from_env({}) is None
    np.testing.assert_array_equal(links_from_env({"BMLMPI_LINKS": str(f)}), p3)
    np.testing.assert_array_equal(links_from_env({"BMLMPI_LINKS": "dgx1"}), p3)
    monkeypatch.setenv("BMLMPI_LINKS", "p3.16xlarge")
    np.testing.assert_array_equal(links_from_env(), p3)
    with pytest.raises(ValueError, match="neither a preset"):
        links_from_env({"BMLMPI_LINKS": str(tmp_path / "missing.txt")})
    with pytest.raises(ValueError, match="cannot read"):
        load_links(tmp_path)


def test_links_from_nodes():
    w = links_from_nodes(["a", "b", "a", "b"])
    np.testing.assert_array_equal(w, [[0, 1, 2, 1], [1, 0, 1, 2], [2, 1, 0, 1], [1, 2, 1, 0]])
    with pytest.raises(ValueError):
        links_from_nodes([])


class _FakeNode:
    def __init__(self, leader):
        self.leader = leader

    def bcast(self, obj, root=0):
        return self.leader

    def Free(self):
        pass


class _FakeComm:
    """Rank ``rank`` of a communicator whose ranks live on nodes ``node_of``."""

    def __init__(self, rank, node_of):
        self.rank, self.node_of = rank, node_of

    def Get_rank(self):
        return self.rank

    def _leader(self, r):
        return min(q for q, nd in enumerate(self.node_of) if nd == self.node_of[r])

    def Split_type(self, split_type, key=0):
        return _FakeNode(self._leader(self.rank))

    def allgather(self, obj):
        return [self._leader(r) for r in range(len(self.node_of))]


def test_links_from_placement():
    from mpi4py import MPI

    np.testing.assert_array_equal(links_from_placement(MPI.COMM_SELF), [[0]])
    node_of = [0, 0, 1, 1, 0]
    want = links_from_nodes(node_of)
    for r in range(len(node_of)):
        np.testing.assert_array_equal(links_from_placement(_FakeComm(r, node_of)), want)


def test_is_connected():
    assert is_connected(flat_links(3)) and is_connected(np.zeros((1, 1)))
    assert not is_connected(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0.0]]))
