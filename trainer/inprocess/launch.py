"""The launcher of an in-process-restartable run: one per machine.

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

Across nodes (``--nnodes``, ``--spare-nodes``) one launcher runs on each machine, the
stores live with one of them or with a coordinator's ``--nproc 0 --host-stores``, and
the job runs in rounds (:mod:`.stores`). When a round stops (no spare left to take a
lost rank), a launcher (``--rejoin``, the default across nodes) does not exit: it
stops its workers and joins the next round with processes it started
``--warm-after`` seconds into the round, warm (torch and the trainer imported, the
worker's ``--assign-from-stdin``), which learn their place when the round forms; a
launcher that finds a round formed without it warms its processes while it waits. The
next round's restore comes from the snapshots in the nodes' shared memory (from the fast
tier when the world changed shape: :mod:`.resize`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from ftfleet.contract import EXIT_OK, EXIT_PREEMPTED, ContractError
from ftfleet.hostenv import host_memory_env
from ftfleet.trainer.environment import (
    ACTIVE_WORLD_SIZE,
    GROUP_SIZE,
    INPROCESS_LAYOUT,
    INPROCESS_RANK_FILE,
    LAUNCHER_PID,
    MIN_ACTIVE_WORLD_SIZE,
    WARM_READY_FILE,
)
from ftfleet.trainer.inprocess import MAX_FAILED_STARTS
from ftfleet.trainer.inprocess.ranks import Layout
from ftfleet.trainer.inprocess.resize import RESIZE_REASON
from ftfleet.trainer.inprocess.stores import (
    SETTLE_S,
    STORE_WAIT_S,
    StoreHost,
    connect,
    join,
    round_key,
    stop_reason,
    wrapper_port,
)
from ftfleet.trainer.inprocess.worker import Assignment

#: Seconds after a round's processes start before the launcher starts the next round's,
#: warm: past the round's own start (imports, process groups, the first snapshots and
#: saves), which needs the same CPUs and, on a loaded machine, meets its collective
#: timeouts only just.
WARM_AFTER_S = 60.0
#: How long a node waiting for the next round waits for its warm processes before it
#: counts itself as waiting anyway (a GPU node's first CUDA context takes seconds).
WARM_READY_WAIT_S = 300.0
#: Seconds a resize's ranks have to leave on their own before the launcher's SIGTERM.
RESIZE_EXIT_S = 10.0


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ftfleet.trainer.inprocess",
        description="N training processes and K warm spares per node, restarted in-process on a failure.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="training processes on each node")
    parser.add_argument(
        "--spares", type=int, default=None, help="warm spare processes on each node (default 1; 0 with --nproc 0)"
    )
    parser.add_argument("--nnodes", type=int, default=1, help="training nodes (one launcher each)")
    parser.add_argument(
        "--spare-nodes",
        type=int,
        default=0,
        help="warm spare nodes: launchers whose processes wait, warm, and take a lost node's ranks together",
    )
    parser.add_argument(
        "--node-rank",
        default="0",
        help="this launcher's node: 0 .. --nnodes - 1 train, the next --spare-nodes are spares; `auto` takes the "
        "next free slot in the job's store (the first nodes to register train; a node that finds the job full "
        "waits for its next round)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="with --node-rank auto: seconds a round waits for spare nodes once its training nodes are there "
        "(default 10); later ones join the next round",
    )
    parser.add_argument(
        "--master-addr",
        default=None,
        help="where the job's stores live (default: MASTER_ADDR, else 127.0.0.1); every node must reach it",
    )
    parser.add_argument(
        "--host-stores",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="host the job's two stores in this launcher (default: on node 0); a store that must outlive "
        "every node belongs on the coordinator: a launcher there with --nproc 0 hosts them and trains nothing",
    )
    parser.add_argument("--worker", default="ftfleet.trainer.inprocess.worker", help="the worker's module")
    parser.add_argument("--soft-timeout", type=float, default=60.0, help="seconds without a step: a hang")
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="seconds without a process's heartbeat before it counts as gone: how soon a lost node's ranks "
        "are replaced (default: half the soft timeout, at least 5 s; at least 4 polls and 1 s)",
    )
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
        help="let the world shrink to this many ranks when no spare is left (default: every training "
        "node's ranks, the world never shrinks: the same trajectory as an uninterrupted run)",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=1,
        help="with --min-ranks: the world shrinks by whole blocks of this many consecutive ranks, the "
        "survivors of a broken block waiting as spares (HSDP: world / parallel.replicas, so that the "
        "replica groups left stay whole)",
    )
    parser.add_argument(
        "--rejoin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="when the job stops for want of a spare, stay and join its next round with processes started "
        "warm while the round trained (default: when the job spans nodes); --no-rejoin exits 1 and leaves "
        "the restart to the fleet",
    )
    parser.add_argument(
        "--warm-after",
        type=float,
        default=WARM_AFTER_S,
        help="with --rejoin: seconds into a round before the next round's processes start warming up "
        f"(default {WARM_AFTER_S:g}: not while the round's own processes start, on the same CPUs)",
    )
    parser.add_argument(
        "--max-rounds", type=int, default=100, help="rounds this launcher joins before it exits (default 100)"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the trainer's arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    stores_only = args.nproc == 0
    if args.spares is None:
        args.spares = 0 if stores_only else 1
    if args.nproc < 0 or args.spares < 0 or args.nnodes < 1 or args.spare_nodes < 0:
        parser.error(
            f"--nproc {args.nproc} --spares {args.spares} --nnodes {args.nnodes} --spare-nodes {args.spare_nodes}: "
            "use at least 1 process per node (0 only to host the stores) and 1 node, 0 or more spares"
        )
    node_rank = None if args.node_rank == "auto" else int(args.node_rank) if args.node_rank.isdigit() else -1
    if not stores_only and node_rank is not None and not 0 <= node_rank < args.nnodes + args.spare_nodes:
        parser.error(f"--node-rank {args.node_rank}: use 0 to {args.nnodes + args.spare_nodes - 1}, or auto")
    if not 0.01 <= args.poll <= 1:
        parser.error(f"--poll {args.poll}: use 0.01 to 1 second")
    if not args.soft_timeout >= 2:
        parser.error(f"--soft-timeout {args.soft_timeout}: use 2 seconds or more (the wrapper polls every second)")
    if args.max_failed_starts < 1:
        parser.error(f"--max-failed-starts {args.max_failed_starts}: use 1 or more")
    if not 0 <= args.warm_after <= 3600:
        parser.error(f"--warm-after {args.warm_after}: use 0 to 3600 seconds")
    if args.max_rounds < 1:
        parser.error(f"--max-rounds {args.max_rounds}: use 1 or more")
    if args.heartbeat_timeout is not None and not (
        max(1.0, 4 * args.poll) <= args.heartbeat_timeout < args.soft_timeout + 60
    ):
        parser.error(
            f"--heartbeat-timeout {args.heartbeat_timeout}: use at least 1 s and 4 polls ({4 * args.poll:g} s), "
            "below the soft timeout + 60 s"
        )
    nodes = args.nnodes + args.spare_nodes
    per_node = args.nproc + args.spares
    if args.settle is None:
        args.settle = SETTLE_S
    elif not 0 <= args.settle <= 3600:
        parser.error(f"--settle {args.settle}: use 0 to 3600 seconds")
    if stores_only:
        if not args.host_stores:
            parser.error("--nproc 0 trains nothing: add --host-stores (a coordinator hosting the job's stores)")
        if args.spares:
            parser.error(f"--nproc 0 --spares {args.spares}: a launcher that hosts the stores alone starts no process")
    else:
        layout = Layout(args.nnodes, args.spare_nodes, args.nproc, args.spares)
        min_ranks = layout.active if args.min_ranks is None else args.min_ranks
        if not 1 <= min_ranks <= layout.active:
            parser.error(f"--min-ranks {args.min_ranks}: use 1 to {layout.active} (every training node's ranks)")
        if args.group_size < 1 or layout.active % args.group_size or min_ranks % args.group_size:
            parser.error(
                f"--group-size {args.group_size}: use a divisor of the training ranks ({layout.active}) and of "
                f"--min-ranks ({min_ranks})"
            )
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    try:  # the workers' host allocator (FTFLEET_HOST_ALLOCATOR) and glibc tunables, set when they start
        host_memory = host_memory_env()
    except ContractError as exc:
        parser.error(str(exc))
    addr = args.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    host = node_rank == 0 if args.host_stores is None else args.host_stores
    if not (host or os.environ.get("MASTER_PORT")):
        parser.error("MASTER_PORT is unset: a launcher that does not host the stores must be told their port")
    port = int(os.environ.get("MASTER_PORT") or free_port_pair())
    stores = StoreHost(port) if host else None
    try:
        watch = connect(addr, port)
    except (RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"error: the job's stores at {addr}:{port} are out of reach after {STORE_WAIT_S:.0f} s ({first}): "
            "start the launcher that hosts them (--host-stores, on the coordinator) first, or fix --master-addr",
            file=sys.stderr,
        )
        return 1
    if stores_only:
        return serve(stores)
    rejoin = nodes > 1 if args.rejoin is None else args.rejoin
    base_env = {
        **os.environ,
        **host_memory,
        LAUNCHER_PID: str(os.getpid()),  # a worker ends when this process does
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    base_cmd = [sys.executable, "-u", "-m", args.worker, "--soft-timeout", str(args.soft_timeout)]
    base_cmd += ["--poll", str(args.poll), "--max-failed-starts", str(args.max_failed_starts)]
    base_cmd += ["--wait-for", args.wait_for] if args.wait_for else []
    base_cmd += ["--heartbeat-timeout", str(args.heartbeat_timeout)] if args.heartbeat_timeout else []
    if stores is not None:  # the next round opens after a stop (a coordinator does this in serve)
        threading.Thread(target=stores.serve, args=([],), name="ftfleet-rounds", daemon=True).start()
    warm: list[subprocess.Popen] = []

    def start_warm(ready: list[str] | None = None) -> list[subprocess.Popen]:
        started = [warm_process(base_cmd, base_env, rest, ready[i] if ready else None) for i in range(per_node)]
        pids = " ".join(str(p.pid) for p in started)
        print(f"ftfleet.inprocess: warm for the next round: pids {pids}", file=sys.stderr, flush=True)
        return started

    def warm_while_waiting() -> None:
        # A node that waits for the next round (booted while one runs) joins it warm, and
        # counts itself as waiting (a smaller world ends its round for it) once it is.
        if warm:
            return
        ready = [os.path.join(noted, f"ready{i}") for i in range(per_node)]
        warm.extend(start_warm(ready))
        if not wait_warm(warm, ready):
            print("ftfleet.inprocess: warm processes not all ready; waiting anyway", file=sys.stderr, flush=True)

    noted = tempfile.mkdtemp(prefix="ftfleet-ranks-")  # each worker's rank, for the next round's slot
    prefer = None
    try:
        for rounds in range(1, args.max_rounds + 1):
            round_, node, spare_nodes = join(
                watch,
                args.nnodes,
                args.spare_nodes,
                node_rank,
                settle_s=args.settle,
                prefer=prefer,
                on_wait=warm_while_waiting,
            )
            layout = Layout(args.nnodes, spare_nodes, args.nproc, args.spares)  # the spare nodes this round has
            nodes = layout.nodes
            print(f"ftfleet.inprocess: round {round_}, node {node} of {nodes}", file=sys.stderr, flush=True)
            procs = []
            wport, key = wrapper_port(port, round_), round_key(round_, "stop")
            for local in range(per_node):
                place = round_env(layout, node, local, args.nproc, min_ranks, args.group_size)
                place[INPROCESS_RANK_FILE] = os.path.join(noted, f"local{local}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(place[INPROCESS_RANK_FILE])  # the round before's
                proc = hand_over(warm, Assignment(place, wport, key)) if warm else None
                if proc is None:
                    cmd = [*base_cmd, "--wrapper-port", str(wport), "--stop-key", key, *rest]
                    proc = subprocess.Popen(cmd, env={**base_env, **place})
                procs.append(proc)
                # One line per process, "process RANK pid PID": what drills and benches parse.
                print(f"ftfleet.inprocess: process {place['RANK']} pid {proc.pid}", file=sys.stderr, flush=True)
            again = rejoin and rounds < args.max_rounds
            prepare = start_warm if again else None
            end = supervise(procs, watch, round_, min_ranks if nodes == 1 else None, prepare, args.warm_after)
            warm = end.warm
            prefer = held_slot(noted, per_node, args.nproc, layout.active)
            why = rejoin_reason(end)
            if not (again and why):
                break
            if why == EMERGENCY:  # every node's ranks stopped at once: the round is over
                with contextlib.suppress(RuntimeError):
                    watch.compare_set(round_key(round_, "stop"), "", why)
            print(
                f"ftfleet.inprocess: round {round_}: {why}; this node joins the next one", file=sys.stderr, flush=True
            )
    finally:
        for proc in warm:  # end of input: a warm process that is not needed exits
            _close(proc)
        shutil.rmtree(noted, ignore_errors=True)
    if stores is not None:
        linger(watch, round_, nodes)
    del stores
    return end.code


def held_slot(noted: str, per_node: int, nproc: int, active: int) -> int | None:
    """The training slot whose ranks this node's processes trained last (each noted its
    rank in ``noted``, :func:`~ftfleet.trainer.inprocess.worker.note_rank`): their
    snapshots are in this node's shared memory, so the next round should give the node
    that slot again. None when they trained nothing (a spare node's)."""
    held = []
    for local in range(per_node):
        try:
            with open(os.path.join(noted, f"local{local}"), encoding="ascii") as f:
                held.append(int(f.read().strip()))
        except (OSError, ValueError):
            continue
    training = [r for r in held if 0 <= r < active]
    return min(training) // nproc if training else None


def round_env(layout: Layout, node: int, local: int, nproc: int, min_ranks: int, group: int = 1) -> dict[str, str]:
    """What a worker needs to know of its place in a round: its rank in the layout, the
    world, its node and the layout itself."""
    return {
        "RANK": str(layout.rank(node, local)),
        "WORLD_SIZE": str(layout.world_size),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node),
        ACTIVE_WORLD_SIZE: str(layout.active),
        MIN_ACTIVE_WORLD_SIZE: str(min_ranks),
        GROUP_SIZE: str(group),
        INPROCESS_LAYOUT: layout.encode(),
    }


