"""auto's exploration ranks the candidates by their steady state (bmlmpi.tuner): a
candidate's first calls after another candidate's run slower than its later ones, by a share
that differs between candidates, and a user's loop of the committed one never meets them. So
from 512 KiB each block starts with settling calls that are not counted. Per-call timings are
injected as functions of the call's place in its candidate's run of consecutive calls; two
ranks are two Tuners, and the MAX the pipeline takes across ranks is taken here."""

from __future__ import annotations

from collections.abc import Callable

from bmlmpi import selection
from bmlmpi.topology.nodes import Nodes
from bmlmpi.tuner import SETTLE_CALLS, Tuner, TuningKey

RANKS = 2
MS = 1e-3


def rule_pick(nbytes: int) -> selection.Explanation:
    """auto without a calibration on two ranks of one node: the fixed rule picks bml from
    64 KiB, and every applicable record is a candidate (shm among them)."""
    why = selection.explain(nbytes // 4, 4, RANKS, nodes=Nodes(((0, 1),)))
    assert (why.rule, why.chosen) == ("fixed rule", "bml")
    assert why.applicable == ("bml", "ring", "tree", "multitree", "shm", "native")
    return why


def explore(tuners: list[Tuner], key: TuningKey,
            time_of: Callable[[int, str, int, float], float]) -> list[str]:
    """One exploration of ``key`` on every rank's Tuner; ``time_of(rank, name, place,
    progress)`` is that rank's seconds for a call of ``name`` that is the ``place``-th (1
    first) of its run of consecutive calls, ``progress`` (0 to 1) into the exploration.
    Returns each rank's commit."""
    why = rule_pick(key.size)
    for t in tuners:
        t.begin(key, why)
    calls = tuners[0].exploration_calls(key)
    last, place = None, 0
    for index in range(calls):
        names = {t.choose(key, index) for t in tuners}
        assert len(names) == 1
        name = names.pop()
        place = place + 1 if name == last else 1
        last = name
        for rank, t in enumerate(tuners):
            t.record(key, name, time_of(rank, name, place, index / calls))
        assert {t.due(key, index) for t in tuners} == {index == calls - 1}
    agreed = [max(col) for col in zip(*(t.proposal(key) for t in tuners), strict=True)]
    for t in tuners:
        t.commit(key, agreed)
    return [t.committed(key) for t in tuners]


#: A quiet run at 4 MiB, N = 2 (python -m perf.auto, 2026-11-28 22:38 UTC): each
#: candidate's calls in ms, the 1st, 2nd, 3rd and from the 4th on of a run of consecutive
#: calls. The 2nd call is what a block of one leading and one counted call measured (bml
#: 0.94, ring 0.82, tree 1.22, multitree 0.84, shm 0.77, native 0.97: shm 1.22 times faster
#: than bml), the 4th what the committed calls ran (bml 0.68, shm 0.34: 2 times).
SETTLING = {"bml": (1.14, 0.94, 0.71, 0.68), "ring": (1.0, 0.82, 0.65, 0.62),
            "tree": (1.4, 1.22, 1.05, 1.0), "multitree": (1.0, 0.84, 0.67, 0.64),
            "shm": (1.0, 0.77, 0.45, 0.34), "native": (1.2, 0.97, 0.74, 0.70)}
#: each third of the exploration: bml's blocks a little apart, shm's last block disturbed
#: (one busy spell): its blocks overlap bml's in the 2nd calls, not in the settled ones
JITTER = {"bml": (1.0, 0.97, 1.05), "shm": (1.0, 1.0, 1.35)}


def four_mib(rank: int, name: str, place: int, progress: float) -> float:
    third = min(2, int(3 * progress))
    return SETTLING[name][min(place, 4) - 1] * JITTER.get(name, (1, 1, 1))[third] * MS


def test_the_4_mib_allreduce_commits_the_steady_state_winner():
    """That 4 MiB case: counted right after one leading call, shm's median (0.77 ms)
    was 1.22 times bml's (0.94 ms), under the decisive 1.25, and one of shm's blocks was
    slower than bml's fastest: the rule kept bml, which then ran 2 times shm's time. Counted
    after the settling calls, shm's blocks (0.34-0.46 ms) are all faster than bml's
    (0.66-0.71 ms): shm is committed, measured."""
    key = TuningKey("allreduce", 4 << 20, "float32", "sum", RANKS, "1x2")
    tuners = [Tuner() for _ in range(RANKS)]
    assert explore(tuners, key, four_mib) == ["shm"] * RANKS
    report = tuners[0].report(key)
    assert report.why == "measured"
    measured = {c.name: c.measured for c in report.candidates}
    assert measured["shm"] == SETTLING["shm"][3] * MS
    assert measured["bml"] == SETTLING["bml"][3] * MS


def test_a_blocks_counted_calls_come_after_its_settling_calls():
    """Every counted call is at least the (lead + 1)-th of its run, at every size: a call
    whose place is at most the lead takes 1000 times as long and would win nothing if it
    were counted, so the settled times are what every candidate's blocks hold."""
    key_sizes = [1 << 18, 1 << 19, 1 << 20, 2 << 20, 4 << 20, 16 << 20, 64 << 20]
    for size in key_sizes:
        key = TuningKey("allreduce", size, "float32", "sum", RANKS, "1x2")
        t = Tuner()
        lead = t.lead_calls_at(size)

        def timed(rank, name, place, progress, lead=lead):
            return (1.0 if place <= lead else SETTLING[name][3] * MS)
        assert explore([t], key, timed) == ["shm"], size
        blocks = {c.name: c.blocks for c in t.report(key).candidates}
        assert all(b == (SETTLING[n][3] * MS,) * 3 for n, b in blocks.items()), size


def test_the_settling_calls_are_what_cold_calls_measured():
    """3 from 512 KiB, 1 from 16 MiB, none from 64 MiB (docs/tuning.md, "Settling calls"),
    and a Tuner refuses a table it could not read."""
    assert SETTLE_CALLS == ((512 << 10, 3), (16 << 20, 1), (64 << 20, 0))
    t = Tuner(settle=((0, 2), (1 << 20, 5)))
    assert [t.lead_calls_at(s) for s in (8, 1 << 19, 1 << 20, 1 << 30)] == [2, 2, 5, 5]
    for bad in (((1 << 20, -1),), ((1 << 20, 1), (1 << 10, 2)), ((8, 1), (8, 2))):
        try:
            Tuner(settle=bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")
