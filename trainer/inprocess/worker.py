"""One process of an in-process-restartable run: the reference trainer inside
nvidia-resiliency-ext's ``inprocess.Wrapper``. Started by :mod:`.launch`, which sets
RANK (0 .. N+K-1), WORLD_SIZE (N+K), FTFLEET_ACTIVE_WORLD_SIZE (N) and hosts the stores.

The config is loaded and checked once, before the wrapper: bad input exits 2 and is
never retried. Inside, each iteration is one :func:`~ftfleet.trainer.train.train`:
``init_distributed`` draws a fresh attempt prefix in the launcher's store (stale keys
of the failed iteration are never read), and the restore takes the newest in-memory
snapshot. An exception from the run (a peer's socket closed in a collective, a rank
hung past the soft timeout) goes to the wrapper, which aborts the process groups,
reassigns ranks and calls again; a :class:`~ftfleet.errors.UserError` (a checkpoint
that does not fit) is an exit code, not a restart: it would fail the same way again.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ftfleet.errors import ConfigError, UserError
from ftfleet.trainer.__main__ import CallbackFactory, exit_quickly
from ftfleet.trainer.callbacks import Callback
from ftfleet.trainer.environment import INPROCESS_RANK_FILE, WARM_READY_FILE, TrainerEnvironment
from ftfleet.trainer.inprocess import MAX_FAILED_STARTS
from ftfleet.trainer.inprocess.ranks import Layout, node_fill
from ftfleet.trainer.resilience.fencing import bind_to_launcher, retire

log = logging.getLogger("ftfleet.inprocess")


class Ping(Callback):
    """Tells the wrapper's progress watchdog that training moves, after every step, and
    counts the steps this attempt trained (``steps``)."""

    def __init__(self, call_wrapper: Any) -> None:
        self.call_wrapper = call_wrapper
        self.steps = 0

    def on_step_end(self, run: Any, info: Any) -> None:
        self.steps += 1
        self.call_wrapper.ping()


def check_attempts(failed_starts: int, limit: int) -> None:
    """Refuse another in-place attempt after ``limit`` in a row failed before training
    a step (a bad device, a bug in the build, a checkpoint every rank fails on): the
    process exits non-zero instead, and torchrun's (or the fleet's) restart takes over,
    in a new process, on another node if need be."""
    if failed_starts >= limit:
        from nvidia_resiliency_ext.inprocess.exception import RestartAbort

        raise RestartAbort(
            f"{failed_starts} in-process attempts in a row failed before their first step: giving up in place "
            "(the log above says why; --max-failed-starts sets the limit)"
        )


def device_slot(launch_local_rank: int, per_node: int, rank: int) -> int:
    """The local device index (``LOCAL_RANK``) a process trains ``rank`` on. A process
    launched as one of a node's ``per_node`` ranks (or a spare node's) keeps its own
    device; a spare process beside them has none of its own and takes the device of the
    rank it replaces, which died with it: ``rank % per_node`` (ranks are laid out node
    by node)."""
    return launch_local_rank if launch_local_rank < per_node else rank % per_node


def shrink_block(group: int, replicas: int, active: int) -> int:
    """How many consecutive ranks a smaller world keeps or drops together: ``group``
    (``--group-size``) when it is more than 1, else under HSDP one replica group of the
    ``active`` training ranks (a world without a whole group could not form the mesh:
    the fleet's ``FTFLEET_NNODES=MIN:MAX`` sets no group size), else 1."""
    if group > 1 or replicas < 2 or active % replicas:
        return group
    return active // replicas


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def retiring_abort() -> Any:
    """The wrapper's abort (run by its monitor thread on every rank as soon as a restart
    begins): this process's attempt is retired (:func:`~ftfleet.trainer.resilience.fencing.retire`),
    then the process groups are aborted as by default. Every rank retires before it
    reaches the restart's barrier, so before the next attempt's rank 0 registers a
    newer generation: a thread left from the old attempt that tries to commit then is
    refused, and the process, which belongs to the newer generation, stays."""
    import nvidia_resiliency_ext.inprocess as inprocess
    from nvidia_resiliency_ext.inprocess.abort import Abort, AbortTorchDistributed

    class RetireFence(Abort):
        def __call__(self, state: Any) -> Any:
            retire()
            return state

    # Compose applies the last first.
    return inprocess.Compose(AbortTorchDistributed(), RetireFence())


def build_wrapper(
    layout: Layout,
    soft_timeout_s: float,
    poll_s: float = 0.25,
    min_active: int | None = None,
    heartbeat_timeout_s: float | None = None,
    store_port: int | None = None,
    stop_key: str | None = None,
    group: int = 1,
) -> Any:
    """The wrapper over the job's :class:`~ftfleet.trainer.inprocess.ranks.Layout`: survivors
    keep their ranks; a dead rank is taken by a spare process of its node, a lost node's
    ranks by a spare node's processes (:class:`~ftfleet.trainer.inprocess.ranks.NodeFill`);
    the training nodes' ranks train, the others wait, warm. ``soft_timeout_s``: no step
    for this long counts as a hang. Without ``min_active`` (below the layout's active
    ranks) the world is all of them or nobody: when no spare is left, the job stops (its
    launchers are told, :func:`~ftfleet.trainer.inprocess.launch.request_stop`), so a run
    never trains (or checkpoints) on a smaller world, whose trajectory is another; with
    it, the survivors go on as a smaller world of at least that many ranks.
    ``heartbeat_timeout_s`` (default: half the soft timeout, at least 5 s): a rank whose
    monitor process has not been heard of for this long is terminated; it is how a lost
    node (its processes and their monitor processes gone at once) is told apart, so it
    bounds the time from a node's loss to the restart. ``store_port`` (default
    MASTER_PORT + 1) is the round's wrapper store, on MASTER_ADDR; no rank hosts it (its
    host outlives them all, :mod:`~ftfleet.trainer.inprocess.stores`). ``stop_key`` is the
    round's stop key (default round 0's). ``group``: a smaller world keeps whole blocks of
    this many consecutive ranks (:func:`~ftfleet.trainer.inprocess.ranks.reassign`)."""
    import nvidia_resiliency_ext.inprocess as inprocess

    from ftfleet.trainer.inprocess import nvrx_fixes

    nvrx_fixes.apply()

    from nvidia_resiliency_ext.inprocess.store import TCPStore

    from ftfleet.trainer.inprocess import stores

    def stop(reason: str, lost_nodes: int) -> None:
        log.warning("%s", reason)
        stores.request_stop(stop_key or stores.round_key(0, "stop"), reason, lost_nodes)

    class ClientStore(TCPStore):
        """The wrapper's store as a client in every rank: by default rank 0 would try to
        host it and, the port being taken by the real host, wait to connect as a client."""

        TCP_STORE_HOST_RANK = -1

    return inprocess.Wrapper(
        store_factory=ClientStore,
        store_kwargs={"port": store_port or int(os.environ["MASTER_PORT"]) + 1, "timeout": _seconds(120)},
        rank_assignment=node_fill(layout, min_active, on_stop=stop, group=group),
        abort=retiring_abort(),
        health_check=None,  # its only check is CUDA's
        # The monitor thread waits in the store for the "a rank was interrupted" key, one
        # wait of this length after another; a set key returns the wait at once. Short
        # waits starve the spare's monitor thread (it saw the key seconds late); 1 s
        # waits start the restart within a second of the kill.
        monitor_thread_interval=_seconds(1.0),
        monitor_process_interval=_seconds(poll_s),
        heartbeat_interval=_seconds(poll_s),
        progress_watchdog_interval=_seconds(poll_s),
        # Waited once per restart for other ranks' reports: kept short whatever poll_s.
        last_call_wait=_seconds(0.05),
        soft_timeout=_seconds(soft_timeout_s),
        hard_timeout=_seconds(soft_timeout_s + 30),
        heartbeat_timeout=_seconds(heartbeat_timeout_s or max(5.0, soft_timeout_s / 2)),
        # Each must exceed the last (the wrapper checks soft < hard < barrier and
        # heartbeat < barrier); its default barrier of 120 s refused a soft timeout of 600.
        barrier_timeout=_seconds(max(120.0, soft_timeout_s + 60)),
        completion_timeout=_seconds(max(120.0, soft_timeout_s + 60)),
        termination_grace_time=_seconds(2),
    )


def lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19; on Linux a thread's
    own, inherited by the threads and processes it starts)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):  # not Linux, or not permitted: run as is
        pass


