"""Rank program: the collective family through torch on the fault-tolerant backend, a rank
killed in each call (the contracts of :mod:`bmlmpi.ft.family`, seen through ``torch.distributed``).

Started by ``tests/test_torch_backend.py`` as ``bmlmpi-run --ft --tolerate-lost -n 6 python
tests/frameworks/torch_ft_family_ranks.py`` in the torch venv (never collected by pytest).
Backend ``bmlmpi`` with ``Options(fault_tolerant=True)``; one rank dies in each of the first
four calls, ``before`` (it never starts the call) or ``during`` (it starts it, then SIGKILLs
itself):

====  ============================  ===================  =====================================
call  torch call                    victim (original)    what every survivor must see
====  ============================  ===================  =====================================
0     broadcast from rank 1         1, the root, before  ``RootFailed`` (root 1), tensor as it
                                                         was
1     reduce SUM to rank 0          2, during            the root: the sum over the survivors
                                                         (the victim's input may count: it may
                                                         have delivered it before dying)
2     reduce_scatter_tensor SUM     3, before            its own block (its rank at the call)
                                                         summed over exactly the survivors
3     all_gather_into_tensor        4, before            ``ContributionsLost([4])``; its slot
                                                         and the other survivor's hold their
                                                         data, the victim's zeros
4     broadcast, reduce, all_reduce none                 at 2 ranks (original 0 and 5): exact
====  ============================  ===================  =====================================

After each call ``dist.get_world_size()`` and ``dist.get_rank()`` describe the survivors. Each
survivor prints one ``TORCH-FT-FAMILY`` JSON line: per call, what it raised, whether the
contract held (and why not), the size after it.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

import bmlmpi.torch
from bmlmpi import ft

N = 6
# call -> (victim's original rank, "before" or "during")
KILLS = {0: (1, "before"), 1: (2, "during"), 2: (3, "before"), 3: (4, "before")}


def data(n: int, orig: int, call: int) -> torch.Tensor:
    """Position-, original rank- and call-dependent integers, exact in float64 sums."""
    i = torch.arange(n, dtype=torch.float64)
    return (i * 7 + orig * 3 + call) % 11 + orig * 1000 + call * 100_000


def total(n: int, origs, call: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.float64)
    for o in origs:
        out += data(n, o, call)
    return out


def start(call: int, members: list[int], me: int):
    """Start call ``call`` (async); returns (its work or None, what the check needs)."""
    size, rank = len(members), members.index(me)
    if call == 0:
        t = data(41, me, call)
        return dist.broadcast(t, src=1, async_op=True), {"t": t, "before": t.clone()}
    if call == 1:
        t = data(200_003, me, call)  # large: the victim dies with its part still unsent
        return dist.reduce(t, dst=0, op=dist.ReduceOp.SUM, async_op=True), {"t": t}
    if call == 2:
        m = 13
        out = torch.full((m,), -1.0, dtype=torch.float64)
        work = dist.reduce_scatter_tensor(out, data(m * size, me, call), async_op=True)
        return work, {"out": out, "m": m, "rank": rank}
    m = 11
    out = torch.full((m * size,), -1.0, dtype=torch.float64)
    return dist.all_gather_into_tensor(out, data(m, me, call), async_op=True), {"out": out,
                                                                                "m": m}


def check(call: int, members: list[int], me: int, state: dict, error) -> str | None:
    """None when this survivor's result keeps the contract, else what is wrong. ``members``
    are the ranks the call was made with: they may hold the previous call's victim, which
    that call committed without noticing (it died after delivering its part)."""
    victim = KILLS[call][0]
    dead = {v for c, (v, _) in KILLS.items() if c <= call}
    alive = [o for o in members if o not in dead]
    if call == 0:
        if not isinstance(error, ft.RootFailed) or error.root != victim:
            return f"the root died before the broadcast, but it raised {error!r}"
        if not torch.equal(state["t"], state["before"]):
            return "broadcast raised RootFailed but changed the tensor"
        return None
    if call == 3:
        if not isinstance(error, ft.ContributionsLost) or list(error.lost) != [victim]:
            return f"the all_gather lost rank {victim}'s part, but it raised {error!r}"
        m, out = state["m"], state["out"]
        for i, o in enumerate(members):
            slot = out[i * m:(i + 1) * m]
            want = torch.zeros(m, dtype=torch.float64) if o == victim else data(m, o, call)
            if not torch.equal(slot, want):
                return f"slot {i} (original rank {o}) holds {slot[:3].tolist()}, not {want[:3]}"
        return None
    if error is not None:
        return f"raised {error!r}"
    if call == 1:
        if me != members[0]:
            return None
        n = state["t"].numel()
        if any(torch.equal(state["t"], total(n, s, call)) for s in (alive, [*alive, victim])):
            return None
        return f"the root holds {state['t'][:3].tolist()}, no sum over the survivors"
    m, rank = state["m"], state["rank"]
    want = total(m * len(members), alive, call)[rank * m:(rank + 1) * m]
    if not torch.equal(state["out"], want):
        return f"block {rank}: {state['out'][:3].tolist()}, not {want[:3].tolist()}"
    return None


def after(me: int) -> str | None:
    """The 2 survivors (original 0 and 5) go on: all_reduce (which recovers from the last
    victim if call 3 committed without noticing it), broadcast, reduce, exact."""
    t = data(29, me, 4)
    dist.all_reduce(t)
    if not torch.equal(t, total(29, [0, 5], 4)):
        return f"all_reduce after the losses: {t[:3].tolist()}"
    if (dist.get_world_size(), dist.get_rank()) != (2, [0, 5].index(me)):
        return f"world {dist.get_world_size()} rank {dist.get_rank()} after four losses"
    t = data(29, me, 5)
    dist.broadcast(t, src=1)
    if not torch.equal(t, data(29, 5, 5)):
        return "broadcast at 2 ranks"
    t = data(29, me, 6)
    dist.reduce(t, dst=0)
    if me == 0 and not torch.equal(t, total(29, [0, 5], 6)):
        return "reduce at 2 ranks"
    return None


def main() -> int:
    ft.install_exit_handlers()
    pg = bmlmpi.torch.init_process_group(options=bmlmpi.torch.Options(
        fault_tolerant=True, hang_timeout=20, timeout=60))
    me = dist.get_rank()
    if dist.get_world_size() != N:
        raise SystemExit(f"start {N} ranks, not {dist.get_world_size()}")
    results = []
    for call, (victim, when) in KILLS.items():
        members = list(pg.communicator.survivors)
        if me == victim and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        work, state = start(call, members, me)
        if me == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            work.wait()
            error = None
        except ft.FaultToleranceError as exc:
            error = exc
        why = check(call, members, me, state, error)
        results.append({"call": call, "ok": why is None, "why": why,
                        "raised": type(error).__name__ if error is not None else None,
                        "size": dist.get_world_size(), "failed": list(pg.failed)})
    why = after(me)
    results.append({"call": 4, "ok": why is None, "why": why, "raised": None,
                    "size": dist.get_world_size(), "failed": list(pg.failed)})
    print("TORCH-FT-FAMILY " + json.dumps({"survivor": me, "results": results}), flush=True)
    ft.finish(0)


if __name__ == "__main__":
    sys.exit(main())
