"""The launcher of an in-process-restartable run on one machine.

torchrun cannot host it: its agent stops every worker of the group as soon as one
exits (a SIGKILLed rank makes it SIGTERM the survivors), which
is the whole-group restart this mode avoids. Here the launcher:

* hosts the two stores in its own process, so that they outlive any rank: the
  trainer's (``MASTER_PORT``; the ranks connect as clients, as under torchrun's agent
  store, ``TORCHELASTIC_USE_AGENT_STORE=True``) and the wrapper's (``MASTER_PORT + 1``);
* starts N + K worker processes (:mod:`.worker`): ranks 0..N-1 train, N..N+K-1 are
  warm spares, torch imported, waiting in the wrapper; with the host allocator
  ``FTFLEET_HOST_ALLOCATOR`` asks for (jemalloc where installed, :mod:`~ftfleet.trainer.hostmem`)
  and glibc's copy threshold (:func:`ftfleet.hostenv.host_memory_env`);
* keeps the world at N ranks (the same trajectory as an uninterrupted run): with fewer
  processes left the ranks wait, inactive, and the launcher stops them (SIGTERM,
  SIGKILL 2 s later) so that the machine restarts at once instead of after the
  wrapper's barrier timeout; ``--min-ranks M`` lets the survivors go on as a smaller
  world of at least M ranks instead (another trajectory);
* is the process its workers must not outlive: each ends (exit 78, taking its own
  children with it) within a second of the launcher's death
  (:mod:`~ftfleet.trainer.resilience.fencing.launcher`);
* waits for all of them and exits with the first nonzero code of a process that was
  not killed by a signal (a killed rank is the failure the others recovered from), or
  1 when every worker was killed.

One launcher per machine is what this covers (tests, drills, a single node); across
nodes the same workers need a store every node reaches (the rendezvous endpoint).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

import torch.distributed as dist

from ftfleet.contract import ContractError
from ftfleet.hostenv import host_memory_env
from ftfleet.trainer.environment import ACTIVE_WORLD_SIZE, LAUNCHER_PID, MIN_ACTIVE_WORLD_SIZE
from ftfleet.trainer.inprocess import MAX_FAILED_STARTS


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the trainer's store and the wrapper's)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ftfleet.trainer.inprocess",
        description="N training processes and K warm spares, restarted in-process on a failure.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="training ranks (the world size)")
    parser.add_argument("--spares", type=int, default=1, help="warm spare processes")
    parser.add_argument("--worker", default="ftfleet.trainer.inprocess.worker", help="the worker's module")
    parser.add_argument("--soft-timeout", type=float, default=60.0, help="seconds without a step: a hang")
    parser.add_argument(
        "--max-failed-starts",
        type=int,
        default=MAX_FAILED_STARTS,
        help="in-process attempts in a row that may fail before their first step, counted in each process; "
        "then that process exits non-zero (the same failure would repeat in place)",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=0.25,
        help="seconds between the wrapper's checks: each process's monitor process, heartbeats "
        "and progress watchdog (default 0.25; at 0.05 the three processes of a 2-rank run with "
        "a spare slowed training by about 4%% on 2 cores)",
    )
    parser.add_argument(
        "--wait-for",
        metavar="FILE",
        help="start warm (torch and the trainer imported), train once FILE exists: a spare node held "
        "until its predecessor is gone",
    )
    parser.add_argument(
        "--min-ranks",
        type=int,
        default=None,
        help="let the world shrink to this many ranks when no spare is left (default: --nproc, "
        "the world never shrinks: the same trajectory as an uninterrupted run)",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the trainer's arguments")
    args = parser.parse_args(argv)
    if args.nproc < 1 or args.spares < 0:
        parser.error(f"--nproc {args.nproc} --spares {args.spares}: use at least 1 rank and 0 or more spares")
    if not 0.01 <= args.poll <= 1:
        parser.error(f"--poll {args.poll}: use 0.01 to 1 second")
    if not args.soft_timeout >= 2:
        parser.error(f"--soft-timeout {args.soft_timeout}: use 2 seconds or more (the wrapper polls every second)")
    if args.max_failed_starts < 1:
        parser.error(f"--max-failed-starts {args.max_failed_starts}: use 1 or more")
    min_ranks = args.nproc if args.min_ranks is None else args.min_ranks
    if not 1 <= min_ranks <= args.nproc:
        parser.error(f"--min-ranks {args.min_ranks}: use 1 to --nproc ({args.nproc})")
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    try:  # the workers' host allocator (FTFLEET_HOST_ALLOCATOR) and glibc tunables, set when they start
        host_memory = host_memory_env()
    except ContractError as exc:
        parser.error(str(exc))
    port = int(os.environ.get("MASTER_PORT") or free_port_pair())
    total = args.nproc + args.spares
    timeout = datetime.timedelta(seconds=300)
    stores = [
        dist.TCPStore("127.0.0.1", p, total, is_master=True, wait_for_workers=False, timeout=timeout)
        for p in (port, port + 1)
    ]
    procs = []
    for rank in range(total):
        env = {
            **os.environ,
            **host_memory,
            "RANK": str(rank),
            "WORLD_SIZE": str(total),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(args.nproc),
            ACTIVE_WORLD_SIZE: str(args.nproc),
            MIN_ACTIVE_WORLD_SIZE: str(min_ranks),
            LAUNCHER_PID: str(os.getpid()),  # a worker ends when this process does
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        cmd = [sys.executable, "-u", "-m", args.worker, "--soft-timeout", str(args.soft_timeout)]
        cmd += ["--poll", str(args.poll), "--max-failed-starts", str(args.max_failed_starts)]
        cmd += ["--wait-for", args.wait_for] if args.wait_for else []
        cmd += rest
        procs.append(subprocess.Popen(cmd, env=env))
        print(f"ftfleet.inprocess: process {rank} pid {procs[-1].pid}", file=sys.stderr, flush=True)

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    stopped, deadline = False, None
    while any(p.poll() is None for p in procs):
        alive = sum(p.poll() is None for p in procs)
        done = sum(p.returncode == 0 for p in procs)  # finished the run: not a lost rank
        if alive + done < min_ranks and not stopped:
            # Too few left to fill N ranks: the wrapper would wait out its barrier timeout
            # (120 s or more) before giving up. Stop now, so that whatever restarts this
            # machine (systemd, the group, a drill) does it at once.
            print(
                f"ftfleet.inprocess: {alive} of {total} processes left, {min_ranks} needed: stopping",
                file=sys.stderr,
                flush=True,
            )
            forward(signal.SIGTERM, None)
            # Not 10 s: a rank still in the failed attempt takes the SIGTERM for a notice
            # and waits on peers that are gone (chaos: a 14.7 s recovery); nothing it could
            # write now is a checkpoint (that needs every rank), the snapshots are kept.
            stopped, deadline = True, time.monotonic() + 2
        if stopped and deadline is not None and time.monotonic() > deadline:
            forward(signal.SIGKILL, None)
            deadline = None  # once
        time.sleep(0.1)
    codes = [p.returncode for p in procs]
    print(f"ftfleet.inprocess: exit codes {codes}", file=sys.stderr, flush=True)
    del stores
    clean = [c for c in codes if c >= 0]
    if not clean:
        return 1
    return next((c for c in clean if c != 0), 0)
