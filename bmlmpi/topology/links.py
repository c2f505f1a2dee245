"""Link-weight matrices: how strongly each pair of ranks is connected, MPI-free.

A link matrix ``W`` is a square, symmetric, non-negative numpy array with a zero diagonal;
``W[i, j]`` is the relative bandwidth of the direct link between ranks ``i`` and ``j`` and 0
means "no direct link". Tree generation (:mod:`bmlmpi.topology.trees`) builds reduction trees
that use the heaviest links. The scale follows the MXNet tree-reduce proposal:

====  ==============================================================
3     two bonded NVLinks (p3.16xlarge: 50 GB/s)
2     one NVLink (25 GB/s)
1     PCIe, possibly through the CPU / between sockets (10 GB/s)
0     no direct link (and the diagonal)
====  ==============================================================

Sources:

* presets: ``p3.16xlarge`` (alias ``dgx1``), the 8-GPU matrix MXNet's tests use;
* :func:`bcube_links` (servers linked when their BCube addresses differ in exactly one digit)
  and :func:`flat_links` (a fat-tree / all-to-all network: every pair weight 1);
* files (:func:`load_links`): JSON (a list of rows, or ``{"matrix": rows}``), a whitespace
  matrix (``#`` comments allowed), or the text printed by ``nvidia-smi topo -m``, whose
  ``NV<k>`` (k bonded NVLinks) becomes weight k + 1 — so NV1 → 2 and NV2 → 3 as above — and
  whose PCIe/CPU paths (PIX, PXB, PHB, NODE, SYS, and the older SOC) become 1;
* ``BMLMPI_LINKS`` (:func:`links_from_env`): a preset name or a file path;
* MPI placement (:func:`links_from_placement`): ranks on the same node 2, other nodes 1.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from .bcube import BCube

_P3_16XLARGE = (
    (0, 2, 2, 3, 3, 1, 1, 1),
    (2, 0, 3, 2, 1, 3, 1, 1),
    (2, 3, 0, 3, 1, 1, 2, 1),
    (3, 2, 3, 0, 1, 1, 1, 2),
    (3, 1, 1, 1, 0, 2, 2, 3),
    (1, 3, 1, 1, 2, 0, 3, 2),
    (1, 1, 2, 1, 2, 3, 0, 3),
    (1, 1, 1, 2, 3, 2, 3, 0),
)

PRESETS: dict[str, tuple[tuple[int, ...], ...]] = {
    "p3.16xlarge": _P3_16XLARGE,
    "dgx1": _P3_16XLARGE,
}

# Weight of a PCIe / host path in ``nvidia-smi topo -m`` output; NV<k> gets k + 1.
_PCIE_WEIGHT = 1
_PCIE_CODES = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})


def validate_links(weights: Any, name: str = "link matrix") -> np.ndarray:
    """Return ``weights`` as a float64 array after checking it is a valid link matrix.

    Raises ValueError unless it is square (n >= 1), finite, symmetric, non-negative and has a
    zero diagonal.
    """
    try:
        w = np.array(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not a numeric matrix ({exc})") from None
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        raise ValueError(f"{name}: must be a non-empty square matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name}: entries must be finite")
    if np.any(w < 0):
        i, j = np.argwhere(w < 0)[0]
        raise ValueError(f"{name}: negative weight {w[i, j]} at [{i}, {j}]")
    if np.any(np.diag(w) != 0):
        i = int(np.nonzero(np.diag(w))[0][0])
        raise ValueError(f"{name}: diagonal must be zero, [{i}, {i}] = {w[i, i]}")
    if not np.array_equal(w, w.T):
        i, j = np.argwhere(w != w.T)[0]
        raise ValueError(f"{name}: not symmetric, [{i}, {j}] = {w[i, j]} but "
                         f"[{j}, {i}] = {w[j, i]}")
    return w


def preset(name: str) -> np.ndarray:
    """The preset matrix ``name`` (case-insensitive): ``p3.16xlarge`` or ``dgx1``."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"unknown link preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return np.array(PRESETS[key], dtype=np.float64)


