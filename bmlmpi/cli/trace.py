"""``bmlmpi-trace DIR``: read every rank's flight recorder and say what happened.

    bmlmpi-trace /tmp/bmlmpi-trace-<job>        # the story, for a person
    bmlmpi-trace --json DIR                      # the same, for tools
    bmlmpi-trace --timeline DIR [-o OUT]         # merge BMLMPI_TIMELINE files (Chrome trace)

The dumps (:mod:`bmlmpi.recorder`: ``bmlmpi-trace-<host>-p<pid>-w<rank>-c<comm>.json``) of all
nodes may be gathered into one folder; they are grouped by communicator (its creation order in
each process, ``c<index>``, and its size) and lined up by sequence number. For each
communicator it tells:

* which ranks wrote a dump and which are **missing** (killed, or never reached a dump);
* the **last call every rank completed**, and each rank's last completed call and the call it
  is in (its step, and the peers it waits on);
* the ranks **behind** the others;
* **desyncs**: a sequence number whose signature (collective, count, dtype, op, root,
  algorithm) differs between ranks, with the fields that differ, and whether the odd rank
  **skipped** a call (its calls from there on are the others' next ones) or made an **extra**
  one;
* for a stuck call, the **chain of waits** (rank → the peer it waits on → ...) down to the
  rank that holds everyone up: one that is missing, one that has not reached the call, or,
  where the waits go round in a circle, the rank that entered the call last.

Exit status: 0 when the dumps show nothing wrong, 1 when they show a problem, 2 when there
are no dumps to read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..recorder import CLEAN_END

FIELDS = ("collective", "count", "dtype", "op", "root", "asked", "chosen")
#: how a field is named in the story
FIELD_WORDS = {"asked": "algorithm asked", "chosen": "algorithm"}


def load(directory: Path) -> list[dict[str, Any]]:
    """Every flight-recorder dump in ``directory`` (recursively, so per-node subfolders
    gathered under one work)."""
    dumps = []
    for path in sorted(Path(directory).rglob("bmlmpi-trace-*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if str(doc.get("format", "")).startswith("bmlmpi-flight-recorder/"):
            doc["file"] = str(path)
            dumps.append(doc)
    return dumps


def signature(call: dict[str, Any]) -> tuple:
    return tuple(call.get(f) for f in FIELDS)


def describe_sig(sig: Sequence[Any] | dict[str, Any]) -> str:
    if isinstance(sig, dict):
        sig = signature(sig)
    collective, count, dtype, op, root, asked, chosen = sig
    text = f"{collective} of {count} x {dtype}"
    if op is not None:
        text += f" {op}"
    if root is not None:
        text += f" root {root}"
    alg = chosen if chosen == asked or chosen is None else f"{chosen} (asked {asked})"
    return f"{text}, {alg or asked}"


def _differs(a: tuple, b: tuple) -> list[str]:
    return [FIELD_WORDS.get(f, f) for f, x, y in zip(FIELDS, a, b, strict=True) if x != y]


def _same_run(mine: dict[int, tuple], theirs: dict[int, tuple], shift: int, start: int) -> int:
    """How many of ``mine`` from ``start`` on equal ``theirs`` shifted by ``shift``; -1 when
    one differs."""
    n = 0
    for seq in sorted(s for s in mine if s >= start):
        other = theirs.get(seq + shift)
        if other is None:
            continue
        if other != mine[seq]:
            return -1
        n += 1
    return n


def analyse_comm(dumps: list[dict[str, Any]]) -> dict[str, Any]:
    """The story of one communicator's dumps (one per rank; the latest where a rank wrote
    several)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for d in dumps:
        r = d["rank"]
        if r not in by_rank or d["time"] > by_rank[r]["time"]:
            by_rank[r] = d
    size = max(d["size"] for d in dumps)
    ranks = sorted(by_rank)
    missing = [r for r in range(size) if r not in by_rank]
    calls = {r: {c["seq"]: c for c in by_rank[r]["calls"]} for r in ranks}
    sigs = {r: {s: signature(c) for s, c in calls[r].items()} for r in ranks}

    # each rank: its last call completed in order, and the first call not completed
    state: dict[int, dict[str, Any]] = {}
    for r in ranks:
        seqs = sorted(calls[r])
        done = [s for s in seqs if calls[r][s]["state"] == "done"]
        open_ = [s for s in seqs if calls[r][s]["state"] != "done"]
        st: dict[str, Any] = {"next": by_rank[r].get("next", by_rank[r]["recorded"]),
                              "last_done": max(done) if done else None,
                              "ended": by_rank[r]["reason"] == CLEAN_END,
                              "host": by_rank[r]["host"], "pid": by_rank[r]["pid"],
                              "reason": by_rank[r]["reason"], "file": by_rank[r]["file"]}
        if open_:
            c = calls[r][open_[0]]
            st["current"] = {k: c.get(k) for k in ("seq", "state", "step", "steps", "peers",
                                                   "error", "start")}
            st["current"]["signature"] = describe_sig(c)
        state[r] = st

    # the last call every rank completed (only where every rank has a dump)
    common = None
    if ranks and not missing:
        lasts = [state[r]["last_done"] for r in ranks]
        if all(x is not None for x in lasts):
            seq = min(lasts)
            common = {"seq": seq, "signature": describe_sig(calls[ranks[0]].get(seq, {}))
                      if seq in calls[ranks[0]] else None}

    # how far each rank got: the call it is in, else one past its last recorded call
    def position(r: int) -> int:
        cur = state[r].get("current")
        return cur["seq"] if cur else state[r]["next"]
    front = max((position(r) for r in ranks), default=0)
    # behind: not as far as the furthest, or not inside the call others are stuck in
    stuck_at_front = any("current" in state[r] and position(r) == front for r in ranks)
    behind = [r for r in ranks if position(r) < front
              or (stuck_at_front and "current" not in state[r])]

    # desyncs: a sequence number whose signature differs across ranks
    mismatches = []
    all_seqs = sorted({s for r in ranks for s in sigs[r]})
    for seq in all_seqs:
        here = {r: sigs[r][seq] for r in ranks if seq in sigs[r]}
        if len(set(here.values())) <= 1:
            continue
        # the signature most ranks called; between as many, that of ranks still in their
        # calls rather than of ranks that ended cleanly (one that ended made fewer calls)
        majority = max(Counter(here.values()).items(),
                       key=lambda item: _weight(item, here, state))[0]
        holders = [r for r, s in here.items() if s == majority]
        odd = {}
        for r, s in here.items():
            if s == majority:
                continue
            ref = holders[0]
            kind = "differs"
            if _same_run(sigs[r], sigs[ref], 1, seq) > 0:
                kind = "skipped"       # r's seq k.. are the others' k+1..
            elif _same_run(sigs[ref], sigs[r], 1, seq) > 0:
                kind = "extra"         # the others' k.. are r's k+1..
            odd[r] = {"signature": describe_sig(s), "differs": _differs(s, majority),
                      "kind": kind}
        mismatches.append({"seq": seq, "majority": describe_sig(majority), "ranks": holders,
                           "odd": odd})

    # the chain of waits of the stuck call; a rank that entered it a quarter of the deadline
    # after the first came late
    timeout = max((d.get("timeout") or 0.0) for d in by_rank.values())
    late_after = timeout / 4 if timeout > 0 else 1.0
    chain, culprit, why = _chain(ranks, missing, state, position, size, late_after)
    verdict = None
    if mismatches:
        m = mismatches[0]
        r, o = next(iter(sorted(m["odd"].items())))
        if o["kind"] == "skipped":
            verdict = (f"rank {r} skipped a call: at call {m['seq']} the others called "
                       f"{m['majority']}; rank {r}'s calls from there on are the others' next "
                       f"ones")
            if state[r]["ended"]:
                verdict += (f"; it ended cleanly after its call {state[r]['last_done']}, "
                            f"while the others wait in call {front}")
        elif o["kind"] == "extra":
            verdict = (f"rank {r} made an extra call at call {m['seq']} ({o['signature']}) that "
                       f"the others did not make")
        else:
            verdict = (f"rank {r} called {o['signature']} at call {m['seq']} where ranks "
                       f"{_ranks(m['ranks'])} called {m['majority']} ({_differ(o['differs'])})")
        culprit_rank = r
    else:
        verdict, culprit_rank = why, culprit
    first = dumps[0]
    return {"comm": first["comm"], "kind": first["kind"], "size": size, "ranks": ranks,
            "missing": missing, "last_common_done": common, "behind": behind, "front": front,
            "state": state, "mismatches": mismatches, "chain": chain, "culprit": culprit_rank,
            "verdict": verdict, "ok": not (missing or behind or mismatches or chain
                                           or any("current" in s for s in state.values()))}


