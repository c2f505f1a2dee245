"""Hand-written DLPack exporters for the buffer tests (unit and MPI): numpy arrays seen only
through the protocol, as other libraries export them."""

import numpy as np


class LegacyDLPack:
    """Exports memory over the DLPack protocol before 1.0: ``__dlpack__`` has no max_version."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class DLPack1:
    """Exports memory over DLPack 1.0 (versioned capsules, read-only flag)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._a.__dlpack__(stream=stream, max_version=max_version,
                                  dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()