def freeze_what_is_loaded() -> None:
    """Keep every object alive now (what the imports and the warm-up made: modules,
    classes, functions) out of the garbage collector's passes (``gc.freeze``). After
    each restart the wrapper collects until a pass finds nothing, on the critical path,
    and a pass over a warmed-up process's few hundred thousand objects costs a sizeable
    part of a restart; frozen, they are not visited. Objects made later (a run's model
    and optimizer, a failed attempt's tracebacks) are collected as before."""
    gc.collect()
    gc.freeze()


def _warm_up_niced(warm_up: Any, then: Callable[[], None]) -> None:
    """A spare process's warm-up: ``warm_up`` on a thread at the lowest CPU priority,
    then ``then`` (the collector's freeze) on this one, at the normal priority. Nothing
    that starts a process runs niced: a process inherits the nice value of the thread
    that starts it, and without CAP_SYS_NICE it cannot raise it again."""
    niced = threading.Thread(target=lambda: (lower_thread_priority(), warm_up()), name="ftfleet-warm-up-niced")
    niced.start()
    niced.join()
    then()


def wait_for(path: str, poll_s: float = 0.02) -> None:
    """Block until ``path`` exists: a spare node, warm, held until it is told to take over."""
    log.info("warm: waiting for %s", path)
    while not os.path.exists(path):
        time.sleep(poll_s)