def _weight(item: tuple[tuple, int], here: dict[int, tuple], state: dict[int, dict]
            ) -> tuple[int, int, int]:
    """How a signature called by ``item[1]`` ranks ranks as the one the others called: by
    those ranks, then by those of them still in their calls, then by the lowest rank."""
    sig, n = item
    holders = [r for r, s in here.items() if s == sig]
    return n, sum(not state[r]["ended"] for r in holders), -min(holders)


def _waits_on(cur: dict[str, Any], ranks: list[int], size: int) -> list[int]:
    peers = cur.get("peers")
    if peers == "all" or peers is None:
        return [p for p in range(size)]
    recv = [p["rank"] for p in peers if p["kind"] == "recv"]
    return recv or [p["rank"] for p in peers]


def _chain(ranks, missing, state, position, size, late_after: float
           ) -> tuple[list[dict], int | None, str | None]:
    stuck = [r for r in ranks if "current" in state[r]]
    if not stuck:
        if missing:
            return [], missing[0], (f"rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} "
                                    f"wrote no dump (killed, or never reached a dump)")
        return [], None, None
    # start from the stuck rank that is furthest on: it waits on the ones behind
    start = max(stuck, key=lambda r: (position(r), -r))
    chain, seen = [], set()
    r = start
    while True:
        seen.add(r)
        cur = state[r].get("current")
        if cur is None or cur["seq"] < position(start):
            break
        waits = [p for p in _waits_on(cur, ranks, size) if p != r]
        link = {"rank": r, "seq": cur["seq"], "state": cur["state"], "waits_on": waits}
        chain.append(link)
        if not waits:
            # its transfers are complete (or ended in errors): the chain ends here; where
            # others wait on it, it is the one that held them up
            if len(chain) > 1:
                return chain, *_late_words(chain, state, cur["seq"], True, late_after)
            break
        # the first peer that explains the wait: missing, behind, or itself stuck here
        nxt = None
        for p in waits:
            if p in missing:
                return chain, p, (f"rank {p} wrote no dump (killed, or never reached a dump) "
                                  f"and {_who(chain)} wait{'s' if len(chain) == 1 else ''} on "
                                  f"it in call {cur['seq']}")
        for p in waits:
            if position(p) < cur["seq"]:
                return chain, p, _behind_words(p, state, position, chain, cur["seq"])
            if position(p) == cur["seq"] and "current" not in state[p]:
                return chain, p, _behind_words(p, state, position, chain, cur["seq"])
        for p in waits:
            if p not in seen and "current" in state[p] and position(p) == cur["seq"]:
                nxt = p
                break
        if nxt is None and len(chain) > 1:
            return chain, *_late_words(chain, state, cur["seq"], False, late_after)
        if nxt is None:
            break
        r = nxt
    if missing:
        return chain, missing[0], (f"rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} "
                                   f"wrote no dump (killed, or never reached a dump); the "
                                   f"others are in call {position(start)}")
    return chain, None, None


