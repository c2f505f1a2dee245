"""Launching a rank program under ``bmlmpi-run [--ft]`` for the failure tests: one hard timeout
per launch (a hang fails the test, it never stalls the suite) and the JSON records the ranks
print, one per line after a marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def launch_spec(program: str, spec: dict, n: int, marker: str, *, timeout: float,
              ft: bool = True, env: dict[str, str] | None = None
              ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``program`` (relative to the repository) on ``n`` ranks with ``spec`` as its one
    argument; returns the finished process and the records of the lines starting ``marker``.
    The job's own algorithm and BCube settings are cleared, calibration is off. The programs
    kill ranks on purpose: ``--tolerate-lost`` keeps those from failing the job, so its exit
    status says whether the survivors ended well. ``env``: variables added for the job."""
    cmd = [sys.executable, "-m", "bmlmpi.cli.launch", *(["--ft", "--tolerate-lost"] if ft else []),
           "-n", str(n),
           sys.executable, program, json.dumps(spec)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BMLMPI_CALIBRATE": "0", **(env or {})}
    env.pop("BMLMPI_ALGORITHM", None)
    env.pop("BMLMPI_BCUBE", None)
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{n} ranks did not finish within {timeout} s (a hang):\n{out[-4000:]}")
    records = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
               if line.startswith(marker + " ")]
    return res, records