#: Seconds a restart in this process uses the interruption prior an earlier attempt read.
PRIOR_REUSE_S = 600.0

#: How often a waiting spare looks for a durable checkpoint to size its reserve by.
RESERVE_POLL_S = 2.0


def snapshot_bytes_estimate(ckpt_dir: str, world_size: int, replicas: int = 1) -> int | None:
    """What one rank's snapshot will take, judged by the newest committed checkpoint in
    ``ckpt_dir``: the largest rank's shard bytes there (times the checkpoint's world
    size over ``world_size`` when more ranks wrote it than share the state now), or
    under HSDP (``replicas`` groups, each shard written once by one of its holders)
    the whole state over a group's ``world_size / replicas`` ranks when that is more,
    plus 2 % and 4 MiB for the snapshot's header. None without a checkpoint."""
    import re

    from ftfleet.trainer.checkpoint.tiers import LocalTier

    tier = LocalTier(ckpt_dir)
    for step in reversed(tier.committed_steps()):  # the newest first
        manifest = tier.read_manifest(step)
        if manifest is None:
            continue
        per_rank: dict[int, int] = {}
        for name, entry in manifest.every_file().items():
            match = re.fullmatch(r"__(\d+)_\d+\.distcp", name.rpartition("/")[2])
            if match:
                per_rank[int(match.group(1))] = per_rank.get(int(match.group(1)), 0) + entry.size
        if per_rank:
            scale = max(1.0, manifest.world_size / max(1, world_size))
            shard = max(max(per_rank.values()) * scale, sum(per_rank.values()) * replicas / max(1, world_size))
            return int(shard * 1.02) + (4 << 20)
    return None