def _late_words(chain, state, seq, dead_end: bool, late_after: float
                ) -> tuple[int | None, str]:
    """The culprit of a chain of waits that no missing or behind rank explains, and the words.
    Every rank of the chain is in the call, so whoever entered it last (by more than
    ``late_after`` s) held the others up: it was stopped or slow before the call, and its
    peers gave the call up before it came. ``dead_end``: the chain ends at a rank with no
    transfer outstanding (the late rank's first step completed at once against the transfers
    its peers had posted long before, or a peer's transfers completed as it gave up);
    otherwise the waits go round. Where no rank entered late, the transfers themselves
    stalled: no culprit."""
    def start(q: int) -> float:
        t = state[q]["current"].get("start")
        return 0.0 if t is None else t
    late = max((c["rank"] for c in chain), key=start)
    # the first to enter: of every rank in the call, not only those on the chain
    first = min(start(q) for q, st in state.items()
                if st.get("current") and st["current"]["seq"] == seq)
    lag = start(late) - first
    how = (f"the waits in call {seq} end at rank {chain[-1]['rank']}, which had nothing "
           f"outstanding when its call ended ({_who(chain)})" if dead_end
           else f"the waits in call {seq} go round ({_who(chain)})")
    if lag <= late_after:
        return None, (f"{how}; every rank entered it within {lag:.1f} s: no rank came late, "
                      f"the transfers themselves stalled")
    return late, (f"{how}; rank {late} entered it last, {lag:.1f} s after the first (it was "
                  f"stopped or slow before the call)")


