"""mpi4py's own collective tests, run unchanged through bmlmpi's drop-ins under mpiexec.

The test files (test_cco_buf.py, test_cco_nb_buf.py, test_cco_pr_buf.py, test_cco_vec.py,
test_cco_nb_vec.py, test_cco_pr_vec.py and the helpers they import) come from mpi4py 4.1.2's
source distribution on PyPI: it is downloaded once into a cache (``BMLMPI_PEER_CACHE``,
default ``~/.cache/bmlmpi-tests``), its checksum verified, and the files extracted next to
it; none of their code is part of this repository. The download alone may skip the tests
(with the URL that failed); a wrong checksum fails them. ``tests/peer_mpi4py.py`` imports
the files in every rank and renames the family's calls to bmlmpi's drop-ins (its docstring
says how).

Every unit (one test method of one test class) ends in one of three ways: it passes (the
files check mpi4py's exact results), or it is refused on every rank with an error listed in
:data:`REFUSALS`, each pointing at the documentation sentence that promises it (the sentence
is checked to be there), or the test fails: a wrong result (an assertion of mpi4py's own),
an unlisted error, an error on some ranks only, a listed refusal that no longer happens, or
a launch that does not end within its timeout.

The matrix, ten launches: the default ``auto`` at N = 1 … 5 over every file, with every
test class (``COMM_SELF``, ``COMM_WORLD``, their duplicates, in place) at N = 1 and 2 and the
``COMM_WORLD`` classes (not the duplicates) from N = 3 on, where a ``COMM_SELF`` class repeats
what N = 1 ran and a launch costs most (the ranks outnumber two cores); each forced algorithm
(``BMLMPI_ALGORITHM``) over the ``COMM_WORLD`` classes at one rank count where it runs its
own schedule rather than a fallback: ``bml``, ``ring`` and ``native`` at N = 3 (a prime:
BML's one-level BCube, a ring of odd length), ``shm`` at N = 4 (one node, every rank in the
shared-memory tier) and ``hierarchical`` at N = 4 as two pretended nodes of two ranks
(``BMLMPI_RANKS_PER_NODE=2``). ``BMLMPI_PEER_RANKS`` (e.g. ``1,2``) narrows the auto runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
URL = ("https://files.pythonhosted.org/packages/75/83/"
       "231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz")
SHA256 = "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"
MODULES = ("test_cco_buf", "test_cco_nb_buf", "test_cco_pr_buf", "test_cco_vec",
           "test_cco_nb_vec", "test_cco_pr_vec")
HELPERS = ("mpiunittest", "arrayimpl", "mpitestutil", "dlpackimpl")
CACHE = Path(os.environ.get("BMLMPI_PEER_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "bmlmpi-tests")
AUTO_RANKS = [int(n) for n in os.environ.get("BMLMPI_PEER_RANKS", "1,2,3,4,5").split(",")]
LAUNCH_TIMEOUT = int(os.environ.get("BMLMPI_TEST_LAUNCH_TIMEOUT", "900"))
#: (algorithm, ranks, extra environment) of the forced runs (module docstring).
FORCED = [("bml", 3, {}), ("ring", 3, {}), ("native", 3, {}), ("shm", 4, {}),
          ("hierarchical", 4, {"BMLMPI_RANKS_PER_NODE": "2"})]
HAS_CUPY = importlib.util.find_spec("cupy") is not None


@dataclass(frozen=True)
class Refusal:
    """A unit bmlmpi refuses, with the documented error: ``tests`` and ``message`` are
    regular expressions (the test id, the error's text); ``doc`` is a file under docs/ and
    ``sentence`` the words of it that promise the refusal; ``applies``: whether this run's
    machine makes it happen (it must then be seen)."""

    tests: str
    error: str
    message: str
    doc: str
    sentence: str
    applies: bool = True


REFUSALS = [
    # testBcastTypeIndexed: a Bcast of an indexed-block datatype (every other element)
    Refusal(r"\.testBcastTypeIndexed$", "BufferSpecError", r"is not a predefined datatype",
            "api.md", "derived datatypes (`Create_contiguous`, `Create_vector`, "
            "`Create_indexed_block`"),
    # arrayimpl's "fake GPU" arrays: host memory behind __cuda_array_interface__
    Refusal(r".", "ImportError", r"a GPU array was given but cupy is not installed",
            "api.md", "without cupy installed, every call given one raises `ImportError`",
            applies=not HAS_CUPY),
    # the same arrays given to Allreduce_init (checked before any staging)
    Refusal(r"test_cco_pr_buf\..*\.testAllreduce$", "BufferSpecError",
            r"Allreduce_init takes host buffers", "collectives.md",
            "The persistent forms refuse them with `BufferSpecError` on every rank"),
]


def _download(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    try:
        with urllib.request.urlopen(URL, timeout=60) as response, open(part, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as exc:  # URLError and socket timeouts are OSErrors
        part.unlink(missing_ok=True)
        pytest.skip(f"could not download {URL}: {exc}")
    part.replace(target)


@pytest.fixture(scope="module")
def peer_tests() -> Path:
    """The folder holding mpi4py's test files, fetched and extracted once."""
    sdist = CACHE / "mpi4py-4.1.2.tar.gz"
    folder = CACHE / "mpi4py-4.1.2-test"
    if not sdist.exists():
        _download(sdist)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        sdist.unlink()
        pytest.fail(f"{URL}: sha256 {digest}, expected {SHA256} (the cached copy was removed)")
    names = [f"{n}.py" for n in MODULES + HELPERS]
    if not all((folder / n).exists() for n in names):
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for n in names:
                data = tar.extractfile(f"mpi4py-4.1.2/test/{n}").read()
                (folder / n).write_bytes(data)
    return folder


def _run(folder: Path, n: int, algorithm: str | None, classes: str,
         env: dict[str, str]) -> list[dict]:
    """Every rank's outcomes of one launch."""
    with tempfile.TemporaryDirectory(prefix="bmlmpi-peer-") as tmp:
        out = Path(tmp) / "out"
        trace = Path(tmp) / "trace"
        out.mkdir()
        trace.mkdir()
        full_env = {**os.environ, "BMLMPI_TIMEOUT": "60", "PYTHONUNBUFFERED": "1",
                    "BMLMPI_TRACE_DIR": str(trace), **env}
        full_env.pop("BMLMPI_ALGORITHM", None)
        if algorithm:
            full_env["BMLMPI_ALGORITHM"] = algorithm
        cmd = [sys.executable, "-m", "bmlmpi.cli.launch", "-n", str(n), sys.executable,
               str(ROOT / "tests" / "peer_mpi4py.py"), str(folder), str(out),
               "--classes", classes, *MODULES]
        try:
            res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                 timeout=LAUNCH_TIMEOUT, env=full_env)
        except subprocess.TimeoutExpired as exc:
            last = [line for line in _text(exc.stderr).splitlines() if line.startswith("peer: ")]
            pytest.fail(f"{n} ranks, {algorithm or 'auto'}: no end within {LAUNCH_TIMEOUT} s; "
                        f"the last unit started: {last[-1:]}\n{_text(exc.stdout)[-2000:]}")
        tail = (res.stdout + res.stderr)[-4000:]
        assert res.returncode == 0, f"{n} ranks, {algorithm or 'auto'}: exit " \
                                    f"{res.returncode}\n{tail}"
        ranks = [out / f"rank{r}.json" for r in range(n)]
        missing = [p.name for p in ranks if not p.exists()]
        assert not missing, f"no outcomes from {missing}\n{tail}"
        return [json.loads(p.read_text()) for p in ranks]


