"""``all_to_all_single`` and ``all_to_all`` of backend ``bmlmpi`` against backend ``gloo`` on the
same inputs; their refusals.

:func:`checks` runs inside ``tests/frameworks/torch_ranks.py`` (one launch per N = 2, 3, 4 of
``tests/test_torch_backend.py``); run alone (``bmlmpi-run -n N python
tests/frameworks/torch_alltoall_ranks.py``) it makes its own groups and prints the same
``CHECK`` lines. Every element depends on the sender, the receiver, its row and its column, so a
block delivered to the wrong rank or the wrong place fails; comparisons are exact (integers and
small-integer floats).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from alone import run_alone

import bmlmpi
import bmlmpi.torch
from bmlmpi.torch import Options, UnsupportedCall

WIDTH = 3   # columns of a row: all_to_all_single cuts along dim 0, a row is WIDTH elements


def rows(count: int, dtype: torch.dtype, src: int, dst: int, salt: int = 0) -> torch.Tensor:
    """The ``count`` rows ``src`` sends ``dst``: small integers of both ranks, row and column."""
    i = torch.arange(count * WIDTH, dtype=torch.int64).view(count, WIDTH)
    v = (i * 7 + src * 17 + dst * 5 + salt * 3) % 29 - 9
    return v.to(dtype)


def uneven(src: int, dst: int, n: int) -> int:
    """Rows ``src`` sends ``dst`` in the uneven case: 0 to 4, zeros included, not symmetric."""
    return (src * 3 + dst * 5 + n) % 5


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def single(rank: int, n: int, gloo, groups: dict, check: Callable) -> None:
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float64):
        # equal split (no split sizes): k rows to every rank
        for k in (0, 1, 5):
            x = torch.cat([rows(k, dtype, rank, j) for j in range(n)])
            want = torch.cat([rows(k, dtype, i, rank) for i in range(n)])
            got = {}
            for name, grp in (("bmlmpi", None), ("gloo", gloo)):
                out = torch.full((n * k, WIDTH), -99, dtype=torch.int64).to(dtype)
                dist.all_to_all_single(out, x, group=grp)
                got[name] = out
            check(f"all_to_all_single_equal[{k},{dtype}]",
                  same(got["bmlmpi"], want) and same(got["bmlmpi"], got["gloo"]))
        # uneven split sizes, zeros among them, with async_op
        sends = [uneven(rank, j, n) for j in range(n)]
        recvs = [uneven(i, rank, n) for i in range(n)]
        x = torch.cat([rows(sends[j], dtype, rank, j, salt=1) for j in range(n)])
        want = torch.cat([rows(recvs[i], dtype, i, rank, salt=1) for i in range(n)])
        got = {}
        for name, grp in (("bmlmpi", None), ("gloo", gloo)):
            out = torch.full((sum(recvs), WIDTH), -99, dtype=torch.int64).to(dtype)
            work = dist.all_to_all_single(out, x, recvs, sends, group=grp, async_op=True)
            future = work.get_future()
            work.wait()
            got[name] = out
            if name == "bmlmpi":
                held = future.wait()
                check(f"all_to_all_single_future[{dtype}]",
                      len(held) == 1 and held[0] is out, str(type(held)))
        check(f"all_to_all_single_uneven[{dtype}]",
              same(got["bmlmpi"], want) and same(got["bmlmpi"], got["gloo"]),
              f"sends {sends} recvs {recvs}")
    # each all-to-all algorithm as a group's own, uneven sizes
    sends = [uneven(rank, j, n) for j in range(n)]
    recvs = [uneven(i, rank, n) for i in range(n)]
    x = torch.cat([rows(sends[j], torch.int64, rank, j, salt=2) for j in range(n)])
    want = torch.cat([rows(recvs[i], torch.int64, i, rank, salt=2) for i in range(n)])
    for gname, grp in groups.items():
        out = torch.full((sum(recvs), WIDTH), -99, dtype=torch.int64)
        dist.all_to_all_single(out, x, recvs, sends, group=grp)
        check(f"all_to_all_single_uneven[{gname}]", same(out, want))
    # a non-contiguous output (gloo takes contiguous ones only), complex and bfloat16 tensors
    out = torch.full((WIDTH, 2 * n), -99, dtype=torch.int64).t()
    dist.all_to_all_single(out, torch.cat([rows(2, torch.int64, rank, j, salt=3)
                                           for j in range(n)]).t().contiguous().t())
    check("all_to_all_single_non_contiguous",
          same(out, torch.cat([rows(2, torch.int64, i, rank, salt=3) for i in range(n)])))
    for dtype in (torch.complex64, torch.bfloat16):
        x = torch.cat([rows(2, torch.float32, rank, j, salt=4) for j in range(n)])
        if dtype.is_complex:
            x = torch.complex(x, -2 * x)
        x = x.to(dtype)
        got = {}
        for name, grp in (("bmlmpi", None), ("gloo", gloo)):
            out = torch.zeros(2 * n, WIDTH, dtype=dtype)
            dist.all_to_all_single(out, x, group=grp)
            got[name] = out
        want = torch.cat([rows(2, torch.float32, i, rank, salt=4) for i in range(n)])
        if dtype.is_complex:
            want = torch.complex(want, -2 * want)
        check(f"all_to_all_single[{dtype}]",
              same(got["bmlmpi"], want.to(dtype)) and same(got["bmlmpi"], got["gloo"]))


def listed(rank: int, n: int, gloo, check: Callable) -> None:
    """The list form: tensors of a size that depends on both ranks, shapes of their own."""
    for dtype in (torch.int64, torch.float32):
        ins = [rows(uneven(rank, j, n), dtype, rank, j, salt=5) for j in range(n)]
        want = [rows(uneven(i, rank, n), dtype, i, rank, salt=5) for i in range(n)]
        outs = [torch.full((uneven(i, rank, n), WIDTH), -99, dtype=torch.int64).to(dtype)
                for i in range(n)]
        dist.all_to_all(outs, ins)
        # gloo's list form takes tensors of one size only: its all_to_all_single on the
        # same rows is the control
        ctrl = torch.full((sum(len(w) for w in want), WIDTH), -99, dtype=torch.int64).to(dtype)
        dist.all_to_all_single(ctrl, torch.cat(ins), [len(w) for w in want],
                               [len(t) for t in ins], group=gloo)
        check(f"all_to_all_list_uneven[{dtype}]",
              all(same(o, w) for o, w in zip(outs, want, strict=True))
              and same(torch.cat(outs), ctrl))
        ins = [rows(2, dtype, rank, j, salt=6) for j in range(n)]
        got = {}
        for name, grp in (("bmlmpi", None), ("gloo", gloo)):
            outs = [torch.full((2, WIDTH), -99, dtype=torch.int64).to(dtype) for _ in range(n)]
            dist.all_to_all(outs, ins, group=grp)
            got[name] = outs
        check(f"all_to_all_list[{dtype}]",
              all(same(o, rows(2, dtype, i, rank, salt=6)) and same(o, c)
                  for i, (o, c) in enumerate(zip(got["bmlmpi"], got["gloo"], strict=True))))
    ins = [torch.arange(4, dtype=torch.int32).view(2, 2) + 100 * rank + 10 * j for j in range(n)]
    outs = [torch.full((4,), -1, dtype=torch.int32) for _ in range(n)]
    work = dist.all_to_all(outs, ins, async_op=True)
    work.wait()
    check("all_to_all_list_async_reshaped",
          all(same(o, torch.arange(4, dtype=torch.int32) + 100 * i + 10 * rank)
              for i, o in enumerate(outs)))


def refusals(rank: int, n: int, check: Callable) -> None:
    """One rank's bad split sizes: it raises UnsupportedCall naming them, every other rank
    bmlmpi's RemoteArgumentError naming it; then the group goes on."""
    def refused(name: str, call: Callable, error: type, says: str) -> None:
        try:
            call()
        except error as exc:
            check(name, says in str(exc), str(exc)[:200])
        except Exception as exc:  # noqa: BLE001 - the wrong error is the failure
            check(name, False, f"{type(exc).__name__}: {str(exc)[:200]}")
        else:
            check(name, False, "not refused")

    x = torch.zeros(n, WIDTH)
    if rank == 0:
        refused("all_to_all_single_bad_split_sizes",
                lambda: dist.all_to_all_single(torch.zeros(n, WIDTH), x, [1] * n,
                                               [2] + [1] * (n - 1)),
                UnsupportedCall, f"add up to {n + 1} rows")
    else:
        refused("all_to_all_single_bad_split_sizes_elsewhere",
                lambda: dist.all_to_all_single(torch.zeros(n, WIDTH), x, [1] * n, [1] * n),
                bmlmpi.RemoteArgumentError, "rank(s) [0]")
    refused("all_to_all_single_indivisible",
            lambda: dist.all_to_all_single(torch.zeros(n + 1), torch.zeros(n + 1)),
            UnsupportedCall, "do not divide")
    refused("all_to_all_list_length",
            lambda: dist.all_to_all([torch.zeros(1)] * (n + 1), [torch.zeros(1)] * (n + 1)),
            UnsupportedCall, f"for a group of {n}")
    # the pairs disagree (rank 1 expects one row more from rank 0 than rank 0 sends)
    if n > 1:
        recvs = [1 + (rank == 1 and i == 0) for i in range(n)]
        refused("all_to_all_single_pairs_disagree",
                lambda: dist.all_to_all_single(torch.zeros(sum(recvs)), torch.zeros(n),
                                               recvs, [1] * n),
                bmlmpi.ArgumentMismatch, "rank 0 sends 1 elements to rank 1")
    out = torch.zeros(n, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(n, dtype=torch.int64) + 10 * rank)
    check("all_to_all_single_after_refusals",
          same(out, torch.arange(n, dtype=torch.int64) * 10 + rank))


def algorithm_groups() -> dict:
    return {alg: dist.new_group(backend="bmlmpi", pg_options=Options(algorithm=alg))
            for alg in ("pairwise", "bruck", "bcube")}


def checks(rank: int, n: int, gloo, check: Callable) -> None:
    single(rank, n, gloo, algorithm_groups(), check)
    listed(rank, n, gloo, check)
    refusals(rank, n, check)
    dist.barrier()


if __name__ == "__main__":
    sys.exit(run_alone("TORCH-ALLTOALL", checks))
