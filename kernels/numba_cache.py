"""Where numba keeps the compiled kernels: the user's cache directory, never the package.

numba's ``cache=True`` writes beside the module (``kernels/__pycache__/*.nbi|*.nbc``) when that
folder is writable. In an installed package that is ``site-packages/bmlmpi/kernels/``: files
pip did not install and will not remove, so after an uninstall (or a later editable install)
``site-packages/bmlmpi/`` survives as a namespace package that shadows the real one. A
read-only install gets no cache at all. So these kernels are cached under
``config.cache_dir() / "numba"`` (``$BMLMPI_CACHE_DIR``, else ``~/.cache/bmlmpi``, the
calibration cache's base), one subfolder per version of the kernel sources: the folder's name
and a hash of the contents of its ``.py`` files. Two installs of the same sources (the
README's non-editable install and the editable one beside it, a test's venv, another clone)
share one subfolder and compile each kernel once between them; an install whose sources differ
in any byte gets a subfolder of its own. Within one, numba checks each entry as it always does:
against a hash of the function's source file, its own version and the CPU it was compiled for.

How: :func:`cached` gives one dispatcher a cache whose only locator is
:class:`KernelCacheLocator`, the same way numba's ``Dispatcher.enable_caching`` does it with
its default locators. Nothing global changes: numba's ``NUMBA_CACHE_DIR`` and the caching of
the user's own functions are left alone (numba's ``NUMBA_CACHE_LOCATOR_CLASSES``, an explicit
process-wide override, is still honoured, as numba honours it for every cache). Where the
directory cannot be created or written, the kernels are compiled in every process instead
(with a warning), as numba does when no locator fits.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

from numba.core import caching

from .. import config


def cache_root() -> Path:
    """The folder holding numba's cache for these kernels."""
    return config.cache_dir() / "numba"


class KernelCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba cache locator: ``cache_root()/<folder>_<sha1 of the folder's sources>``;
    freshness from the source file, as numba's own file-backed locators."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(cache_root(), self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def get_suitable_cache_subpath(cls, py_file: str) -> str:
        """``<folder>_<hash of the folder's sources>`` for the folder holding ``py_file``."""
        folder = os.path.dirname(os.path.abspath(py_file))
        return f"{os.path.basename(folder)}_{sources_digest(folder)}"


@functools.cache
def sources_digest(folder: str) -> str:
    """A hash of the names and contents of the ``.py`` files in ``folder``: the same for two
    copies of the kernel sources, different when any file differs."""
    digest = hashlib.sha1()
    for path in sorted(Path(folder).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class _KernelCacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [KernelCacheLocator]


class _KernelCache(caching.FunctionCache):
    _impl_class = _KernelCacheImpl


_warned: set[str] = set()


def cached(dispatcher):
    """``dispatcher`` (an ``njit`` function compiled without ``cache=True``), now caching its
    compilations under :func:`cache_root`."""
    try:
        dispatcher._cache = _KernelCache(dispatcher.py_func)
    except RuntimeError as exc:  # numba: no locator could create and write its folder
        where = str(cache_root())
        if where not in _warned:
            _warned.add(where)
            warnings.warn(f"bmlmpi: cannot write the kernel cache under {where} ({exc}); "
                          f"kernels will be compiled in every process (set BMLMPI_CACHE_DIR "
                          f"to a writable folder)", RuntimeWarning, stacklevel=2)
    return dispatcher
