"""The cost model: networks as link graphs, schedules priced on them, and the ``auto`` choice.

* :mod:`.network` — BCube, Fat-Tree, one shared-memory node, link-weight matrices;
* :mod:`.cost` — :func:`price` (all ranks' schedules) and :func:`price_symmetric` (one rank's,
  by symmetry): per step α + the busiest link's bytes / bandwidth, summed over steps;
* :mod:`.estimate` — :func:`estimate`, each algorithm's predicted time for a machine's
  :class:`Calibration`, and :func:`cheapest` of them (``auto``'s decision is
  :func:`bmlmpi.selection.choose`).

MPI-free; :mod:`bmlmpi.calibrate` measures a Calibration over MPI. ``python
perf/paper/report.py`` reproduces the BML paper's analysis with it.
"""

from .cost import Cost, StepCost, price, price_symmetric
from .estimate import Calibration, algorithm_cost, cheapest, crossover, estimate
from .network import (
    BCubeNetwork,
    BCubeWithout,
    FatTree,
    LinkMatrixNetwork,
    Network,
    SharedMemoryNode,
    TwoTierNetwork,
    fat_tree_groups,
)

__all__ = [
    "BCubeNetwork", "BCubeWithout", "Calibration", "Cost", "FatTree", "LinkMatrixNetwork",
    "Network", "SharedMemoryNode", "StepCost", "TwoTierNetwork", "algorithm_cost", "cheapest",
    "crossover", "estimate", "fat_tree_groups", "price", "price_symmetric",
]