def warm_process(
    base_cmd: list[str], base_env: dict[str, str], rest: list[str], ready: str | None = None
) -> subprocess.Popen:
    """A worker for a round that has not begun: it imports and warms up now, and learns
    its place when the round forms (:func:`hand_over`; the worker's ``--assign-from-stdin``).
    With ``ready``, it creates that file once warm."""
    env = base_env if ready is None else {**base_env, WARM_READY_FILE: ready}
    return subprocess.Popen([*base_cmd, "--assign-from-stdin", *rest], env=env, stdin=subprocess.PIPE, text=True)


def wait_warm(warm: list[subprocess.Popen], ready: list[str], limit_s: float = WARM_READY_WAIT_S) -> bool:
    """Wait until every warm process has created its ``ready`` file; False when one
    ended first or ``limit_s`` passed (the round then takes what it finds, and
    :func:`hand_over` replaces a process that died)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(os.path.exists(path) for path in ready):
            return True
        if any(p.poll() is not None for p in warm):
            return False
        time.sleep(0.1)
    return False


def hand_over(warm: list[subprocess.Popen], place: Assignment) -> subprocess.Popen | None:
    """Give the first warm process still alive its ``place`` in the round (one line on
    its stdin, closed after it); None when none is left (start a new one then)."""
    while warm:
        proc = warm.pop(0)
        try:
            assert proc.stdin is not None
            proc.stdin.write(place.line())
            proc.stdin.close()
            return proc
        except (BrokenPipeError, OSError, ValueError):  # it died while warming up
            _close(proc)
    return None


def _close(proc: subprocess.Popen) -> None:
    """End a warm process that is not needed: end of input, then SIGKILL if it lingers."""
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve(stores: StoreHost) -> int:
    """A coordinator hosting the stores alone: serve until SIGTERM (the fleet's service
    manager stops it), opening a new round after each stop (:mod:`.stores`)."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _: stopping.append(signum))
    print(f"ftfleet.inprocess: hosting the job's stores; round {stores.round} open", file=sys.stderr, flush=True)
    return stores.serve(stopping)