def reserve_snapshot_memory(cfg: Any, stop: threading.Event, poll_s: float = RESERVE_POLL_S) -> int:
    """A warm spare node, while it waits: allocate the shared memory its first snapshots
    will need once it takes over (``checkpoint.memory``), so that they do not pay for
    new pages then (:func:`~ftfleet.trainer.checkpoint.memory.reserve_files`). This
    process reserves ``memory_keep + 1`` files for its own snapshots and as many for its
    peer's copy when the job spans nodes and sends copies, each sized by
    :func:`snapshot_bytes_estimate`, looked for every ``poll_s`` until a checkpoint
    exists. A spare process (beyond ``LOCAL_WORLD_SIZE``) reserves nothing: it takes over
    a rank of its node, whose files are there. Returns how many files it reserved."""
    ck = cfg.checkpoint
    local_rank, active = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not ck.memory or local_rank >= active:  # a spare process takes over a dead rank's files
        return 0
    from ftfleet.contract import memory_dir
    from ftfleet.trainer.checkpoint.memory import reserve_files

    world = TrainerEnvironment().active_world_size or int(os.environ.get("WORLD_SIZE", "1"))
    copies = world > ck.node_size(world) and ck.memory_peer_every > 0
    count = (ck.memory_keep + 1) * (2 if copies else 1)
    while not stop.is_set():
        try:
            size = snapshot_bytes_estimate(ck.dir, world, cfg.parallel.replicas)
        except OSError:
            size = None
        if size:
            made = reserve_files(memory_dir(ck.memory_root, cfg.run_id), size, count, local_rank, stop)
            log.info("warm: %d shared-memory files of %.0f MB reserved for snapshots", made, size / 1e6)
            return made
        stop.wait(poll_s)
    return 0


def note_rank(rank: int) -> None:
    """Note the rank this process trains in the launcher's file for it
    (FTFLEET_INPROCESS_RANK_FILE; nothing without one): whole, replaced at once."""
    path = os.environ.get(INPROCESS_RANK_FILE)
    if not path:
        return
    try:
        with open(f"{path}.tmp", "w", encoding="ascii") as f:
            f.write(f"{rank}\n")
        os.replace(f"{path}.tmp", path)
    except OSError as exc:  # the next round may restore from peers or disk instead
        log.warning("cannot note this process's rank in %s: %s", path, exc)


def _import_and_warm_up() -> None:
    """Import the trainer (torch with it) and what a build imports lazily."""
    from ftfleet.trainer.train import warm_up

    warm_up()


def _log_as(rank: int | None) -> None:
    """Log at INFO on rank 0, else at WARNING, each line tagged with the rank (``None``: a
    warm process whose rank is not known yet, tagged ``warm``)."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s [{'warm' if rank is None else f'proc{rank}'}] %(name)s: %(message)s",
        force=True,
    )


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A warm process's place in a round (:mod:`.launch`): the variables a worker started
    into the round would have had (RANK, WORLD_SIZE, the layout, ...), the round's wrapper
    store port and its stop key."""

    env: dict[str, str]
    wrapper_port: int
    stop_key: str

    def line(self) -> str:
        """The line :func:`take_assignment` reads."""
        return json.dumps({"env": self.env, "wrapper_port": self.wrapper_port, "stop_key": self.stop_key}) + "\n"


def take_assignment(stream: Any) -> Assignment | None:
    """Read this process's :class:`Assignment`: one JSON line on ``stream``,
    ``{"env": {name: value}, "wrapper_port": int, "stop_key": str}``. None at end of input
    (the launcher ended, or started no next round). Anything else is the launcher's bug:
    ValueError naming what is wrong."""
    line = stream.readline()
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"assignment: not JSON ({exc})") from None
    env, port, key = (
        (data.get(k) for k in ("env", "wrapper_port", "stop_key")) if isinstance(data, dict) else (None,) * 3
    )
    if not (
        isinstance(env, dict)
        and "RANK" in env
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        and isinstance(port, int)
        and 0 < port < 65536
        and isinstance(key, str)
        and key
    ):
        raise ValueError(
            f"assignment: expected env (strings, RANK among them), wrapper_port, stop_key; got {line[:200]!r}"
        )
    return Assignment(env, port, key)


