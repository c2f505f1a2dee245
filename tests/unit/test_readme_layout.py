"""The folder tree in docs/architecture.md names every module of the library, under its own
folder, so that the architecture it describes is the one on disk."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_block() -> dict[str, str]:
    """Folder (as written at the start of a line) -> the text describing it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"^## Layout\n.*?^```\n(.*?)```", text, re.S | re.M)
    assert block, "docs/architecture.md has no ## Layout section with a folder tree"
    entries: dict[str, str] = {}
    folder = None
    for line in block.group(1).splitlines():
        if line[:1].strip():
            folder, _, rest = line.partition(" ")
            entries[folder] = rest
        elif folder is not None:
            entries[folder] += " " + line.strip()
    return entries


def test_readme_tree_names_every_module_in_its_folder():
    entries = layout_block()
    missing = []
    for top in ("bmlmpi", "kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            folder = path.parent.relative_to(ROOT).as_posix() + "/"
            if path.name not in entries.get(folder, ""):
                missing.append(f"{folder}{path.name}")
    assert not missing, f"docs/architecture.md's Layout does not name: {missing}"
