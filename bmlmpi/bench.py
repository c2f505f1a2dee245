"""``python -m bmlmpi.bench``: the sweep under its earlier name, kept for scripts that use it.
The program is :mod:`bmlmpi.cli.bench` (``bmlmpi-bench``, ``python -m bmlmpi.cli.bench``);
this module only starts it."""

from __future__ import annotations

from .cli.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
