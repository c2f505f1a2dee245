"""The heartbeat fences hung processes and notices vanished ones (no MPI: real processes)."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from bmlmpi.ft.heartbeat import Heartbeat

CHILD = """
import os, signal, sys, time
from bmlmpi.ft.heartbeat import Heartbeat
hb = Heartbeat(sys.argv[1], 1, 0.05, 100.0)
mode = sys.argv[2]
print("ready", flush=True)
if mode == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
elif mode == "exit1":
    os._exit(1)
time.sleep(float(sys.argv[3]))
hb.close()
"""


def child(token: str, mode: str, seconds: float = 0.0) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", CHILD, token, mode, str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def wait_until(cond, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def token():
    return f"test-{uuid.uuid4().hex[:12]}"


def test_a_stopped_peer_is_fenced(token):
    p = child(token, "stop")
    hb = Heartbeat(token, 0, 0.05, 0.5)
    hb.watch([0, 1])
    try:
        with hb.watching():
            assert wait_until(lambda: p.poll() is not None, 15), "the stopped child lives on"
        assert p.returncode == -9
        assert 1 in hb.fenced and not hb.vanished
    finally:
        if p.poll() is None:
            p.kill()
        hb.close()


def test_a_beating_peer_is_left_alone_and_nobody_is_judged_outside_waits(token):
    p = child(token, "sleep", 2.0)
    hb = Heartbeat(token, 0, 0.05, 0.5)
    hb.watch([1])
    try:
        with hb.watching():
            time.sleep(1.5)
        assert p.poll() is None and not hb.fenced
        p.send_signal(19)  # SIGSTOP: stale from now on, but no wait is in progress
        time.sleep(1.5)
        assert p.poll() is None and not hb.fenced
    finally:
        p.kill()
        p.wait()
        hb.close()


def test_a_peer_gone_unreported_is_noticed_after_a_grace(token):
    p = child(token, "exit1")
    p.wait()
    hb = Heartbeat(token, 0, 0.05, 0.4)
    hb.watch([1])
    try:
        with hb.watching():
            assert wait_until(lambda: 1 in hb.vanished, 10)
        assert "process is gone" in hb.vanished[1] and not hb.fenced
    finally:
        hb.forget([1])
        hb.close()


def test_a_recycled_pid_is_never_killed(token):
    # a stale record naming a live process whose start time differs: not the same process
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    hb = Heartbeat(token, 0, 0.05, 0.3)
    try:
        import struct
        path = os.path.join(hb.folder, "1")
        with open(path, "wb") as f:
            f.write(struct.pack("<qq64s", bystander.pid, 1, hb.host.encode()))
            f.write(struct.pack("<d", time.monotonic() - 100))
        hb.watch([1])
        with hb.watching():
            assert wait_until(lambda: 1 in hb.vanished, 10)
        assert bystander.poll() is None and not hb.fenced
    finally:
        bystander.kill()
        bystander.wait()
        hb.forget([1])
        hb.close()


def test_bad_periods():
    with pytest.raises(ValueError):
        Heartbeat("x", 0, 0.0, 1.0)