def flat_links(n: int) -> np.ndarray:
    """A fat-tree / all-to-all network of ``n`` ranks: every pair linked with weight 1."""
    if n < 1:
        raise ValueError(f"flat_links needs n >= 1, got {n}")
    return np.ones((n, n)) - np.eye(n)


def bcube_links(radices: Sequence[int]) -> np.ndarray:
    """The server graph of a mixed-radix BCube: weight 1 between servers whose addresses differ
    in exactly one digit (they share a switch), 0 otherwise.

    ``radices`` is ``(n_0, ..., n_{k-1})`` with digit 0 least significant, as in
    :mod:`bmlmpi.topology.bcube`: digit l of rank r is ``(r // (n_0 ⋯ n_{l-1})) % n_l``.
    """
    radices = tuple(int(r) for r in radices)
    if any(r < 1 for r in radices):
        raise ValueError(f"bcube_links: every radix must be >= 1, got {radices}")
    cube = BCube(radices)
    n = cube.size
    digits = np.array([cube.digits(r) for r in range(n)], dtype=np.int64).reshape(n, -1)
    differing = (digits[:, None, :] != digits[None, :, :]).sum(axis=2)
    return (differing == 1).astype(np.float64)


def links_from_nodes(node_of_rank: Sequence[Any], same: float = 2.0,
                     other: float = 1.0) -> np.ndarray:
    """Weights from placement: ``same`` between ranks with equal node ids, ``other`` otherwise."""
    if not 0 < other <= same:
        raise ValueError(f"need 0 < other <= same, got same={same}, other={other}")
    nodes = list(node_of_rank)
    if not nodes:
        raise ValueError("links_from_nodes: no ranks")
    ids = {v: i for i, v in enumerate(dict.fromkeys(nodes))}
    idx = np.array([ids[v] for v in nodes])
    w = np.where(idx[:, None] == idx[None, :], same, other).astype(np.float64)
    np.fill_diagonal(w, 0.0)
    return w


def links_from_placement(comm: Any) -> np.ndarray:
    """Weights of ``comm``'s ranks from where MPI placed them: same node 2, other node 1.

    Collective over ``comm``; every rank gets the same matrix. A node is a
    ``MPI.COMM_TYPE_SHARED`` split; it is named by the lowest rank of ``comm`` on it.
    """
    from mpi4py import MPI  # the rest of this module stays importable without MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        leader = node.bcast(comm.Get_rank(), root=0)
    finally:
        node.Free()
    return links_from_nodes(comm.allgather(leader))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE_COLUMN = re.compile(r"^(GPU\d+|NIC\d+|mlx\S+)$")
_GPU = re.compile(r"^GPU(\d+)$")
# A GPU row of ``nvidia-smi topo -m``: "GPU3  NV1  X  SYS ..."
_NVIDIA_SMI_ROW = re.compile(r"^\s*GPU\d+\s+(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\s",
                             re.MULTILINE | re.IGNORECASE)


def _nvidia_smi_code(code: str, where: str) -> float:
    code = code.upper()
    if code == "X":
        return 0.0
    if code in _PCIE_CODES:
        return float(_PCIE_WEIGHT)
    m = re.fullmatch(r"NV(\d+)", code)
    if m and int(m.group(1)) > 0:
        return float(int(m.group(1)) + 1)
    raise ValueError(f"nvidia-smi topo: unknown connection {code!r} at {where}")


