"""What the dispatcher and the numba back end share, in a module that imports neither: the
size thresholds of the back-end choice and the dtypes numba has kernels for (kept here so that
choosing a back end does not import numba). The measurements behind the thresholds are in
:mod:`bmlmpi.kernels.dispatch` and ``perf/kernels/``."""

from __future__ import annotations

import numpy as np

#: ``auto`` gives a fused call (two or more sources) on at least this many bytes to numba.
NUMBA_FUSED_MIN_BYTES = 1 << 20

#: Below this many bytes of ``dst`` a numba call runs on the calling thread alone: a fork-join
#: costs microseconds (milliseconds when the cores are oversubscribed), and a second thread
#: only pays once the call is long.
PARALLEL_MIN_BYTES = 1 << 20

#: dtypes with a numba kernel.
NUMBA_DTYPES = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128))
