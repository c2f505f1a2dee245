"""auto for reproducible calls (bmlmpi.auto_tuning, bmlmpi.plans, bmlmpi.tuning_table): a
reproducible signature is a key of its own, apart from the plain call of the same arrays and
from the plain int64 call of its words; its candidates are priced on the int64 words the
format carries (a float32 value one word, a float64 value two, a complex value twice its
reals'); its calls explore them and every rank commits to the fastest; what it committed
shows in ``explained`` and survives the tuning table. No MPI but one rank's COMM_SELF for the
agreement on the measured times; the times are injected (tests/unit/test_tuner_noise.py's
way), never measured."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from bmlmpi import selection, tuning_table
from bmlmpi.auto_tuning import AutoTuning
from bmlmpi.call_formats import REPRODUCIBLE
from bmlmpi.model.estimate import Calibration
from bmlmpi.plans import PlanCache
from bmlmpi.tuner import TuningKey

RANKS = 4
F64 = np.dtype(np.float64)
#: a plausible calibration with the MPI library's own allreduce timed, so the model prices
PRICES = Calibration(alpha=1e-5, beta=1e-9, native=((8, 2e-5), (1 << 20, 1e-3)))


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)


def owner():
    """What AutoTuning reads of its communicator: four ranks, one node each, the plain
    policy; the agreement's MAX on COMM_SELF (one rank's proposal is the agreed vector)."""
    return SimpleNamespace(comm=MPI.COMM_SELF, control=MPI.COMM_SELF, rank=0, size=RANKS,
                           timeout=10.0, policy=SimpleNamespace(keeps_calls=False),
                           plans=SimpleNamespace(choices={}, placement=SimpleNamespace(
                               nodes_for_auto=lambda: None)))


def carrier(dtype, op="sum"):
    return REPRODUCIBLE.carrier(np.dtype(dtype), op)


def test_a_reproducible_call_is_a_signature_of_its_own():
    tuning = AutoTuning(owner())
    f32 = np.dtype(np.float32)
    plain = tuning.key("allreduce", 1000, f32, "sum", 0)
    repro = tuning.key("allreduce", 1000, f32, "sum", 0, carrier(f32))
    # the plain int64 call of its 1000 words: the key a carried call had before
    words = tuning.key("allreduce", 1000, np.dtype(np.int64), "sum", 0)
    assert (repro.wire, plain.wire, words.wire) == ("reproducible", "", "")
    assert (repro.dtype, repro.op, repro.size) == ("float32", "sum", 4096)
    assert len({plain, repro, words}) == 3
    avg = tuning.key("allreduce", 1000, f32, "avg", 0, carrier(f32, "avg"))
    assert avg != repro
    scatter = tuning.key("reduce_scatter", 1000, f32, "sum", 0, carrier(f32))
    assert scatter.wire == "reproducible" and scatter != repro
    # MIN and MAX pass through the format (no carrier): the plain key, not tuned for floats
    assert carrier(f32, "max") is None
    assert tuning.key("allreduce", 1000, f32, "max", 0, None) is None


@pytest.mark.parametrize("dtype, words_per_value", [
    (np.float16, 1), (np.float32, 1), (np.float64, 2), (np.complex64, 2), (np.complex128, 4)])
def test_the_candidates_are_priced_on_the_words(dtype, words_per_value):
    """The wire cost: ``words_per_value`` int64 words a value, priced as the int64 allreduce
    of those words; every candidate's predicted time is the words' and exceeds the plain
    call's of the same values (float16: 8 bytes a value against 2)."""
    dt = np.dtype(dtype)
    n = 1 << 14
    assert PlanCache.carried_prices(n, dt, carrier(dt)) == (n * words_per_value, 8)
    assert PlanCache.carried_prices(n, dt, None) == (n, dt.itemsize)
    words = selection.explain(n * words_per_value, 8, RANKS, PRICES)
    plain = selection.explain(n, dt.itemsize, RANKS, PRICES)
    assert words.rule == plain.rule == "cost model"
    assert (words.count, words.itemsize) == (n * words_per_value, 8)
    priced = {c.name: c.predicted for c in words.candidates}
    assert set(priced) == {c.name for c in plain.candidates}
    assert all(priced[c.name] > c.predicted for c in plain.candidates)


