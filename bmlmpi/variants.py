"""The public ``bmlmpi.Communicator``: the communicator of :mod:`bmlmpi.api` with every variant
it builds loaded.

The seam: a variant is a subclass that registers itself with the base by name when its module
is imported (``class FaultTolerantCommunicator(Communicator, variant="fault_tolerant")`` in
:mod:`bmlmpi.ft.communicator`), and ``Communicator(comm, fault_tolerant=True)`` builds the
registered one. The base names no variant's module; this module, above both in the api layer,
is the one place that imports them, so ``bmlmpi.Communicator`` (and code that imports it from
here) can build each.
"""

from __future__ import annotations

from .api import Communicator
from .ft import communicator as fault_tolerant

#: the variants this module loads, by the name they register under
LOADED = {"fault_tolerant": fault_tolerant.FaultTolerantCommunicator}

__all__ = ["Communicator", "LOADED"]
