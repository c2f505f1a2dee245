"""The algorithm records: one registered object per algorithm, the one place that says which
algorithms exist, which collectives each serves, how it builds its schedule and what it is.

Everything that needs an algorithm by name derives from :data:`REGISTRY`: the communicators
(:func:`build` through :mod:`bmlmpi.binding`, which binds a schedule to MPI communicators),
``auto`` (:mod:`bmlmpi.selection`: which records it may price, opt-in through
:attr:`Algorithm.auto`, and its fixed rules, which the records carry), the cost model
(:mod:`bmlmpi.model.estimate`: :attr:`Algorithm.symmetric`), calibration
(:attr:`Algorithm.calibrated`), compression (:attr:`Algorithm.wire_format`), the sweep and the
public :func:`bmlmpi.algorithms`. Adding an algorithm is one module and one :func:`register`;
``auto`` prices it only if its record sets ``auto=True``.

An algorithm's :attr:`~Algorithm.build` takes one :class:`Context` — which collective, which
rank of how many, the element count of the work buffer and the item size, the root, the block
counts, the BCube shape, the link matrix, the nodes, pipelining — and returns that rank's
:class:`~bmlmpi.schedules.types.Schedule`. ``native`` (the MPI library's own call through
mpi4py) is an algorithm too, with no schedule. ``ps`` (the P2P parameter server) has a schedule
the model prices but is never run nor offered.

Trees are generated once per (size, root, matrix) and kept: the multi-tree set costs seconds of
CPU at 64 ranks, the single tree milliseconds. Every rank derives the same trees from the same
matrix without talking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import config
from ..topology.bcube import resolve_shape
from .catalog import binary_tree_for, multi_trees_for
from .collectives import NAMES, collective, every
from .types import Schedule, balanced_bounds

#: ``auto`` offers the tree algorithms up to this many ranks: generating the multi-tree set
#: costs seconds of CPU beyond it.
AUTO_TREE_MAX_RANKS = 16

#: ``auto`` leaves native only for a schedule predicted at least this much faster: a near-tie
#: is not worth a schedule's noisier estimate, and keeping native costs at most this factor.
NATIVE_MARGIN = 1.05

#: The node tier the tiered algorithms run in messages (``Context.intra``'s default).
MESSAGE_TIER = "ring"


@dataclass(frozen=True)
class Context:
    """Everything a builder may need to make one rank's schedule.

    ``count``: elements of the work buffer (for a reduce-scatter the whole input, for an
    allgather the whole output: the sum of ``counts``; for an all-to-all the whole exchange,
    the sum of its pair matrix). ``counts``: each rank's block for a reduce-scatter or
    allgather, the ``size × size`` pair matrix (row-major, row s: what rank s sends each
    rank) for an all-to-all (None: ``count`` cut into balanced blocks or pairs, larger
    first).
    ``shape``: the BCube radices (or a spec, resolved as a communicator resolves it).
    ``links``: the link-weight matrix trees are generated from (None: a flat network).
    ``nodes``: which ranks share a node (:class:`bmlmpi.topology.nodes.Nodes`; the tiered
    algorithms read the placement from ``links`` without it). ``pipeline``/``segments``: None
    leaves the algorithm's own choice from the message size. ``intra``: hierarchical's node
    tier, ``ring`` (messages) or ``shm`` (shared memory, where the nodes' ranks share it).
    """

    size: int
    count: int
    itemsize: int = 8
    rank: int = 0
    collective: str = "allreduce"
    root: int = 0
    counts: tuple[int, ...] | None = None
    shape: Any = None
    links: Any = field(default=None, compare=False, hash=False)
    nodes: Any = None
    pipeline: int | None = None
    segments: int | None = None
    intra: str = MESSAGE_TIER

    def __post_init__(self) -> None:
        coll = collective(self.collective)
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside [0, {self.size})")
        if self.count < 0 or self.itemsize <= 0:
            raise ValueError(f"need count >= 0 and itemsize > 0, got {self.count}, "
                             f"{self.itemsize}")
        if coll.rooted and not 0 <= self.root < self.size:
            raise ValueError(f"root {self.root} outside [0, {self.size})")
        if self.counts is not None:
            counts = tuple(map(int, self.counts))
            want = self.size * self.size if coll.relays else self.size
            if len(counts) != want or min(counts) < 0 or sum(counts) != self.count:
                what = "pair" if coll.relays else "block"
                raise ValueError(f"{what} counts {counts} must be {want} counts >= 0 "
                                 f"summing to count {self.count}")
            object.__setattr__(self, "counts", counts)

    def at(self, rank: int) -> Context:
        """The same call seen from ``rank``."""
        return replace(self, rank=rank)

    def blocks(self) -> tuple[int, ...]:
        """Each rank's block count (``counts``, else balanced)."""
        if self.counts is not None:
            return self.counts
        b = balanced_bounds(0, self.count, self.size)
        return tuple(b[i + 1] - b[i] for i in range(self.size))

    def pairs(self) -> tuple[int, ...]:
        """An all-to-all's pair matrix (``counts``, else ``count`` cut into balanced pairs)."""
        if self.counts is not None:
            return self.counts
        b = balanced_bounds(0, self.count, self.size * self.size)
        return tuple(b[i + 1] - b[i] for i in range(self.size * self.size))

    def radices(self) -> tuple[int, ...]:
        return tuple(resolve_shape(self.size, self.shape))

    def link_matrix(self) -> np.ndarray | None:
        if self.links is None:
            return None
        return np.asarray(self.links, dtype=np.float64).reshape(self.size, self.size)

    def node_map(self) -> Any:
        """The nodes (``nodes``, else read from ``links`` as a placement matrix, else one)."""
        from ..topology.nodes import resolve_nodes
        return self.nodes if self.nodes is not None else resolve_nodes(self.size,
                                                                       self.link_matrix())


def _always(ctx: Context) -> bool:
    return True


@dataclass(frozen=True)
class Algorithm:
    """One algorithm.

    ``builders``: collective → ``build(ctx) -> Schedule`` (empty for ``native``, which runs
    the MPI library's own call). ``tiered``: its transfer levels name network tiers
    (intra-node 0, inter-node 1 + l), not the BCube levels of the communicator's shape, so it
    runs with every transfer on the flat communicator. ``wire_format``: a compressed allreduce
    may run its schedule on 16-bit codes. ``calibrated``: calibration measures it and corrects
    its modelled time. ``symmetric``: the network kinds (``"ports"``: one port per rank, shared
    memory or a Fat-Tree; ``"bcube"``) on which its allreduce schedules are equivariant, so the
    model prices rank 0's alone. ``offered``: listed by :func:`algorithms` and runnable
    (``ps`` is priced only). ``max_ranks``:
    ``auto`` and calibration consider it only up to this many ranks (its schedules cost too
    much to build beyond).

    What ``auto`` (:mod:`bmlmpi.selection`) may do with it, read from these fields alone:

    - ``auto``: ``auto`` prices it, for every collective it serves, where ``applies(ctx)``
      holds (opt-in: a record without it runs only where a call names it).
    - ``applies(ctx)``: whether ``auto`` considers it for ``ctx`` (a name asked for
      explicitly runs wherever it builds).
    - ``default``: what ``auto`` runs where it prices nothing — one rank, an empty buffer no
      record's ``empty`` claims, below ``BMLMPI_AUTO_BML_BYTES`` under the fixed rule, the
      family without a calibration; its time is the calibration's measurement, not a model.
      One record has it (``native``).
    - ``margin``: priced against a cheaper candidate, it is kept unless that one is predicted
      at least this many times faster (``native``: :data:`NATIVE_MARGIN`; 1 for the others).
    - ``empty``: the collectives whose empty call ``auto`` runs on it (a schedule with no
      steps: ``bml``'s allreduce); the first record that claims a collective wins.
    - ``fixed``: the collectives the fixed rule (no calibration, or none of the collective's
      native call) runs on it from ``BMLMPI_AUTO_BML_BYTES`` up (``bml``: all five); the first
      record that claims a collective wins, else the first with a schedule for it that opts in
      to ``auto`` (:func:`fixed_choice`).
    - ``shared_memory``: it runs through one node's shared memory, so ``auto`` prices it only
      where the calibration measured shared memory, and there the tiered algorithms' node tier
      is priced as this one (:func:`node_tier`).
    """

    name: str
    builders: dict[str, Callable[[Context], Schedule]] = field(default_factory=dict)
    applies: Callable[[Context], bool] = _always
    tiered: bool = False
    wire_format: bool = False
    calibrated: bool = False
    symmetric: frozenset[str] = frozenset()
    offered: bool = True
    max_ranks: int | None = None
    auto: bool = False
    default: bool = False
    margin: float = 1.0
    empty: frozenset[str] = frozenset()
    fixed: frozenset[str] = frozenset()
    shared_memory: bool = False
    doc: str = ""

    @property
    def collectives(self) -> tuple[str, ...]:
        """The collectives it serves (``native``: every one the call pipeline runs)."""
        if self.name == NATIVE:
            return NAMES
        return tuple(c for c in every() if c in self.builders)

    @property
    def scheduled(self) -> bool:
        return self.name != NATIVE

    def serves(self, name: str) -> bool:
        return name in self.collectives

    def build(self, ctx: Context) -> Schedule:
        """``ctx.rank``'s schedule of ``ctx.collective``."""
        try:
            make = self.builders[ctx.collective]
        except KeyError:
            raise ValueError(f"algorithm {self.name!r} has no schedule for "
                             f"{ctx.collective}; {ctx.collective} has: "
                             f"{', '.join(scheduled(ctx.collective))}") from None
        return make(ctx)


NATIVE = "native"
AUTO = "auto"
#: name -> record, in the order :func:`algorithms` lists them (``native`` last).
REGISTRY: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` (replacing one of the same name); ``native`` stays last."""
    if algorithm.name in (AUTO, ""):
        raise ValueError(f"{algorithm.name!r} cannot name an algorithm")
    REGISTRY.pop(algorithm.name, None)
    native = REGISTRY.pop(NATIVE, None)
    REGISTRY[algorithm.name] = algorithm
    if native is not None and algorithm.name != NATIVE:
        REGISTRY[NATIVE] = native
    return algorithm


def unregister(name: str) -> None:
    """Remove a registered algorithm (a test's own toy)."""
    REGISTRY.pop(name, None)


def get(name: str) -> Algorithm:
    """The record of ``name``; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} has no schedule; known: "
                         f"{', '.join(sorted(REGISTRY))}") from None


def algorithms(coll: str = "allreduce") -> list[str]:
    """The algorithms implemented for collective ``coll``: ``auto`` first, ``native`` last."""
    collective(coll)
    return [AUTO] + [a.name for a in REGISTRY.values() if a.offered and a.serves(coll)]


def scheduled(coll: str = "allreduce") -> list[str]:
    """The algorithms with a schedule for ``coll`` (``ps`` included, ``native`` not)."""
    return [a.name for a in REGISTRY.values() if a.scheduled and a.serves(coll)]


def build(name: str, ctx: Context) -> Schedule:
    """``ctx.rank``'s schedule of algorithm ``name`` for ``ctx``."""
    return get(name).build(ctx)


def schedules(name: str, ctx: Context) -> list[Schedule]:
    """Every rank's schedule (for the verifier and the cost model)."""
    alg = get(name)
    return [alg.build(ctx.at(r)) for r in range(ctx.size)]


# -- the builders ------------------------------------------------------------------------------

def _bml_allreduce(ctx: Context) -> Schedule:
    from .bml import bml_schedule
    from .ring import ring_pipeline
    # at N = 2 BML is ring's exchange: pipelined as ring is there (bml.py's docstring)
    pipeline = ctx.pipeline or (ring_pipeline(ctx.count, ctx.itemsize, ctx.size)
                                if ctx.size == 2 else 1)
    return bml_schedule(ctx.rank, ctx.size, ctx.count, ctx.radices(), pipeline)


def _bml_pipeline(ctx: Context) -> int:
    from .ring import ring_pipeline
    # at N = 2 BML is ring's exchange: pipelined as ring is there (bml.py's docstring)
    return ctx.pipeline or (ring_pipeline(ctx.count, ctx.itemsize, ctx.size)
                            if ctx.size == 2 else 1)


def _bml_reduce_scatter(ctx: Context) -> Schedule:
    from .bml import bml_reduce_scatter_schedule
    return bml_reduce_scatter_schedule(ctx.rank, ctx.size, ctx.blocks(), ctx.radices(),
                                       _bml_pipeline(ctx))


def _bml_allgather(ctx: Context) -> Schedule:
    from .bml import bml_allgather_schedule
    return bml_allgather_schedule(ctx.rank, ctx.size, ctx.blocks(), ctx.radices())


def _bml_rooted(ctx: Context) -> Schedule:
    from .bml import bml_rooted_schedule
    pipeline = _bml_pipeline(ctx) if ctx.collective == "reduce" else 1
    return bml_rooted_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count, ctx.radices(),
                               ctx.root, pipeline)


def _ring_segmenting(ctx: Context) -> tuple[int, int]:
    """(segments, pipeline): pipelined pieces at N = 2 (measured faster there; ring.py's
    docstring), segments elsewhere."""
    from .ring import ring_pipeline, ring_segments
    if ctx.segments is not None or ctx.pipeline is not None:
        return ctx.segments or 1, ctx.pipeline or 1
    if ctx.size == 2:
        return 1, ring_pipeline(ctx.count, ctx.itemsize, ctx.size)
    return ring_segments(ctx.count, ctx.itemsize, ctx.size), 1


def _ring_allreduce(ctx: Context) -> Schedule:
    from .ring import ring_schedule
    segments, pipeline = _ring_segmenting(ctx)
    return ring_schedule(ctx.rank, ctx.size, ctx.count, segments, pipeline)


def _ring_reduce_scatter(ctx: Context) -> Schedule:
    from .ring import ring_reduce_scatter_schedule
    segments, pipeline = _ring_segmenting(ctx)
    return ring_reduce_scatter_schedule(ctx.rank, ctx.size, ctx.blocks(), segments, pipeline)


def _ring_allgather(ctx: Context) -> Schedule:
    from .ring import ring_allgather_schedule
    segments, _ = _ring_segmenting(ctx)
    return ring_allgather_schedule(ctx.rank, ctx.size, ctx.blocks(), segments)


def _rabenseifner(ctx: Context) -> Schedule:
    from .ring import ring_rooted_schedule
    segments, pipeline = _ring_segmenting(ctx)
    return ring_rooted_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count, ctx.root,
                                segments, pipeline)


def _ps_allreduce(ctx: Context) -> Schedule:
    from .ps import ps_schedule
    return ps_schedule(ctx.rank, ctx.size, ctx.count)


def _tree_allreduce(ctx: Context) -> Schedule:
    from .tree import tree_schedule
    return tree_schedule(ctx.rank, ctx.size, ctx.count, binary_tree_for(ctx.size, ctx.links))


def _tree_rooted(ctx: Context) -> Schedule:
    from .tree import rooted_tree_schedule
    tree = binary_tree_for(ctx.size, ctx.links, ctx.root)
    return rooted_tree_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count, tree,
                                ctx.segments or 1)


def _multitree_allreduce(ctx: Context) -> Schedule:
    from .tree import multitree_schedule
    return multitree_schedule(ctx.rank, ctx.size, ctx.count,
                              multi_trees_for(ctx.size, ctx.links))


def _multitree_rooted(ctx: Context) -> Schedule:
    from .tree import multitree_rooted_schedule
    return multitree_rooted_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count,
                                     multi_trees_for(ctx.size, ctx.links), ctx.root,
                                     ctx.segments or 1)


def shm_chunk_bytes() -> int:
    """``BMLMPI_SHM_CHUNK``: bytes of one rank's slice of a shared-memory chunk."""
    return config.get("BMLMPI_SHM_CHUNK")


def _hierarchical_allreduce(ctx: Context) -> Schedule:
    from .hierarchical import hierarchical_schedule
    return hierarchical_schedule(ctx.rank, ctx.size, ctx.count, ctx.node_map(),
                                 intra=ctx.intra, itemsize=ctx.itemsize,
                                 chunk_bytes=shm_chunk_bytes())


def _shm_allreduce(ctx: Context) -> Schedule:
    from .shm import shm_schedule
    return shm_schedule(ctx.rank, ctx.size, ctx.count, ctx.itemsize, shm_chunk_bytes())


def _shm_collective(ctx: Context) -> Schedule:
    from .shm import shm_collective_schedule
    return shm_collective_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count, ctx.itemsize,
                                   shm_chunk_bytes(), ctx.root, ctx.blocks())


def _hierarchical_blocks(ctx: Context) -> Schedule:
    from .hierarchical_blocks import hierarchical_blocks_schedule
    return hierarchical_blocks_schedule(ctx.collective, ctx.rank, ctx.size, ctx.blocks(),
                                        ctx.node_map(), intra=ctx.intra,
                                        itemsize=ctx.itemsize, chunk_bytes=shm_chunk_bytes())


def _hierarchical_rooted(ctx: Context) -> Schedule:
    from .hierarchical import hierarchical_rooted_schedule
    return hierarchical_rooted_schedule(ctx.collective, ctx.rank, ctx.size, ctx.count,
                                        ctx.node_map(), ctx.root, intra=ctx.intra,
                                        itemsize=ctx.itemsize, chunk_bytes=shm_chunk_bytes())


def _shm_alltoall(ctx: Context) -> Schedule:
    from .shm import shm_alltoall_schedule
    return shm_alltoall_schedule(ctx.rank, ctx.size, ctx.pairs(), ctx.itemsize,
                                 shm_chunk_bytes())


def _hierarchical_exchange(ctx: Context) -> Schedule:
    from .hierarchical_exchange import hierarchical_exchange_schedule
    return hierarchical_exchange_schedule(ctx.rank, ctx.size, ctx.pairs(), ctx.node_map())


def _pairwise(ctx: Context) -> Schedule:
    from .pairwise import pairwise_schedule
    return pairwise_schedule(ctx.rank, ctx.size, ctx.pairs())


def _bruck(ctx: Context) -> Schedule:
    from .bruck import bruck_schedule
    return bruck_schedule(ctx.rank, ctx.size, ctx.pairs())


def _bcube_exchange(ctx: Context) -> Schedule:
    from .bcube_exchange import bcube_exchange_schedule
    return bcube_exchange_schedule(ctx.rank, ctx.size, ctx.pairs(), ctx.radices(),
                                   ctx.pipeline)


# -- when auto considers one -------------------------------------------------------------------

def tree_array_bound() -> int | None:
    """``BMLMPI_TREE_ARRAY_BOUND``: single tree at or below it, multi-tree above."""
    return config.get("BMLMPI_TREE_ARRAY_BOUND")


def _tree_applies(ctx: Context) -> bool:
    bound = tree_array_bound()
    return bound is None or ctx.count <= bound


def _multitree_applies(ctx: Context) -> bool:
    bound = tree_array_bound()
    return bound is None or ctx.count > bound


def _shm_applies(ctx: Context) -> bool:
    # one node's ranks (MPI placement, or BMLMPI_RANKS_PER_NODE pretending one node)
    nodes = ctx.nodes
    return ctx.size > 1 and nodes is not None and nodes.count == 1


def _hierarchical_applies(ctx: Context) -> bool:
    # only where ranks share nodes: else it is bml or ring
    nodes = ctx.nodes
    return nodes is not None and nodes.count > 1 and nodes.max_local > 1


PORTS, BCUBE = "ports", "bcube"

_BML_BUILDERS = {"allreduce": _bml_allreduce, "reduce_scatter": _bml_reduce_scatter,
        "allgather": _bml_allgather, "reduce": _bml_rooted, "bcast": _bml_rooted}
register(Algorithm(
    "bml", _BML_BUILDERS, wire_format=True, calibrated=True, symmetric=frozenset({PORTS, BCUBE}),
    auto=True, empty=frozenset({"allreduce"}), fixed=frozenset(_BML_BUILDERS),
    doc="BML on the BCube of the communicator's shape (Wang et al., NeurIPS 2018)"))
register(Algorithm(
    "ring", {"allreduce": _ring_allreduce, "reduce_scatter": _ring_reduce_scatter,
             "allgather": _ring_allgather},
    wire_format=True, calibrated=True, symmetric=frozenset({PORTS}), auto=True,
    doc="ring reduce-scatter and allgather (Patarasuk & Yuan)"))
register(Algorithm(
    "tree", {"allreduce": _tree_allreduce, "reduce": _tree_rooted, "bcast": _tree_rooted},
    applies=_tree_applies, wire_format=True,
    calibrated=True, max_ranks=AUTO_TREE_MAX_RANKS, auto=True,
    doc="single topology-aware binary tree (the MXNet tree-reduce proposal)"))
register(Algorithm(
    "multitree", {"allreduce": _multitree_allreduce, "reduce": _multitree_rooted,
                  "bcast": _multitree_rooted}, applies=_multitree_applies,
    wire_format=True, calibrated=True, max_ranks=AUTO_TREE_MAX_RANKS, auto=True,
    doc="one topology-aware tree per root (the MXNet tree-reduce proposal)"))
register(Algorithm(
    "hierarchical", {"allreduce": _hierarchical_allreduce,
                     "reduce_scatter": _hierarchical_blocks, "allgather": _hierarchical_blocks,
                     "reduce": _hierarchical_rooted, "bcast": _hierarchical_rooted,
                     "alltoall": _hierarchical_exchange},
    applies=_hierarchical_applies, tiered=True, auto=True,
    doc="inside each node, then BML or ring across nodes (all-to-all: inside the node, "
        "across nodes, inside again)"))
register(Algorithm(
    "shm", {"allreduce": _shm_allreduce, "reduce_scatter": _shm_collective,
            "allgather": _shm_collective, "reduce": _shm_collective, "bcast": _shm_collective,
            "alltoall": _shm_alltoall},
    applies=_shm_applies, calibrated=True, auto=True, shared_memory=True,
    doc="one node's ranks through a shared MPI-3 window: copy in, reduce each slice from "
        "every peer's segment, copy out (IJHPCA 2025; Open MPI's XHC)"))
register(Algorithm(
    "rabenseifner", {"reduce": _rabenseifner, "bcast": _rabenseifner}, auto=True,
    doc="reduce: ring reduce-scatter then gather to the root (Rabenseifner); bcast: scatter "
        "from the root then ring allgather (van de Geijn)"))
register(Algorithm(
    "ps", {"allreduce": _ps_allreduce}, symmetric=frozenset({PORTS, BCUBE}), offered=False,
    doc="P2P parameter server (the BML paper's baseline; priced, never run)"))
# All-to-all: opted in to auto, which prices them where the calibration timed the MPI
# library's own all-to-all, and otherwise times the fixed rule's pick (pairwise, from
# BMLMPI_AUTO_BML_BYTES) against native on the user's calls (bmlmpi.tuner)
register(Algorithm(
    "pairwise", {"alltoall": _pairwise}, auto=True, fixed=frozenset({"alltoall"}),
    doc="all-to-all in N-1 rounds, one partner each way (the pairwise exchange)"))
register(Algorithm(
    "bruck", {"alltoall": _bruck}, auto=True,
    doc="all-to-all in ceil(log2 N) rounds, blocks relayed by the bits of their distance "
        "(Bruck et al., IEEE TPDS 1997)"))
register(Algorithm(
    "bcube", {"alltoall": _bcube_exchange}, auto=True,
    doc="all-to-all one BCube digit per step, k rotated pipelines on the k levels (Guo et al., "
        "SIGCOMM 2009)"))
register(Algorithm(
    NATIVE, auto=True, default=True, margin=NATIVE_MARGIN,
    doc="the MPI library's own call through mpi4py"))


def calibrated(size: int) -> list[str]:
    """The algorithms calibration measures on ``size`` ranks (trees only where ``auto``
    offers them)."""
    if size < 2:
        return []
    return [a.name for a in REGISTRY.values()
            if a.calibrated and (a.max_ranks is None or size <= a.max_ranks)]


def corrected() -> tuple[str, ...]:
    """Every algorithm calibration may correct, in registration order."""
    return tuple(a.name for a in REGISTRY.values() if a.calibrated)


def with_wire_format() -> tuple[str, ...]:
    return tuple(a.name for a in REGISTRY.values() if a.wire_format)


def candidates(ctx: Context) -> list[str]:
    """What ``auto`` prices for ``ctx``: every offered record that opts in to ``auto``, serves
    the collective, allows this many ranks and applies, in registration order (``native``
    last)."""
    return [a.name for a in REGISTRY.values()
            if a.auto and a.offered and a.serves(ctx.collective)
            and (a.max_ranks is None or ctx.size <= a.max_ranks) and a.applies(ctx)]


def default(coll: str | None = None) -> Algorithm:
    """The record ``auto`` runs where it prices nothing (:attr:`Algorithm.default`); for a
    collective ``coll`` it does not serve (``native`` serves only MPI's own collectives, not a
    registered one), the first offered record that does."""
    for a in REGISTRY.values():
        if a.default and (coll is None or a.serves(coll)):
            return a
    for a in REGISTRY.values():
        if a.offered and coll is not None and a.serves(coll):
            return a
    raise LookupError(f"no algorithm record is marked default or serves {coll}")


def for_empty(coll: str) -> str:
    """What ``auto`` runs for an empty call of ``coll``: the first record whose ``empty``
    claims it, else the default."""
    for a in REGISTRY.values():
        if coll in a.empty and a.offered and a.serves(coll):
            return a.name
    return default(coll).name


def fixed_choice(coll: str) -> str:
    """What the fixed rule runs for ``coll`` from ``BMLMPI_AUTO_BML_BYTES`` up: the first
    record whose ``fixed`` claims it, else the first offered one that opts in to ``auto`` and
    has a schedule for it, else the default."""
    for a in REGISTRY.values():
        if coll in a.fixed and a.offered and a.serves(coll):
            return a.name
    for a in REGISTRY.values():
        if a.auto and a.offered and a.scheduled and a.serves(coll):
            return a.name
    return default(coll).name


def node_tier(shared_memory: bool) -> str:
    """``Context.intra`` for pricing the tiered algorithms: where the calibration measured
    shared memory, the first record that runs in it (:attr:`Algorithm.shared_memory`), else
    messages (:data:`MESSAGE_TIER`)."""
    if shared_memory:
        for a in REGISTRY.values():
            if a.shared_memory:
                return a.name
    return MESSAGE_TIER


__all__ = ["AUTO", "AUTO_TREE_MAX_RANKS", "Algorithm", "BCUBE", "Context", "MESSAGE_TIER",
           "NATIVE", "NATIVE_MARGIN", "PORTS", "REGISTRY", "algorithms", "build", "calibrated",
           "candidates", "corrected", "default", "fixed_choice", "for_empty", "get",
           "node_tier", "register", "schedules", "scheduled", "tree_array_bound",
           "unregister", "with_wire_format"]

