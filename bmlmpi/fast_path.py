"""The blocking allreduce and its fast path (:meth:`bmlmpi.api.Communicator.Allreduce`):
the signatures that passed their first call (:class:`FastCall`), the last one taken
(:class:`Repeat`), and :class:`FastPath`, which runs a blocking call — a later call with
numpy arrays of the same shapes as ``MPI_Allreduce`` itself under the watchdog (native) or
the cached plan's run driven in the calling thread (a schedule), any other through the
communicator's checked path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from . import kernels
from .call_numbers import CallNumbers
from .calls import CollectiveCall, CommunicatorRevoked, RemoteArgumentError
from .execute import DeadlineExceeded, Plan, Run
from .executors import start_allreduce
from .handles import Request
from .recorder import FlightRecorder, Signature
from .recorder import now as _now
from .shm import ShmRun
from .watchdog import Watchdog

#: The ops the fast path hands MPI as they are, by identity (an ``MPI.Op`` is unhashable).
FAST_OPS = {id(op): op for op in (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX)}


class FastCall:
    """A blocking signature that passed its first call (argument check included): later calls
    with numpy arrays of the same shapes, dtypes and op skip the checked path. Native
    (``plan`` None): ``MPI_Allreduce`` directly. A schedule: its :class:`~bmlmpi.execute.Run`
    built straight from the cached ``plan`` and driven in the calling thread.

    Holds no reference to the caller's arrays: numpy refuses ``ndarray.resize()`` in place
    on an array with any reference held elsewhere, weak ones included, and mpi4py leaves
    them resizable. The overlap check (``np.may_share_memory``: byte bounds, ~0.2 µs) runs
    on every call for that reason."""

    __slots__ = ("op", "what", "plan", "name", "calls", "sig", "key", "traced")

    def __init__(self, op: Any, what: str, plan: Plan | None = None, name: str = "",
                 sig: int = 0, key: tuple = (), traced: Signature | None = None):
        self.op = op          # the op object of the key (held, so its id is not reused)
        self.what = what      # native: the watchdog's description; schedule: the Run's label
        self.plan = plan
        self.name = name      # bmlmpi's op name (schedules)
        self.calls = 0        # schedules: calls that took this path
        self.sig = sig        # schedules: the signature's number (its tags, CallNumbers.take_tags)
        self.key = key        # schedules: the plan's key (algorithm, count, dtype, op)
        self.traced = traced  # the flight recorder's signature of these calls

    @staticmethod
    def apart(send: np.ndarray, recv: np.ndarray) -> bool:
        return not np.may_share_memory(send, recv)


class Repeat:
    """The signature of the last blocking call that took the fast path: its entry, op,
    algorithm string, and the arrays' dtype objects and sizes (no reference to the arrays
    themselves, which must stay resizable). A later call with numpy arrays of the same dtype
    objects and sizes, the same op and algorithm, is the same signature: a dtype object is
    immutable (a reassigned ``.dtype``, another byte order: another object, so no match), and
    equal sizes of C-contiguous arrays of one itemsize span as many bytes (a reshaped array
    is the same allreduce; the flags and the overlap are checked on every call)."""

    __slots__ = ("entry", "op", "algorithm", "send_dtype", "recv_dtype", "send_size",
                 "recv_size")

    def __init__(self, entry: FastCall, op: Any, algorithm: str, send: Any,
                 recv: np.ndarray):
        self.entry = entry
        self.op = op
        self.algorithm = algorithm
        self.recv_dtype = recv.dtype
        self.recv_size = recv.size
        if send is MPI.IN_PLACE:
            self.send_dtype = None
            self.send_size = -1
        else:
            self.send_dtype = send.dtype
            self.send_size = send.size


class FastHooks(NamedTuple):
    """What the fast path uses of its communicator (bound methods): whether a fast path may
    be taken now, the checked path, the control channel's check for a call, the flight
    recorder's failure entry, and what a call given up or abandoned leaves behind."""

    fast_open: Callable[[], bool]
    begin: Callable[[Any, Any, Any, str], tuple[CollectiveCall, Request]]
    interrupt: Callable[[int], Callable[[], None]]
    call_failed: Callable[..., None]
    hold: Callable[[Any], None]    # a run given up: cancelled, kept while MPI may use it
    keep: Callable[[Any], None]    # a run MPI may still use: kept (not cancelled)
    gave_up: Callable[[int, DeadlineExceeded], None]


