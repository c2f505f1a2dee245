"""The committed perf/paper/REPORT.md is exactly what perf/paper/report.py writes, with or
without matplotlib (its plots are files; the text naming them does not depend on drawing)."""

import difflib
import importlib.util
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[2] / "perf" / "paper"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("paper_report", PAPER / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_report_is_the_scripts_text(report, monkeypatch):
    # as on a machine without matplotlib: the text must not change
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    text = report.report_text()
    committed = (PAPER / "REPORT.md").read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                        "committed REPORT.md", "report.py's text"))
    assert text == committed, "regenerate with `python perf/paper/report.py`:\n" + diff[:6000]


def test_plots_section_names_the_committed_pngs(report):
    committed = (PAPER / "REPORT.md").read_text()
    plots = committed.split("\n## Plots\n", 1)[1]
    assert [line for line in plots.splitlines() if line] == \
        [f"![{p}]({p})" for p in report.PLOTS]
    for p in report.PLOTS:
        assert (PAPER / p).is_file(), p


def test_without_matplotlib_main_writes_the_same_text_and_says_so(report, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "REPORT.md"
    assert report.main(["--out", str(out)]) == 0
    assert out.read_text() == (PAPER / "REPORT.md").read_text()
    assert "plots not redrawn" in capsys.readouterr().err
