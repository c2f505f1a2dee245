"""An emulated BCube / Fat-Tree testbed in Linux network namespaces (see README.md here).

Run as root from the repository root: ``python -m perf.testbed --help``.
"""
