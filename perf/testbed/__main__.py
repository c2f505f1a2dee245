"""Command line of the emulated testbed (run from the repository root, as root).

    python -m perf.testbed setup                        # the MPICH venv (/tmp/venv-testbed)
    python -m perf.testbed up bcube 3x3 --rate 200mbit  # or: up fattree 9 --rate 200mbit
    python -m perf.testbed status
    python -m perf.testbed check --algorithm bml        # routes, NIC use, one checked allreduce
    python -m perf.testbed run -- python my_mpi_script.py
    python -m perf.testbed run --per-server 2 -- python my_mpi_script.py  # 2 ranks a server
    python -m perf.testbed counters                     # per-NIC byte counters, JSON
    python -m perf.testbed down
    python -m perf.testbed experiment --rates 100mbit,200mbit
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

from . import counters, mpi, netns


def _sigterm(signum, frame):
    # Turn SIGTERM into the same unwinding as Ctrl-C, so every 'finally' tears down.
    raise KeyboardInterrupt


def cmd_setup(args: argparse.Namespace) -> int:
    print(mpi.setup(force=args.force))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    with netns.lock():
        net = netns.up(args.kind, args.shape, args.rate, cc=args.cc, mtu=args.mtu)
    print(json.dumps({**net.describe(), "rate": args.rate, "cc": args.cc, "mtu": args.mtu}))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    if args.force:
        removed = netns.down()
    else:
        with netns.lock():
            removed = netns.down()
    print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    names = netns.existing_namespaces()
    try:
        st = netns.state()
    except netns.TestbedError:
        st = None
    print(json.dumps({"state": st, "namespaces": sorted(names)}, indent=1))
    return 0


def cmd_counters(args: argparse.Namespace) -> int:
    print(json.dumps(counters.snapshot(), indent=1 if args.pretty else None))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise SystemExit("run: give the rank command after '--', e.g. run -- python x.py")
    with netns.lock():
        proc = mpi.run(netns.current(), argv, timeout=args.timeout, ranks=args.ranks,
                       capture=False, per_server=args.per_server)
    return proc.returncode


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check
    with netns.lock():
        report = check(args.algorithm, args.bytes, timeout=args.timeout)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="create the MPICH venv the ranks run in")
    s.add_argument("--force", action="store_true", help="recreate it from scratch")
    s.set_defaults(func=cmd_setup)
    s = sub.add_parser("up", help="build a topology (removing any earlier one)")
    s.add_argument("kind", choices=["bcube", "fattree"])
    s.add_argument("shape", help="BCube radices level 0 first ('3x3', '2x2x2'); "
                                 "Fat-Tree: server count or the BCube shape of its twin")
    s.add_argument("--rate", default="200mbit", help="link rate, each direction (tc units)")
    netns.link_options(s)
    s.set_defaults(func=cmd_up)
    s = sub.add_parser("down", help="remove every bml- namespace and what runs in it")
    s.add_argument("--force", action="store_true",
                   help="even while another process holds the testbed")
    s.set_defaults(func=cmd_down)
    s = sub.add_parser("status", help="what is up")
    s.set_defaults(func=cmd_status)
    s = sub.add_parser("counters", help="per-NIC byte counters of every namespace, JSON")
    s.add_argument("--pretty", action="store_true")
    s.set_defaults(func=cmd_counters)
    s = sub.add_parser("run", help="run an MPMD mpiexec over the server namespaces")
    s.add_argument("--ranks", type=int, help="default: --per-server on every server")
    s.add_argument("--per-server", type=int, default=1,
                   help="ranks in each server's namespace, consecutive ranks per server "
                        "(sets BMLMPI_RANKS_PER_NODE for hierarchical)")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds, then the job is killed")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_run)
    s = sub.add_parser("check", help="verify routes, per-NIC traffic and one allreduce")
    s.add_argument("--algorithm", default="bml", help="bml, native, ... (default bml)")
    s.add_argument("--bytes", type=int, default=4 << 20)
    s.add_argument("--timeout", type=float, default=120.0)
    s.set_defaults(func=cmd_check)
    # Listed for --help; its own parser (experiment.py) takes the arguments.
    sub.add_parser("experiment", help="the BCube vs Fat-Tree sweep (experiment --help)")
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _sigterm)
    if argv[:1] == ["experiment"]:
        from .experiment import main as experiment
        func, args = (lambda _: experiment(argv[1:])), None
    else:
        args = p.parse_args(argv)
        func = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted; jobs killed (a testbed built by 'up' stays until 'down')",
              file=sys.stderr)
        return 130
    except subprocess.TimeoutExpired as exc:
        print(f"error: timed out after {exc.timeout:.0f} s; the job was killed", file=sys.stderr)
        return 124
    except (netns.TestbedError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