def linger(watch: dist.TCPStore, round_: int, nodes: int, limit_s: float = 30.0) -> None:
    """The launcher hosting the stores, once its own workers are done: keep the stores up
    until the other nodes' launchers are done too (at most ``limit_s``), so that their
    workers' last store calls do not fail on a store that went first."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if int(watch.add(round_key(round_, "done"), 0)) >= nodes:
                return
        except RuntimeError:
            return
        time.sleep(0.1)


@dataclasses.dataclass
class RoundEnd:
    """How a round ended on this node: the exit code :func:`supervise` computes, whether
    the round was stopped (its stop key, or too few processes on one node), whether this
    launcher was signalled (a notice, a service stop: it does not rejoin), and the warm
    processes started for the next round."""

    code: int
    stopped: bool = False
    signalled: bool = False
    warm: list[subprocess.Popen] = dataclasses.field(default_factory=list)
    codes: list[int] = dataclasses.field(default_factory=list)


#: Why a launcher joins the next round after its workers left for a notice elsewhere.
EMERGENCY = "the ranks stopped after an emergency checkpoint for another node's notice"


def rejoin_reason(end: RoundEnd) -> str | None:
    """Why this node, still up, joins the next round after ``end``, or None when it
    exits instead (the job done, this launcher signalled, a failure a new round would
    repeat):

    * the round was stopped (no spare left to take a lost rank);
    * every process of this node was killed by a signal (the OOM killer, an operator):
      the job went on without them, or stops; either way this node waits for the next
      round, as a node booted now would;
    * its processes exited 75 while this launcher had no notice: the ranks stopped for
      another node's notice, with no spare node to take its ranks (the emergency
      checkpoint); the noticed node's own launcher got the signal and exits 75."""
    if end.signalled or end.code == EXIT_OK and not end.stopped:
        return None
    if end.stopped:
        return "stopped"
    if end.codes and all(c < 0 for c in end.codes):
        return "every process of this node was killed"
    if end.codes and all(c in (EXIT_PREEMPTED, 0) for c in end.codes) and EXIT_PREEMPTED in end.codes:
        return EMERGENCY
    return None