def parse_nvidia_smi_topo(text: str) -> np.ndarray:
    """The GPU-to-GPU weights in the text of ``nvidia-smi topo -m``.

    Only GPU rows and GPU columns are read (NIC columns, affinity columns and the legend are
    skipped). NV<k> → k + 1, PCIe/CPU paths → 1, X → 0.
    """
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    # The header (device names) is the first line naming GPU0; the GPU rows follow it.
    head_at = next((i for i, ln in enumerate(lines) if "GPU0" in ln.split()), None)
    if head_at is None:
        raise ValueError("nvidia-smi topo: no header line naming GPU0")
    head = lines[head_at].split()
    start = head.index("GPU0")
    columns: list[str] = []
    for tok in head[start:]:
        if not _DEVICE_COLUMN.match(tok):
            break
        columns.append(tok)
    gpu_cols = {int(_GPU.match(c).group(1)): k for k, c in enumerate(columns) if _GPU.match(c)}
    n = len(gpu_cols)
    if sorted(gpu_cols) != list(range(n)):
        raise ValueError(f"nvidia-smi topo: GPU columns {sorted(gpu_cols)} are not 0..{n - 1}")
    w = np.full((n, n), np.nan)
    for ln in lines[head_at + 1:]:
        tokens = ln.split()
        if not tokens or not _GPU.match(tokens[0]):
            continue
        g = int(_GPU.match(tokens[0]).group(1))
        if g >= n:
            raise ValueError(f"nvidia-smi topo: row GPU{g} but only {n} GPU columns")
        values = tokens[1:]
        if len(values) < len(columns):
            raise ValueError(f"nvidia-smi topo: row GPU{g} has {len(values)} entries, "
                             f"expected at least {len(columns)}")
        for j, k in gpu_cols.items():
            w[g, j] = _nvidia_smi_code(values[k], f"GPU{g}/GPU{j}")
    missing = [g for g in range(n) if np.isnan(w[g]).any()]
    if missing:
        raise ValueError(f"nvidia-smi topo: no row for GPU{missing[0]}")
    return validate_links(w, "nvidia-smi topo matrix")


def parse_links(text: str, name: str = "link matrix") -> np.ndarray:
    """A link matrix from text: JSON, ``nvidia-smi topo -m`` output, or a whitespace matrix."""
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"{name}: empty")
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: bad JSON ({exc})") from None
        if isinstance(data, Mapping):
            if "matrix" not in data:
                raise ValueError(f"{name}: JSON object needs a 'matrix' key")
            data = data["matrix"]
        return validate_links(data, name)
    if _NVIDIA_SMI_ROW.search(_ANSI.sub("", stripped)):
        return parse_nvidia_smi_topo(stripped)
    rows = []
    for ln in stripped.splitlines():
        ln = ln.split("#", 1)[0].replace(",", " ").strip()
        if ln:
            try:
                rows.append([float(x) for x in ln.split()])
            except ValueError:
                raise ValueError(f"{name}: not a number in row {ln!r}") from None
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"{name}: rows have different lengths {[len(r) for r in rows]}")
    return validate_links(rows, name)


def load_links(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a link matrix file (any format :func:`parse_links` accepts)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read link matrix {str(p)!r}: {exc}") from None
    return parse_links(text, name=str(p))


def links_from_env(env: Mapping[str, str] | None = None) -> np.ndarray | None:
    """The matrix named by ``BMLMPI_LINKS`` (a preset name or a file path), or None if unset."""
    value = config.get("BMLMPI_LINKS", env)
    if not value:
        return None
    if value.lower() in PRESETS:
        return preset(value)
    if not Path(value).exists():
        raise ValueError(f"BMLMPI_LINKS={value!r} is neither a preset "
                         f"({', '.join(sorted(PRESETS))}) nor an existing file")
    return load_links(value)


def is_connected(weights: np.ndarray) -> bool:
    """Whether the graph of positive-weight links spans all ranks."""
    n = weights.shape[0]
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = seen.copy()
    while frontier.any():
        reach = (weights[frontier] > 0).any(axis=0) & ~seen
        seen |= reach
        frontier = reach
    return bool(seen.all())


__all__ = [
    "PRESETS", "bcube_links", "flat_links", "is_connected", "links_from_env",
    "links_from_nodes", "links_from_placement", "load_links", "parse_links",
    "parse_nvidia_smi_topo", "preset", "validate_links",
]