def _behind_words(p, state, position, chain, seq) -> str:
    last = state[p]["last_done"]
    if "current" in state[p]:
        where = f"it is still in call {position(p)}"
    elif state[p]["ended"]:
        where = (f"it ended cleanly after call {last} and never entered call {seq}: it made "
                 f"fewer calls than the others (it skipped one, or stopped early)")
    else:
        where = f"its last call was call {last}; it never entered call {seq}"
    return f"{_who(chain)} wait{'s' if len(chain) == 1 else ''} in call {seq} on rank {p}: {where}"


def _differ(fields: list[str]) -> str:
    return f"{', '.join(fields)} differ{'s' if len(fields) == 1 else ''}"


def _who(chain: list[dict]) -> str:
    return " -> ".join(f"rank {c['rank']}" for c in chain)


def _ranks(rs: Sequence[int]) -> str:
    return ", ".join(str(r) for r in rs)


def analyse(dumps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for d in dumps:
        groups[(d["comm"], d["size"], d["kind"])].append(d)
    return [analyse_comm(groups[k]) for k in sorted(groups)]


def _peers_words(cur: dict[str, Any]) -> str:
    peers = cur.get("peers")
    if peers == "all" or peers is None:
        return "any rank (MPI runs the call)"
    if not peers:
        return "nothing"
    return ", ".join(f"{p['kind']} rank {p['rank']}" for p in peers)


def story(report: dict[str, Any]) -> str:
    waits_words = ("any rank" if len(c["waits_on"]) > 1 and len(c["waits_on"]) >= report["size"] - 1
                   else "rank " + _ranks(c["waits_on"]) if c["waits_on"] else "nothing"
                   for c in report["chain"])
    lines = [f"communicator c{report['comm']} ({report['kind']} of {report['size']} ranks): "
             f"dumps from ranks {_ranks(report['ranks'])}"
             + (f"; MISSING ranks {_ranks(report['missing'])} (no dump)"
                if report["missing"] else "")]
    common = report["last_common_done"]
    if common is not None:
        lines.append(f"last call every rank completed: call {common['seq']}"
                     + (f" ({common['signature']})" if common["signature"] else ""))
    for r, st in sorted(report["state"].items()):
        last = "none" if st["last_done"] is None else f"call {st['last_done']}"
        text = f"  rank {r} ({st['host']} pid {st['pid']}): last completed {last}"
        if st["ended"]:
            text += "; its program ended cleanly"
        cur = st.get("current")
        if cur is not None:
            text += f"; in call {cur['seq']} ({cur['signature']}): {cur['state']}"
            text += f", waiting on {_peers_words(cur)}"
            if cur.get("error"):
                text += f"; {cur['error'].splitlines()[0][:200]}"
        lines.append(text)
    if report["behind"]:
        lines.append(f"behind: rank{'s' if len(report['behind']) > 1 else ''} "
                     f"{_ranks(report['behind'])} (the others reached call {report['front']})")
    for m in report["mismatches"][:5]:
        lines.append(f"DESYNC at call {m['seq']}: ranks {_ranks(m['ranks'])} called "
                     f"{m['majority']}")
        for r, o in sorted(m["odd"].items()):
            kind = {"skipped": " (rank skipped a call)", "extra": " (an extra call)"}.get(
                o["kind"], "")
            lines.append(f"  rank {r} called {o['signature']}: {_differ(o['differs'])}{kind}")
    if len(report["mismatches"]) > 5:
        lines.append(f"  ... {len(report['mismatches']) - 5} more calls differ")
    if report["chain"]:
        lines.append("waits: " + " ; ".join(
            f"rank {c['rank']} (call {c['seq']}, {c['state']}) waits on {w}"
            for c, w in zip(report["chain"], waits_words, strict=True)))
    if report["verdict"]:
        lines.append(f"=> {report['verdict']}")
    elif report["ok"]:
        lines.append("=> nothing wrong: every rank completed every recorded call")
    return "\n".join(lines)


def merge_timelines(directory: Path, out: Path | None = None) -> Path:
    """Merge every ``timeline-*.json`` in ``directory`` into one trace (``out``, default
    ``directory/timeline.json``), times shifted so the earliest event is at 0."""
    directory = Path(directory)
    files = sorted(p for p in directory.glob("timeline-*.json"))
    if not files:
        raise FileNotFoundError(f"no timeline-*.json in {directory} (was BMLMPI_TIMELINE set "
                                f"to it?)")
    events: list[dict[str, Any]] = []
    dropped = 0
    for f in files:
        doc = json.loads(f.read_text())
        events += doc.get("traceEvents", [])
        dropped += int(doc.get("otherData", {}).get("dropped", 0))
    t0 = min((e["ts"] for e in events if "ts" in e), default=0.0)
    for e in events:
        if "ts" in e:
            e["ts"] -= t0
    target = Path(out) if out is not None else directory / "timeline.json"
    target.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                                  "otherData": {"ranks": len(files), "dropped": dropped,
                                                "epoch_us": t0}}))
    return target


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bmlmpi-trace", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", type=Path, help="the folder holding every rank's dump "
                                                 "(BMLMPI_TRACE_DIR)")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON")
    ap.add_argument("--timeline", action="store_true",
                    help="merge the timeline-*.json files BMLMPI_TIMELINE wrote into one")
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="--timeline: where to write the merged trace (default "
                         "DIR/timeline.json)")
    args = ap.parse_args(argv)
    if args.timeline:
        try:
            out = merge_timelines(args.directory, args.output)
        except FileNotFoundError as exc:
            print(f"bmlmpi-trace: {exc}", file=sys.stderr)
            return 2
        print(f"merged timeline: {out} (open it in https://ui.perfetto.dev)")
        return 0
    dumps = load(args.directory)
    if not dumps:
        print(f"bmlmpi-trace: no flight-recorder dumps (bmlmpi-trace-*.json) in "
              f"{args.directory}", file=sys.stderr)
        return 2
    reports = analyse(dumps)
    if args.json:
        print(json.dumps({"directory": str(args.directory), "dumps": len(dumps),
                          "communicators": reports}, indent=1))
    else:
        print(f"bmlmpi-trace: {len(dumps)} dump{'s' if len(dumps) > 1 else ''} in "
              f"{args.directory}")
        print("\n\n".join(story(r) for r in reports))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
