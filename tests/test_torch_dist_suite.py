"""PyTorch's own ``DistributedTest._DistTestBase`` units, from the installed torch 2.13, run
unchanged against backend ``bmlmpi`` at N = 2, 3 and 4, one launch each
(``tests/frameworks/torch_dist_suite_ranks.py`` under ``bmlmpi-run``; the torch venv of
:mod:`torch_venv`, skipped with the reason where torch cannot be installed): no unit fails or
hangs, every refusal is the one docs/torch.md lists, and the point-to-point, gather, scatter,
coalesced and all-to-all units are among those that pass (torch's CPU all-to-all units run
with torch's backend-name skip "Only MPI supports ..." lifted, as the adapter documents). The
gloo control runs by hand (docs/torch.md: the commands, the counts)."""

from __future__ import annotations

import re

import pytest
from test_torch_backend import LAUNCH_TIMEOUT, launch

#: units that must pass: what the backend serves beyond all_reduce and DDP
MUST_PASS = ("test_send_recv", "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
             "test_gather", "test_scatter", "test_scatter_object_list",
             "test_all_gather_coalesced_simple", "test_all_reduce_coalesced_sum",
             "test_all_reduce_sum", "test_barrier", "test_DistributedDataParallelCPU",
             "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
             "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
             "test_all_to_all_single_unequal_split_full_group")
#: the all-to-all units whose skip the adapter lifts (all that torch has for CPU; the
#: _group ones then skip for needing 8 ranks)
ALL_TO_ALL = 12


@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_own_units(torch_python, n):
    res = launch(torch_python, n, ["-W", "ignore", "tests/frameworks/torch_dist_suite_ranks.py",
                                   "--backend", "bmlmpi", "--unit-timeout", "90"],
                 timeout=LAUNCH_TIMEOUT, env={"BMLMPI_TIMEOUT": "30"})
    out = res.stdout + res.stderr
    tail = out[-6000:]
    units = dict(re.findall(r"^UNIT (\S+) (PASS|FAIL|REFUSED|SKIP|HANG)", res.stdout, re.M))
    bad = {u: o for u, o in units.items() if o in ("FAIL", "HANG")}
    lines = [line for line in res.stdout.splitlines() if line.split()[1:2] and
             line.split()[1] in bad]
    assert not bad, "\n".join(lines) + "\n" + tail
    assert res.returncode == 0, tail
    done = re.search(r"DIST-SUITE DONE (\d+) passed 0 failed (\d+) refused", res.stdout)
    assert done, tail
    for name in MUST_PASS:
        assert units.get(name) == "PASS", f"{name}: {units.get(name)}\n{tail}"
    lifted = re.findall(r"^UNIT (\S+) \S+ \[[^]]*\] LIFTED", res.stdout, re.M)
    assert len(lifted) == ALL_TO_ALL and all("all_to_all" in u for u in lifted), lifted
