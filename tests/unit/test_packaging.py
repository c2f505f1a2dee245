"""The source folder and the installed package are the same package wherever the user stands.

kernels/ lives at the top of the repository and ships as ``bmlmpi.kernels``. It is reached
through the committed link ``bmlmpi/kernels -> ../kernels``, not through an install-time mapping
(setup.cfg ``package_dir``): with a mapping, Python started in the repository root imports the
source folder ``bmlmpi/``, which then has no ``kernels`` (tests/test_installed.py runs the
non-editable install from the root). setup.cfg lists packages by hand, and a package missing
there works in an editable install (the tests) but not in ``pip install .`` (README command 1).
"""

import configparser
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _options() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg["options"]


def _listed() -> set[str]:
    return {p.strip() for p in _options()["packages"].split() if p.strip()}


def test_kernels_is_linked_into_the_source_package():
    link = ROOT / "bmlmpi" / "kernels"
    assert link.is_symlink(), "bmlmpi/kernels must be a link to ../kernels"
    assert os.readlink(link) == "../kernels"  # relative: valid in every clone
    assert (link / "__init__.py").resolve() == (ROOT / "kernels" / "__init__.py").resolve()


def test_no_install_time_package_mapping():
    assert "package_dir" not in _options(), \
        "a package_dir mapping exists only in the installed package, not in the source folder"


def test_setup_cfg_lists_every_package():
    # rglob does not descend into the bmlmpi/kernels link; kernels/ is walked on its own.
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "bmlmpi").rglob("__init__.py")}
    found |= {".".join(("bmlmpi", *p.parent.relative_to(ROOT).parts))
              for p in (ROOT / "kernels").rglob("__init__.py")}
    missing = found - _listed()
    assert not missing, f"setup.cfg [options] packages misses {sorted(missing)}"