class FastPath:
    """The blocking allreduce of one communicator (``owner``: its ``rank``, ``size`` and
    ``timeout``) on ``comm``; ``enabled`` only for the plain communicator (a variant that
    tracks every call itself takes the checked path for all of them); ``native``: a native
    signature may be ``MPI_Allreduce`` under the watchdog (``BMLMPI_BLOCKING=watchdog``).
    ``active``: the communicator's outstanding calls (a fast path waits for none)."""

    def __init__(self, owner: Any, comm: MPI.Comm, numbers: CallNumbers, plans: Any,
                 active: list, recorder: FlightRecorder | None, watchdog: Watchdog,
                 hooks: FastHooks, *, enabled: bool, native: bool):
        self.owner = owner
        self.comm = comm            # the communicator's data duplicate (rebind() after repair)
        self.numbers = numbers      # the communicator's call numbers and tag slots
        self.plans = plans          # the communicator's PlanCache
        self.active = active
        self.recorder = recorder
        self.watchdog = watchdog
        self.hooks = hooks
        self.fast_open = hooks.fast_open
        self.enabled = enabled
        self.native = native
        self.entries: dict[tuple, FastCall] = {}
        self.repeat: Repeat | None = None
        self.rank, self.size, self.timeout = owner.rank, owner.size, owner.timeout

    def call(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> None:
        """A blocking allreduce: the fast path when this signature may take it, else a
        started call waited on (which may then open the fast path for the signature).

        The last fast call's signature is remembered (:class:`Repeat`): numpy arrays of the
        same dtype objects and sizes, with the same op and algorithm, skip the signature key
        (its tuple and hash). Anything else looks the signature up."""
        rep = self.repeat
        # the test of Repeat's docstring, inline (a call frame is a tenth of this path)
        if (rep is not None and rep.op is op and rep.algorithm is algorithm
                and type(recvbuf) is np.ndarray and not self.active
                and recvbuf.dtype is rep.recv_dtype and recvbuf.size == rep.recv_size
                and (sendbuf is MPI.IN_PLACE if rep.send_dtype is None else
                     type(sendbuf) is np.ndarray
                     and sendbuf.dtype is rep.send_dtype and sendbuf.size == rep.send_size
                     and not np.may_share_memory(sendbuf, recvbuf))):
            entry = rep.entry
        else:
            entry = self.entry(sendbuf, recvbuf, op, algorithm)
        if entry is not None:
            if entry.plan is not None:
                flags = recvbuf.flags
                if (flags.c_contiguous and flags.writeable
                        and (sendbuf is MPI.IN_PLACE or sendbuf.flags.c_contiguous)):
                    self.scheduled(entry, sendbuf, recvbuf)
                    return
                # else the checked path says what is wrong with the buffers
            else:
                # the flight recorder's begin and done, inline (bmlmpi.recorder)
                rec = self.recorder
                if rec is not None:
                    n = rec.next
                    rec.next = n + 1
                    s = rec.slots[n % rec.capacity]
                    s.seq = n
                    s.sig = entry.traced
                    s.t1 = 0.0
                    s.t0 = _now()
                watch = self.watchdog
                numbers = self.numbers
                numbers.take()  # a native call takes no tag slot
                watch.calls += 1
                watch.current = entry.what
                try:
                    self.comm.Allreduce(sendbuf, recvbuf, entry.op)
                except BufferError:
                    # mpi4py refused a buffer (not contiguous, read-only: flags can change
                    # between calls) before anything was sent: the slow path below gives
                    # the same error, and announces it to the others (and records the call)
                    numbers.give_back()
                    if rec is not None:
                        rec.withdraw(s)
                except MPI.Exception as exc:
                    self.hooks.call_failed(s if rec is not None else None, exc)
                    raise
                else:
                    if rec is not None:
                        s.t1 = _now()
                        if rec.timeline is not None:
                            rec.timeline.call(rec, s)
                    return
                finally:
                    watch.current = None
        call, req = self.hooks.begin(sendbuf, recvbuf, op, algorithm)
        req.Wait()
        self.open(call, sendbuf, recvbuf, op, algorithm)

    def open(self, call: CollectiveCall, sendbuf: Any, recvbuf: Any, op: Any,
             algorithm: str) -> None:
        """After the checked first call of a signature (argument check and deadline
        included): open its fast path where one applies."""
        key = self.key(sendbuf, recvbuf, op, algorithm)
        if (key is None or key in self.entries or call.staging is not None
                or not 0 < call.out.size == recvbuf.size):
            return
        sig = call.slot.sig if call.slot is not None else call.traced()
        if call.algorithm != "native":
            plan_key = (call.algorithm, call.out.size, call.out.dtype, call.op)
            plan = self.plans.get(plan_key)
            if plan is not None:
                self.entries[key] = FastCall(op, f"bmlmpi {call.algorithm} allreduce (rank "
                                                 f"{self.rank}", plan, call.op,
                                             self.plans.sig_id(plan_key), plan_key, sig)
        elif self.native and id(op) in FAST_OPS:
            self.entries[key] = FastCall(FAST_OPS[id(op)],
                                         f"bmlmpi native allreduce (blocking MPI_Allreduce of "
                                         f"{recvbuf.size} x {recvbuf.dtype} {call.op}, rank "
                                         f"{self.rank} of {self.size})", traced=sig)
            self.watchdog.start()

    def key(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> tuple | None:
        """The fast path's signature key of a call with numpy arrays; None for any other."""
        if not self.enabled or type(recvbuf) is not np.ndarray:
            return None
        if sendbuf is MPI.IN_PLACE:
            return (algorithm, recvbuf.shape, recvbuf.dtype, None, None, id(op))
        if type(sendbuf) is np.ndarray:
            return (algorithm, recvbuf.shape, recvbuf.dtype, sendbuf.shape, sendbuf.dtype,
                    id(op))
        return None

    def entry(self, sendbuf: Any, recvbuf: Any, op: Any, algorithm: str) -> FastCall | None:
        """The open fast path of this call's signature, if it may take it now (remembered
        for the next call: :class:`Repeat`); None: the checked path."""
        key = self.key(sendbuf, recvbuf, op, algorithm)
        if key is None:
            return None
        entry = self.entries.get(key)
        if (entry is None or not self.fast_open()
                or not (sendbuf is MPI.IN_PLACE or entry.apart(sendbuf, recvbuf))):
            return None  # the checked path (which may open the fast path for the signature)
        self.repeat = Repeat(entry, op, algorithm, sendbuf, recvbuf)
        return entry

    def scheduled(self, entry: FastCall, sendbuf: Any, recvbuf: np.ndarray) -> None:
        """A checked scheduled signature's later blocking call: the Run straight from the
        cached plan, driven here with the executor's deadline (no CollectiveCall, Request or
        resolve). Tags advance as on the checked path, so ranks that take different paths for
        the same call still match."""
        out = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
        src = None if sendbuf is MPI.IN_PLACE else (
            sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1))
        seq, tag_base = self.numbers.take_scheduled(0, entry.sig)
        entry.calls += 1
        what = entry.what
        finish = None
        if entry.name == "avg":
            size = self.size

            def finish() -> None:
                kernels.scale_avg(out, size)
        self.drive(start_allreduce(entry.plan, out, entry.name, tag_base,
                                   lambda: f"{what}, call {seq})", finish, src),
                   seq, entry.traced)

    def drive(self, run: Run | ShmRun, seq: int, traced: Signature) -> None:
        """Drive a fast path's ``run`` (call ``seq``, numbered already) to completion in the
        calling thread under the executor's deadline, entered in the flight recorder (its
        begin and done inline: this is the path of every repeated scheduled call). A
        deadline revokes the communicator as on the checked path."""
        rec = self.recorder
        hooks = self.hooks
        # (a schedule's run costs tens of microseconds: the call frame of begin is noise here)
        s = rec.begin(traced, run) if rec is not None else None
        try:
            run.drive(self.timeout, hooks.interrupt(seq))
        except DeadlineExceeded as exc:
            hooks.call_failed(s, exc, run)
            hooks.keep(run)
            hooks.gave_up(seq, exc)
            raise
        except (RemoteArgumentError, CommunicatorRevoked) as exc:
            hooks.call_failed(s, exc, run)
            hooks.hold(run)
            raise
        except BaseException as exc:
            hooks.call_failed(s, exc, run)
            raise
        if s is not None:
            s.run = None
            s.t1 = _now()
            if rec.timeline is not None:
                rec.timeline.call(rec, s)

    def rebind(self, comm: MPI.Comm) -> None:
        """The communicator moved to ``comm`` (a repair): native calls go there, and every
        scheduled signature's plan is bound to it again."""
        self.comm = comm
        self.repeat = None
        for entry in self.entries.values():
            if entry.plan is not None:
                entry.plan = self.plans.plan(*entry.key)

    def close(self) -> None:
        """Close every fast path (the communicator is freed)."""
        self.entries.clear()
        self.repeat = None