def supervise(
    procs: list[subprocess.Popen],
    watch: dist.TCPStore,
    round_: int,
    min_ranks: int | None,
    prepare: Callable[[], list[subprocess.Popen]] | None = None,
    warm_after_s: float = WARM_AFTER_S,
) -> RoundEnd:
    """Forward SIGTERM/SIGINT to this node's workers, stop them when the job cannot go on
    (its round's stop key, :mod:`.stores`; on one node also when fewer than ``min_ranks`` are left), and
    return how the round ended, with the job's exit code: the first nonzero code of a worker that was not killed
    by a signal (a killed rank is the failure the others recovered from), 1 when every
    worker was killed, else 0. ``prepare`` starts the next round's warm processes and says
    their pids, ``warm_after_s`` after this round's started (they get the signals too)."""
    end = RoundEnd(0)
    started = time.monotonic()

    def forward(signum: int, to: list[subprocess.Popen]) -> None:
        for p in to:
            if p.poll() is None:
                p.send_signal(signum)

    def signalled(signum, _frame):  # a notice or a service stop: this node does not rejoin
        end.signalled = True
        forward(signum, [*procs, *end.warm])

    signal.signal(signal.SIGTERM, signalled)
    signal.signal(signal.SIGINT, signalled)
    deadline = term_at = None
    while any(p.poll() is None for p in procs):
        if prepare is not None and not end.signalled and time.monotonic() - started >= warm_after_s:
            end.warm, prepare = prepare(), None
        reason = None
        now = time.monotonic()
        if term_at is not None and now >= term_at:
            forward(signal.SIGTERM, procs)  # not the warm ones: they are the next round's
            term_at, deadline = None, now + 2
        if min_ranks is not None:
            alive = sum(p.poll() is None for p in procs)
            done = sum(p.returncode == 0 for p in procs)  # finished the run: not a lost rank
            if alive + done < min_ranks and not end.stopped:
                reason = f"{alive} of {len(procs)} processes left, {min_ranks} needed"
                with contextlib.suppress(RuntimeError):  # the round is over for the host too
                    watch.set(round_key(round_, "stop"), reason)
        if reason is None and not end.stopped:
            reason = stop_reason(watch, round_)
        if reason and not end.stopped:
            # The wrapper would wait out its barrier timeout (120 s or more) before giving
            # up. Stop now, so that the next round (or whatever restarts this machine:
            # systemd, the group, a drill) starts at once. A resize's ranks leave on their
            # own once its checkpoint is committed and the wrapper's completion passed: a
            # SIGTERM before that would make the others restart in the round.
            print(f"ftfleet.inprocess: {reason}: stopping", file=sys.stderr, flush=True)
            grace = RESIZE_EXIT_S if reason.startswith(RESIZE_REASON) else 0.0
            end.stopped, term_at = True, now + grace
            if not grace:
                forward(signal.SIGTERM, procs)
                # Not 10 s: a rank still in the failed attempt takes the SIGTERM for a
                # notice and waits on peers that are gone (chaos: a 14.7 s recovery);
                # nothing it could write now is a checkpoint (that needs every rank), the
                # snapshots are kept.
                term_at, deadline = None, now + 2
        if end.stopped and deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            deadline = None  # once
        time.sleep(0.1)
    if not end.stopped and stop_reason(watch, round_):  # set just before the processes exited (a resize)
        end.stopped = True
    codes = end.codes = [p.returncode for p in procs]
    print(f"ftfleet.inprocess: exit codes {codes}", file=sys.stderr, flush=True)
    try:
        watch.add(round_key(round_, "done"), 1)
    except RuntimeError:  # the host is gone: nobody waits for this node
        pass
    clean = [c for c in codes if c >= 0]
    if not clean or (end.stopped and not end.signalled and all(c in (0, EXIT_PREEMPTED) for c in clean)):
        # Every worker killed, or stopped before the end (a resize's exit 75 too: no
        # node goes away): the job did not finish, and the fleet may start it again.
        end.code = 1
    else:
        end.code = next((c for c in clean if c != 0), 0)
    return end
