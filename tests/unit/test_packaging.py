"""The wheel ships every package of the tree: setup.cfg lists packages by hand, and a package
missing there works in an editable install (the tests) but not in `pip install .` (README
command 1)."""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}


def test_setup_cfg_lists_every_package():
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "bmlmpi").rglob("__init__.py")}
    found |= {"bmlmpi.kernels" if p.parent == ROOT / "kernels" else
              "bmlmpi.kernels." + ".".join(p.parent.relative_to(ROOT / "kernels").parts)
              for p in (ROOT / "kernels").rglob("__init__.py")}
    missing = found - _listed()
    assert not missing, f"setup.cfg [options] packages misses {sorted(missing)}"