def explore(tuning, key, why, call, seconds):
    """Every exploration call of ``key``: ``call`` prepared as the pipeline prepares it
    (``choice`` at its preparation), explored, timed with the injected ``seconds[name]``;
    the candidates the calls ran, in order, and whether each may open its fast path."""
    now = [0.0]
    tuning.clock = lambda: now[0]
    ran, opens = [], []
    for _ in range(tuning.tuner.exploration_calls(key)):
        call.algorithm = tuning.choice(key, why)
        timing = tuning.explore(call)
        ran.append(call.algorithm)
        now[0] += seconds[call.algorithm]
        opens.append(tuning.after_call(call, timing))
    return ran, opens


@pytest.mark.parametrize("calib", [None, PRICES], ids=["rule", "model"])
def test_a_reproducible_signature_explores_and_commits_the_fastest(calib):
    """Without prices (every applicable record a candidate) and with them (the model's best
    three and native): the calls run every candidate, the fastest (not the prior) is
    committed with ``why="measured"``, ``explained`` shows it; the plain signatures of the
    same arrays and of the words are untouched; the next call runs the committed algorithm
    and may open its fast-path entry."""
    tuning = AutoTuning(owner())
    tuning.give(calib)
    wire = carrier(F64)
    n = 1 << 12
    words, itemsize = PlanCache.carried_prices(n, F64, wire)
    why = selection.explain(words, itemsize, RANKS, calib)
    key = tuning.key("allreduce", n, F64, "sum", 0, wire)
    prior = tuning.choice(key, why)
    names = [c.name for c in tuning.tuner.report(key).candidates]
    assert len(names) > 1 and prior in names
    fastest = next(n for n in reversed(names) if n != prior)
    seconds = {name: 1e-3 * (2 + i) for i, name in enumerate(names)}
    seconds[fastest] = 1e-4
    call = SimpleNamespace(collective="allreduce", total=n, dtype=F64, op="sum", root=0,
                           wire=wire, requested="auto", algorithm=prior, size=RANKS)
    ran, opens = explore(tuning, key, why, call, seconds)
    assert set(ran) == set(names)
    assert not any(opens)   # exploring: every call takes the checked path, where it counts
    report = tuning.tuner.report(key)
    assert (report.state, report.chosen, report.why) == ("committed", fastest, "measured")
    shown = tuning.explained(key, why)
    assert (shown.chosen, shown.rule, shown.tuning.chosen) == (fastest, "measured", fastest)
    assert {c.name: c.measured for c in shown.tuning.candidates}[fastest] == pytest.approx(1e-4)
    plain = tuning.key("allreduce", n, F64, "sum", 0)
    of_words = tuning.key("allreduce", words, np.dtype(np.int64), "sum", 0)
    assert tuning.tuner.keys() == [key]
    assert plain not in tuning.tuner.keys() and of_words not in tuning.tuner.keys()
    call.algorithm = tuning.choice(key, why)
    timing = tuning.explore(call)
    assert call.algorithm == fastest and tuning.after_call(call, timing)


def test_the_tuning_table_keeps_a_reproducible_entry_apart(tmp_path):
    """A committed reproducible entry is written with its ``wire`` and read back under its
    own key, beside the plain entry of the same signature; a plain entry's line has no
    ``wire`` (tables written before are read as they were)."""
    layout = "4x1"
    repro = TuningKey("allreduce", 4096, "float64", "sum", RANKS, layout, None, "reproducible")
    plain = TuningKey("allreduce", 4096, "float64", "sum", RANKS, layout)
    entries = {repro: tuning_table.TableEntry(repro, "ring", "measured", ("ring", "native"),
                                              (1e-4, 2e-3)),
               plain: tuning_table.TableEntry(plain, "native", "measured")}
    assert json.loads(entries[repro].to_line())["wire"] == "reproducible"
    assert "wire" not in json.loads(entries[plain].to_line())
    path = tmp_path / "table.jsonl"
    tuning_table.save(path, entries, host="h", mpi="m", ranks=RANKS, layout=layout)
    loaded = tuning_table.load(path, ranks=RANKS, layout=layout)
    assert loaded == entries
    bad = path.read_text().replace('"wire": "reproducible"', '"wire": 3')
    path.write_text(bad)
    with pytest.warns(RuntimeWarning, match="wire 3 is not a string"):
        assert set(tuning_table.load(path, ranks=RANKS, layout=layout)) == {plain}