def main(argv: Sequence[str] | None = None, *, callbacks: CallbackFactory | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftfleet.trainer.inprocess.worker")
    parser.add_argument("--config", default=TrainerEnvironment().config_file)
    parser.add_argument("--soft-timeout", type=float, default=60.0, help="seconds without a step: a hang")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between the wrapper's checks")
    parser.add_argument("--wait-for", metavar="FILE", help="train once FILE exists (a warm spare node)")
    parser.add_argument(
        "--heartbeat-timeout", type=float, default=None, help="seconds without a rank's heartbeat: it is gone"
    )
    parser.add_argument("--wrapper-port", type=int, default=None, help="the round's wrapper store (MASTER_PORT + 1)")
    parser.add_argument("--stop-key", default=None, help="the round's stop key in the trainer's store")
    parser.add_argument(
        "--max-failed-starts",
        type=int,
        default=MAX_FAILED_STARTS,
        help="in-process attempts in a row that may fail before their first step (then exit non-zero)",
    )
    parser.add_argument(
        "--assign-from-stdin",
        action="store_true",
        help="start warm for the launcher's next round and read this process's place in it from stdin "
        "(one JSON line, :func:`take_assignment`); at end of input, exit 0",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.max_failed_starts < 1:
        parser.error(f"--max-failed-starts {args.max_failed_starts}: use 1 or more")
    rank = int(os.environ.get("RANK", "0"))
    _log_as(None if args.assign_from_stdin else rank)
    bind_to_launcher()  # a worker (a waiting spare too) whose launcher dies ends too (exit 78)
    try:
        if not args.config:
            raise ConfigError("no config: pass --config FILE (or set FTFLEET_CONFIG)")
        from ftfleet.trainer.config import load_config

        extra, overrides = callbacks(list(args.overrides)) if callbacks else ((), list(args.overrides))
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if cfg.train.huge_pages:  # before torch allocates anything (train() asks again)
        from ftfleet.trainer.hostmem import use_huge_pages

        use_huge_pages()
    # The loader workers' server imports torch while this process does, in every
    # process: a spare's too, or a take-over soon after the launch waits for its server
    # to import torch before the first batch (bench/restart_bench.py with an early --kill-at).
    from ftfleet.trainer.data.workers import start_for

    start_for(cfg)
    if args.assign_from_stdin:
        # Started while a round trains on the same CPUs: the imports and the warm-up run
        # at the lowest priority (processes were started above, on this thread, at the
        # normal one), and the trainer's processes keep the CPUs they need.
        _warm_up_niced(_import_and_warm_up, freeze_what_is_loaded)
    # torch and the whole trainer are imported now; a spare also imports what a build
    # imports lazily (warm_up), so that taking over does not pay for it. A spare node
    # waits anyway; a spare process starts beside the ranks that train, so it warms up
    # on a thread at the lowest CPU priority, not taking their start-up's CPU.
    from ftfleet.trainer.checkpoint.tiers import reuse_clients
    from ftfleet.trainer.resilience.interval.prior import reuse_reads
    from ftfleet.trainer.train import train, warm_up

    # The fleet's interruption prior, read by the first attempt, serves the restarts in
    # this process for 10 minutes (the schedule counts the run's own interruptions anyway).
    reuse_reads(PRIOR_REUSE_S)
    reuse_clients()  # and the S3 clients
    if args.assign_from_stdin:
        # Warm for a round that has not begun: this process's place in the round, once
        # the launcher knows it.
        if ready := os.environ.pop(WARM_READY_FILE, None):
            with open(ready, "w"):  # warm: the launcher may count this node as waiting
                pass
        place = take_assignment(sys.stdin)
        if place is None:  # the launcher ended, or needs no next round
            return 0
        os.environ.update(place.env)
        args.wrapper_port, args.stop_key = place.wrapper_port, place.stop_key
        rank = int(os.environ["RANK"])
        _log_as(rank)
    warmed = args.assign_from_stdin
    active = TrainerEnvironment().active_world_size or int(os.environ.get("WORLD_SIZE", "1"))
    spare_process = rank >= active and not args.wait_for

    attempted = threading.Event()  # set once this process trains
    freezing = threading.Lock()  # an attempt does not start while the warm-up freezes
    if args.wait_for:
        warm_up()
    elif spare_process and not warmed:

        def then() -> None:
            with freezing:
                if not attempted.is_set():  # else a run's objects would be frozen too
                    freeze_what_is_loaded()

        threading.Thread(target=_warm_up_niced, args=(warm_up, then), name="ftfleet-warm-up", daemon=True).start()
    env = TrainerEnvironment()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = env.inprocess_layout or Layout(1, 0, active, world - active)  # one node, its spare processes
    min_active = env.min_active_world_size
    if args.wait_for:
        taken_over = threading.Event()  # the reserve stops between files when it is
        reserving = threading.Thread(
            target=reserve_snapshot_memory, args=(cfg, taken_over), name="ftfleet-reserve", daemon=True
        )
        reserving.start()
        freeze_what_is_loaded()  # now, not after the take-over, where its first pass would cost
        wait_for(args.wait_for)
        taken_over.set()

    # A world that shrank grows back when a node waits to join, through a checkpoint.
    from ftfleet.trainer.inprocess.resize import end_round, watch_round

    ck = cfg.checkpoint
    watch_round(args.stop_key if ck.enabled and ck.load and ck.load_step is None else None)
    launch_local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    failed_starts = 0  # attempts in a row, in this process, that failed before a step

    def attempt(call_wrapper: Any = None) -> int:
        nonlocal failed_starts
        with freezing:
            attempted.set()
        check_attempts(failed_starts, args.max_failed_starts)
        # Which iteration this is, for the event log's `attempt` and the summary's
        # `restarts` (torchrun's counter, which the trainer already reads).
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(call_wrapper.iteration)
        # The wrapper set RANK to the rank this process trains now.
        os.environ["LOCAL_RANK"] = str(device_slot(launch_local_rank, per_node, int(os.environ["RANK"])))
        note_rank(int(os.environ["RANK"]))
        ping = Ping(call_wrapper)
        try:
            result = train(cfg, [*extra, ping])
            end_round(result, args.stop_key)  # after a resize notice: every launcher joins the next round
            return int(result["exit_code"])
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
        finally:
            failed_starts = 0 if ping.steps else failed_starts + 1

    from nvidia_resiliency_ext.inprocess import CallWrapper

    # The wrapper hands itself to the parameter annotated with its class; this module's
    # annotations are strings (``from __future__ import annotations``).
    attempt.__annotations__["call_wrapper"] = CallWrapper
    from nvidia_resiliency_ext.inprocess.exception import RestartAbort

    wrapper = build_wrapper(
        layout,
        args.soft_timeout,
        poll_s=args.poll,
        min_active=min_active,
        heartbeat_timeout_s=args.heartbeat_timeout,
        store_port=args.wrapper_port,
        stop_key=args.stop_key,
        group=shrink_block(env.group_size, cfg.parallel.replicas, layout.active),
    )
    if not args.wait_for:  # a spare node froze before its wait
        freeze_what_is_loaded()  # a spare process's warm-up freezes again once it is done
    try:
        code = wrapper(attempt)()
    except RestartAbort as exc:  # check_attempts gave up
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if code is None else int(code)  # a spare never called returns None


if __name__ == "__main__":
    exit_quickly(main())
