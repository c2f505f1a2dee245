"""Hierarchical allreduce on real ranks with pretended nodes (BMLMPI_RANKS_PER_NODE=2): every
dtype and op, in place and not, position-dependent data, against numpy and comm.Allreduce.

The variable is set inside the test, before the Communicator is built (it is read at
construction), so the launcher's plain ``pytest tests/mpi`` at N = 1..12 runs it too; sizes
that are not a multiple of 2 skip the equal-node test and run the unequal-node one instead.
Every datatype runs at 1-4 ranks; at 6, 8 and 12 ranks the datatypes of
``conftest.DTYPES_BEYOND_4`` (one of each element size and kernel family) run with every op,
count and mode, both tiers at every N (tests/mpi/conftest.py says why).
"""

import os

import numpy as np
import pytest
from conftest import ALL_DTYPES, OP_IDS, OPS, all_ranks_agree, rank_input, reference
from mpi4py import MPI

import bmlmpi
from bmlmpi import selection
from bmlmpi.topology.nodes import consecutive_nodes

PER_NODE = 2


def _counts(size: int) -> list[int]:
    # 0, 1, fewer than the pieces (2 shards × size nodes × levels), odd, large
    return [0, 1, size - 1, 2 * size + 1, 1031, 40_001]


def _communicator(comm, monkeypatch, per_node=PER_NODE):
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", str(per_node))
    ctx = bmlmpi.Communicator(comm, algorithm="hierarchical")
    monkeypatch.delenv("BMLMPI_RANKS_PER_NODE")
    return ctx


def _check(ctx, comm, n, dtype, op, in_place, failures, label):
    x = rank_input(n, comm.rank, dtype, op)
    if in_place:
        got = x.copy()
        ctx.Allreduce(MPI.IN_PLACE, got, op=op)
    else:
        got = np.full_like(x, 99)
        ctx.Allreduce(x, got, op=op)
        if not np.array_equal(x, rank_input(n, comm.rank, dtype, op)):
            failures.append(f"{label}: sendbuf modified")
    want = reference(n, comm.size, dtype, op)
    if not np.array_equal(got, want):
        bad = np.nonzero(got != want)[0][0]
        failures.append(f"{label}: first bad index {bad} got {got[bad]} want {want[bad]}")
    if op is not bmlmpi.AVG:
        native = np.empty_like(x)
        comm.Allreduce(x, native, op=op)
        # where the exact result fits the dtype, the MPI library's own answer must match
        # (Open MPI saturates 8-bit sums instead of wrapping)
        if np.array_equal(native, want) and not np.array_equal(got, native):
            failures.append(f"{label}: differs from comm.Allreduce")


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_op_count_and_mode(comm, monkeypatch, dtype):
    if comm.size % PER_NODE:
        pytest.skip(f"{comm.size} ranks are not nodes of {PER_NODE} (see the unequal test)")
    ctx = _communicator(comm, monkeypatch)
    assert ctx.nodes() == consecutive_nodes(comm.size, PER_NODE)
    failures = []
    for op, op_id in zip(OPS, OP_IDS, strict=True):
        if np.dtype(dtype).kind == "c" and op in (MPI.MIN, MPI.MAX):
            continue
        for n in _counts(comm.size):
            for in_place in (False, True):
                _check(ctx, comm, n, dtype, op, in_place, failures,
                       f"{op_id} n={n} in_place={in_place}")
    ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_unequal_pretended_nodes(comm, monkeypatch):
    """Nodes of 2 when the size is odd (the last node has one rank), and of 3 and 4 where
    they do not divide the size: a rank of a smaller node carries several shards."""
    failures = []
    for per_node in (2, 3, 4):
        if comm.size % per_node == 0 and comm.size > 1:
            continue
        ctx = _communicator(comm, monkeypatch, per_node)
        assert ctx.nodes() == consecutive_nodes(comm.size, per_node)
        for n in (0, 1, 5, 1031):
            for dtype, op in ((np.int64, MPI.SUM), (np.float32, MPI.MAX),
                              (np.float64, bmlmpi.AVG), (np.uint8, MPI.PROD)):
                _check(ctx, comm, n, dtype, op, bool(n % 2), failures,
                       f"{per_node}/node n={n} {np.dtype(dtype).name}")
        ctx.Free()
    all_ranks_agree(comm, failures)


@pytest.mark.mpi
def test_nodes_from_placement_and_auto_candidates(comm, monkeypatch):
    monkeypatch.delenv("BMLMPI_RANKS_PER_NODE", raising=False)
    ctx = bmlmpi.Communicator(comm, algorithm="hierarchical")
    # every rank of this launch runs on one machine: MPI placement says one node
    assert ctx.nodes().members == (tuple(range(comm.size)),)
    nodes = ctx.placement.nodes_for_auto()
    assert "hierarchical" not in selection.candidates(1000, comm.size, nodes)
    ctx.Free()
    if comm.size % PER_NODE == 0 and comm.size > PER_NODE:
        ctx = _communicator(comm, monkeypatch)
        nodes = ctx.placement.nodes_for_auto()
        assert "hierarchical" in selection.candidates(1000, comm.size, nodes)
        ctx.Free()
    monkeypatch.setenv("BMLMPI_RANKS_PER_NODE", "zero")
    with pytest.raises(ValueError, match="BMLMPI_RANKS_PER_NODE"):
        bmlmpi.Communicator(comm, algorithm="hierarchical")


@pytest.mark.mpi
def test_nodes_when_links_name_devices(comm, monkeypatch):
    """BMLMPI_LINKS describes devices, not nodes: the nodes still come from MPI placement."""
    import json
    import tempfile

    from bmlmpi.topology.links import flat_links

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(flat_links(comm.size).tolist(), f)
    monkeypatch.setenv("BMLMPI_LINKS", f.name)
    monkeypatch.delenv("BMLMPI_RANKS_PER_NODE", raising=False)
    try:
        ctx = bmlmpi.Communicator(comm, algorithm="hierarchical")
    finally:
        os.unlink(f.name)
    assert ctx.nodes().members == (tuple(range(comm.size)),)
    failures = []
    _check(ctx, comm, 1031, np.int32, MPI.SUM, False, failures, "links from a file")
    ctx.Free()
    all_ranks_agree(comm, failures)