def _text(output: bytes | str | None) -> str:
    """A TimeoutExpired's output (bytes, even from a run in text mode)."""
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def _listed(test: str, outcome: dict) -> Refusal | None:
    for refusal in REFUSALS:
        if (re.search(refusal.tests, test) and outcome["type"] == refusal.error
                and re.search(refusal.message, outcome["message"])):
            return refusal
    return None


def check_outcomes(ranks: list[dict], label: str) -> None:
    """Every unit passes on every rank or is refused on every rank with a listed error (the
    others may raise RemoteArgumentError); every listed refusal that applies is seen."""
    problems: list[str] = []
    seen: set[int] = set()
    tests = sorted(set().union(*ranks))
    for test in tests:
        outcomes = [rank.get(test, {"outcome": "missing"}) for rank in ranks]
        kinds = {o["outcome"] for o in outcomes}
        if kinds <= {"pass", "skip"}:
            continue
        lines = [f"rank {r}: {o['outcome']} {o.get('type', '')}: {o.get('message', '')[:300]}"
                 for r, o in enumerate(outcomes)]
        if "wrong" in kinds:
            where = next(o["where"] for o in outcomes if o["outcome"] == "wrong")
            problems.append(f"WRONG RESULT {test}\n  " + "\n  ".join(lines) + f"\n{where}")
            continue
        if kinds != {"error"}:
            problems.append(f"not refused on every rank: {test}\n  " + "\n  ".join(lines))
            continue
        listed = [_listed(test, o) for o in outcomes]
        remote = [o["type"] == "RemoteArgumentError" for o in outcomes]
        if not any(listed) or not all(a or b for a, b in zip(listed, remote, strict=True)):
            problems.append(f"unlisted refusal {test}\n  " + "\n  ".join(lines))
            continue
        seen.update(REFUSALS.index(x) for x in listed if x is not None)
    for i, refusal in enumerate(REFUSALS):
        if refusal.applies and i not in seen and any(re.search(refusal.tests, t)
                                                     for t in tests):
            problems.append(f"listed refusal no longer seen (remove it from REFUSALS and "
                            f"its sentence from docs/{refusal.doc}): {refusal}")
    assert not problems, f"{label}:\n" + "\n".join(problems)


def test_every_refusal_is_documented():
    for refusal in REFUSALS:
        text = " ".join((ROOT / "docs" / refusal.doc).read_text().split())
        assert refusal.sentence in text, (refusal.doc, refusal.sentence)


@pytest.mark.parametrize("n", AUTO_RANKS)
def test_mpi4py_collective_tests_auto(peer_tests, n):
    classes = "." if n <= 2 else "World$"
    check_outcomes(_run(peer_tests, n, None, classes, {}), f"{n} ranks, auto")


@pytest.mark.parametrize(("algorithm", "n", "env"), FORCED,
                         ids=[f"{a}-{n}" for a, n, _ in FORCED])
def test_mpi4py_collective_tests_forced(peer_tests, algorithm, n, env):
    check_outcomes(_run(peer_tests, n, algorithm, "World$", env), f"{n} ranks, {algorithm}")
