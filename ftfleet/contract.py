"""The contracts shared by the fleet (infra/), the trainer image (trainer/) and the
remediation functions (lambdas/).

Everything two of those parts must agree on is defined here, once, and nowhere else:

* the environment the fleet's user data passes to the trainer container;
* the per-node commit marker that tells the fleet an emergency checkpoint is safe;
* the trainer's exit codes, which the node's supervisor and the remediation
  functions interpret;
* the names inside a checkpoint directory;
* what the node and the image share besides the environment: the container's uid, the
  ports, the EFA settings, the agent exit file, the clouds, the record of replacements.

This module must stay importable without torch, boto3 or pulumi: the Pulumi program,
the Lambda handlers and the trainer all import it. docs/CONTRACT.md is generated from
it (``python -m ftfleet.contract``) and a test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping

from ftfleet.errors import UserError

# ---------------------------------------------------------------------------
# Environment of the trainer container
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    required: bool
    doc: str
    example: str


#: Which malloc the trainer's processes use (:func:`ftfleet.hostenv.allocator_env`).
HOST_ALLOCATOR_ENV = "FTFLEET_HOST_ALLOCATOR"
#: Which launcher runs a node's training processes (:mod:`ftfleet.entrypoint`).
LAUNCHER_ENV = "FTFLEET_LAUNCHER"
#: Its values; the first is the default.
LAUNCHERS = ("inprocess", "torchrun")

TRAINER_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "FTFLEET_RUN_ID", True, "Identifies the training run; checkpoints of another run are refused.", "aws-prod-llm"
    ),
    EnvVar("FTFLEET_CLOUD", True, "`aws` or `gcp`: which metadata service to watch.", "aws"),
    EnvVar(
        "FTFLEET_CONFIG",
        True,
        "Trainer config file inside the image (YAML, see trainer/configs/).",
        "/opt/ftfleet/trainer/configs/tiny.yaml",
    ),
    EnvVar(
        "FTFLEET_CKPT_DIR",
        True,
        "Fast checkpoint tier: a directory on the FSx / Parallelstore / Lustre mount "
        "(or local NVMe). Checkpoints are committed here first.",
        "/fsx/checkpoints/aws-prod-llm",
    ),
    EnvVar(
        "FTFLEET_CKPT_URI",
        False,
        "Durable tier in the primary region (`s3://` or `gs://`). Empty: no durable tier.",
        "s3://ftfleet-prod-ckpt-use1/checkpoints/aws-prod-llm",
    ),
    EnvVar(
        "FTFLEET_CKPT_REPLICA_URI",
        False,
        "Replica of the durable tier in the other region; read-only for the trainer, "
        "used to restore when the primary is gone.",
        "s3://ftfleet-prod-ckpt-usw2/checkpoints/aws-prod-llm",
    ),
    EnvVar(
        "FTFLEET_LEASE_URI",
        False,
        "The run lease: one object (`s3://`, `gs://`) naming which holder may commit the "
        "run's checkpoints, written only with conditional requests. A trainer that does not "
        "hold it commits nothing (exit 78). Empty: no lease.",
        "s3://ftfleet-prod-ckpt-use1/ftfleet-leases/aws-prod-llm.json",
    ),
    EnvVar(
        "FTFLEET_LEASE_HOLDER",
        False,
        "Who this node's trainer is to the run lease: the stack and its region.",
        "aws-prod/us-east-1",
    ),
    EnvVar(
        "FTFLEET_CKPT_UPLOAD",
        False,
        "`trainer`: the trainer uploads each committed checkpoint to FTFLEET_CKPT_URI. "
        "`fsx-export`: the fast tier is an FSx file system whose data repository "
        "association exports to the same bucket, so the trainer does not upload twice. "
        "`none`: no durable copy.",
        "fsx-export",
    ),
    EnvVar(
        LAUNCHER_ENV,
        False,
        "Which launcher runs the node's training processes. `inprocess` (the default): "
        "ftfleet's in-process launcher (`python -m ftfleet.trainer.inprocess`): the node's "
        "slot comes from the job's stores (the first FTFLEET_NNODES nodes to register train, "
        "the next FTFLEET_SPARE_NODES wait as spare nodes, any later one waits for the job's "
        "next round); a crashed process is replaced in place by a warm spare process and a "
        "lost node's ranks by a spare node, without restarting the others. It runs the "
        "reference trainer: the image's arguments are its `--config FILE` and overrides (the "
        "image's CMD, `--module ftfleet.trainer`, is dropped). `torchrun`: torchrun's elastic "
        "agent, which restarts every worker of the job on a failure (FTFLEET_MAX_RESTARTS); "
        "a training program of your own needs it. The image's argument `stores` runs the "
        "job's store service instead of a node (inprocess only; the fleet runs it on the "
        "coordinator, whose stores outlive every training node).",
        "torchrun",
    ),
    EnvVar(
        "FTFLEET_NNODES",
        True,
        "Nodes of the job. torchrun: its `--nnodes` (`MIN:MAX` for elastic runs). inprocess: "
        "`N` trains on N nodes and the world never shrinks (the trajectory of an "
        "uninterrupted run); `MIN:MAX` trains on MAX nodes and, when no spare is left to "
        "take a lost node's ranks, lets the world shrink down to MIN nodes' ranks "
        "(`--min-ranks`; under HSDP by whole replica groups) and grow back to MAX nodes "
        "when nodes come back: another trajectory.",
        "2:16",
    ),
    EnvVar(
        "FTFLEET_NPROC_PER_NODE",
        True,
        "Training processes per node (GPUs per node): torchrun's `--nproc-per-node`, the "
        "in-process launcher's `--nproc` (a whole number).",
        "8",
    ),
    EnvVar(
        "FTFLEET_RDZV_ENDPOINT",
        True,
        "host:port on the coordinator node. torchrun: its c10d rendezvous. inprocess: the "
        "job's stores (this port and the next two; MASTER_ADDR:MASTER_PORT for the workers), "
        "hosted by the coordinator's store service.",
        "coordinator.ftfleet.internal:29400",
    ),
    EnvVar(
        "FTFLEET_SPARE_NODES",
        False,
        "inprocess: warm spare nodes of the job (the stack's `spareNodes`, default 0): "
        "nodes that register after the training nodes start their processes warm and take "
        "a lost node's ranks together.",
        "1",
    ),
    EnvVar(
        "FTFLEET_SPARE_PROCESSES",
        False,
        "inprocess: warm spare processes per node (default 1), torch imported, that replace "
        "a crashed process of the node in place.",
        "1",
    ),
    EnvVar(
        "FTFLEET_MAX_RESTARTS",
        False,
        "torchrun only: its `--max-restarts` (default 100): how often a node's agent restarts "
        "its workers after a failure. Every node's workers restart when any node is "
        "preempted, so a spot job needs many; exits that a restart cannot fix (2, 77, "
        "and 75 on the preempted node) stop the agent instead.",
        "100",
    ),
    EnvVar(
        "FTFLEET_NODE_ID",
        True,
        "This node's identity (EC2 instance id or GCE instance name); names its commit marker.",
        "i-0123456789abcdef0",
    ),
    EnvVar(
        "FTFLEET_GROUP_NAME",
        False,
        "AWS: the node's Auto Scaling group, whose termination lifecycle action the node "
        "completes after its commit marker. Unset: the instance's `aws:autoscaling:groupName` "
        "tag, read from IMDS (the launch templates allow tags in metadata).",
        "ftfleet-aws-prod-workers",
    ),
    EnvVar("FTFLEET_REGION", True, "Primary region.", "us-east-1"),
    EnvVar("FTFLEET_REPLICA_REGION", False, "Replica region.", "us-west-2"),
    EnvVar(
        "FTFLEET_METADATA_ENDPOINT",
        False,
        "Base URL of the instance metadata service; tests point it at a fake.",
        "http://169.254.169.254",
    ),
    EnvVar(
        "FTFLEET_PREEMPTION_NOTICE_S",
        False,
        "GCP: seconds from `instance/preempted` turning TRUE to the VM being stopped, the "
        "deadline of the emergency checkpoint. A Spot template with an extended preemption "
        "notice (`gcpPreemptionNoticeSeconds` N) sets N + 30 (the notice, then the 30 s "
        "shutdown after ACPI soft-off). Unset: 30, GCP's documented notice. AWS needs none: "
        "spot/instance-action names its own time.",
        "90",
    ),
    EnvVar(
        "FTFLEET_RUN_DIR",
        False,
        "Where the trainer writes `events.jsonl` and `summary.json`; must be writable by the "
        "image's user. The fleet gives each node its own directory on the fast tier "
        "(`<mount>/runs/<run id>/<node id>`), which outlives the container. Unset: "
        "`runs/<run id>` under the working directory.",
        "/fsx/runs/aws-prod-llm/i-0123456789abcdef0",
    ),
    EnvVar(
        "FTFLEET_SHM_DIR",
        False,
        "Where the in-memory snapshot tier lives (`checkpoint.memory`): each rank's latest "
        "snapshots, and the copy of the next node's, under `<dir>/ftfleet-<run id>/`; a warm "
        "spare node (`--wait-for`) allocates its first snapshots' files in `reserve/` there "
        "(`RESERVE_DIR`, named by `reserved_name`). Must be "
        "a RAM file system that outlives the training process (survives a crash or a "
        "torchrun restart, not a node loss). The fleet mounts one of its own on huge pages "
        "and passes it in. Unset: `/dev/shm`.",
        "/run/ftfleet-shm",
    ),
    EnvVar(
        HOST_ALLOCATOR_ENV,
        False,
        "The malloc the trainer's processes use for host memory. `jemalloc` (the image's "
        "default): freed memory stays in the process for the next step (`MALLOC_CONF` "
        "`dirty_decay_ms:-1,muzzy_decay_ms:-1` unless one is set; every process, loader "
        "workers too, keeps its peak) instead of coming back as fresh pages; `system`: "
        "glibc's malloc; an absolute path: that library, preloaded. Unset: jemalloc where "
        "it is installed. Whatever the choice, the entrypoint also lowers glibc's "
        "non-temporal copy threshold to 4 MiB for torchrun and its workers where glibc's "
        "default is above it (`GLIBC_TUNABLES`, added to the caller's; a caller's own "
        "`glibc.cpu.x86_non_temporal_threshold` is kept; x86-64 only), so that a snapshot "
        "of host-resident state is copied past the cache (`bench/snapshot_bench.py`).",
        "system",
    ),
    EnvVar(
        "FTFLEET_METRICS_PORT",
        False,
        "Port of the Prometheus exporter of local rank 0 (rank r: port + r; 0: off).",
        "9400",
    ),
    EnvVar(
        "FTFLEET_LOG_FORMAT",
        False,
        "`json`: one JSON object per log line (the image's default); `text`: plain lines.",
        "text",
    ),
)

ENV_NAMES = frozenset(v.name for v in TRAINER_ENV)

#: GCE sets instance/preempted this long before it stops a Spot or preemptible VM (the
#: ACPI soft-off and its shutdown period), when the template asks for no extended notice.
GCP_PREEMPTION_NOTICE_S = 30

#: The clouds a stack can deploy to (`ftfleet:cloud`, FTFLEET_CLOUD).
CLOUDS = ("aws", "gcp")

DEFAULT_METADATA_ENDPOINT = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
}

#: The trainer image runs as this uid/gid (never root); the fleet makes the checkpoint,
#: marker and run directories on the fast tier writable for it.
TRAINER_UID = 10001

#: The image's FTFLEET_METRICS_PORT: local rank r serves Prometheus metrics on this port + r.
METRICS_PORT = 9400
#: Ranks per node the image exposes metrics ports for (the largest GPU count per node).
MAX_LOCAL_RANKS = 8
#: Port of the c10d rendezvous on the coordinator (the port of FTFLEET_RDZV_ENDPOINT).
RDZV_PORT = 29400

#: Values of FTFLEET_CKPT_UPLOAD.
UPLOAD_MODES = ("trainer", "fsx-export", "none")


class ContractError(UserError):
    """The container environment does not satisfy the contract."""


def missing_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names of required variables that are unset or empty."""
    environ = os.environ if environ is None else environ
    return [v.name for v in TRAINER_ENV if v.required and not environ.get(v.name)]


def check_env(environ: Mapping[str, str] | None = None) -> None:
    """Raise ContractError naming every missing variable or bad value, in one line."""
    environ = os.environ if environ is None else environ
    missing = missing_env(environ)
    if missing:
        raise ContractError(
            f"trainer environment is missing {', '.join(missing)} (set by the fleet's user data; see docs/CONTRACT.md)"
        )
    mode = environ.get("FTFLEET_CKPT_UPLOAD", "trainer")
    if mode not in UPLOAD_MODES:
        raise ContractError(f"FTFLEET_CKPT_UPLOAD={mode!r}: use one of {', '.join(UPLOAD_MODES)}")
    launcher(environ)
    for name in ("FTFLEET_MAX_RESTARTS", "FTFLEET_SPARE_NODES", "FTFLEET_SPARE_PROCESSES"):
        count = environ.get(name, "")
        if count and not count.isdigit():
            raise ContractError(f"{name}={count!r}: use a whole number >= 0")
    notice = environ.get("FTFLEET_PREEMPTION_NOTICE_S", "")
    if notice and not _positive_number(notice):
        raise ContractError(f"FTFLEET_PREEMPTION_NOTICE_S={notice!r}: use a positive number of seconds")
    host_allocator(environ)
    if environ.get("FTFLEET_CLOUD") not in CLOUDS:
        raise ContractError(f"FTFLEET_CLOUD={environ.get('FTFLEET_CLOUD')!r}: use one of {', '.join(CLOUDS)}")


def launcher(environ: Mapping[str, str] | None = None) -> str:
    """FTFLEET_LAUNCHER, checked: ``inprocess`` (also when unset or empty) or ``torchrun``."""
    environ = os.environ if environ is None else environ
    value = environ.get(LAUNCHER_ENV, "") or LAUNCHERS[0]
    if value not in LAUNCHERS:
        raise ContractError(f"{LAUNCHER_ENV}={value!r}: use {' or '.join(LAUNCHERS)} (unset: {LAUNCHERS[0]})")
    return value


def host_allocator(environ: Mapping[str, str] | None = None) -> str:
    """FTFLEET_HOST_ALLOCATOR, checked: "" (unset), ``jemalloc``, ``system`` or an
    absolute path (:func:`ftfleet.hostenv.allocator_env` acts on it)."""
    environ = os.environ if environ is None else environ
    value = environ.get(HOST_ALLOCATOR_ENV, "")
    if value not in ("", "jemalloc", "system") and not value.startswith("/"):
        raise ContractError(f"{HOST_ALLOCATOR_ENV}={value!r}: use jemalloc, system or a library's absolute path")
    return value


def _positive_number(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and float(text) > 0
    except ValueError:
        return False


def run_dir(environ: Mapping[str, str] | None = None) -> str:
    """The trainer's run directory: FTFLEET_RUN_DIR, else `runs/<run id>` (relative)."""
    environ = os.environ if environ is None else environ
    return environ.get("FTFLEET_RUN_DIR") or os.path.join("runs", environ.get("FTFLEET_RUN_ID") or "local")


def check_writable_dirs(environ: Mapping[str, str] | None = None) -> None:
    """Raise ContractError (one line) unless this process can write the run directory,
    the checkpoint directory and its marker directory (or create them).

    The image's entrypoint calls this before torch is imported: a directory the image's
    user cannot write would otherwise be found after the rendezvous, or after training.
    """
    environ = os.environ if environ is None else environ
    uid = os.getuid()
    if environ.get("FTFLEET_RUN_DIR"):
        dirs = [("FTFLEET_RUN_DIR", run_dir(environ), "point FTFLEET_RUN_DIR at a directory it can write")]
    else:
        dirs = [("the run directory", run_dir(environ), "set FTFLEET_RUN_DIR to a directory it can write")]
    if environ.get("FTFLEET_CKPT_DIR"):
        ckpt = environ["FTFLEET_CKPT_DIR"]
        dirs += [
            ("FTFLEET_CKPT_DIR", ckpt, f"chown it to {uid} or point FTFLEET_CKPT_DIR at a directory it can write"),
            ("the commit marker directory", os.path.join(ckpt, MARKER_DIR), f"chown it to {uid}"),
        ]
    for what, path, fix in dirs:
        problem = _unwritable(path)
        if problem is not None:
            where = path if os.path.isabs(path) else f"{path} (relative to {os.getcwd()})"
            raise ContractError(f"{what} {where} {problem} for uid {uid}: {fix} (a fleet node's boot script does)")


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written or created by this process, or None if it can."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"cannot be created ({probe} is not a directory)"
    if os.access(probe, os.W_OK | os.X_OK):
        return None
    st = os.stat(probe)
    owner = f"owned by uid {st.st_uid}, mode {st.st_mode & 0o777:o}"
    if probe == os.path.abspath(path):
        return f"is not writable ({owner})"
    return f"cannot be created ({probe} is not writable: {owner})"


# ---------------------------------------------------------------------------
# EFA: what the node passes in and what the image sets for it
# ---------------------------------------------------------------------------

#: The node passes every `uverbs*` device under this directory into the container
#: (`docker run --device`) when the stack enables EFA.
EFA_DEVICE_DIR = "/dev/infiniband"
#: Set for the trainer only when EFA devices are present: libfabric's EFA provider, and
#: NCCL's OFI plugin (aws-ofi-nccl, which the EFA installer puts on the image's
#: LD_LIBRARY_PATH). Without EFA, NCCL keeps its own socket transport.
EFA_ENV = {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"}


# ---------------------------------------------------------------------------
# Exit codes of the trainer (per worker process; torchrun reports the first failure)
# ---------------------------------------------------------------------------

EXIT_OK = 0
#: A termination notice arrived and the emergency checkpoint was committed to the fast
#: tier. The node is going away: do not restart here.
EXIT_PREEMPTED = 75
#: The hang watchdog fired (stacks were dumped to the log). Restart the group.
EXIT_HUNG = 76
#: Repeated rollbacks at the same step, or no usable checkpoint where one was required.
#: Restarting will not help; a human must look.
EXIT_UNRECOVERABLE = 77
#: Bad configuration or environment. Restarting will not help.
EXIT_CONFIG = 2
#: This process no longer belongs to the newest generation of its run: its launcher
#: (the torchrun agent, the in-process launcher) is gone, or a newer attempt registered
#: in the run's store, or the store cannot be reached to tell; or another holder (region)
#: has the run lease, or this one's ran out (FTFLEET_LEASE_URI). It committed nothing
#: after it found out (no checkpoint manifest, snapshot manifest or commit marker) and
#: took its own child processes with it. Its agent must not restart it into the old
#: generation; a new start of the node (a new agent, a new rendezvous) joins the newest.
EXIT_FENCED = 78

#: A worker exiting with one of these stops its node's torchrun agent instead of being
#: restarted by `--max-restarts` (75 does so only on the node being preempted).
AGENT_STOP_EXITS = (EXIT_CONFIG, EXIT_UNRECOVERABLE, EXIT_FENCED)
#: The node's supervisor (systemd on AWS) does not restart the container after these:
#: the node is going away (75), or a restart would repeat the failure (2, 77). After 78
#: it does: the new container's agent joins the run's newest generation.
NODE_FINAL_EXITS = (EXIT_PREEMPTED, EXIT_UNRECOVERABLE, EXIT_CONFIG)

EXIT_CODES = {
    EXIT_OK: "training finished",
    EXIT_CONFIG: "bad trainer config or container environment",
    EXIT_PREEMPTED: "termination notice handled; emergency checkpoint committed",
    EXIT_HUNG: "hang watchdog fired; restart the group",
    EXIT_UNRECOVERABLE: "repeated failure at the same step; needs a human",
    EXIT_FENCED: "fenced: a newer generation of the run registered, the run's store is out of reach, "
    "the process's launcher is gone, or another holder has the run lease; nothing was committed after that",
}

#: The trainer and the image's entrypoint: on the node whose own termination notice
#: was handled, local rank 0 writes EXIT_PREEMPTED into this file, named after its
#: torchrun agent's pid, and stops that agent (SIGTERM) so that it does not restart the
#: workers of a machine that is going away. The entrypoint then exits with the code in
#: the file instead of torchrun's. The shell side spells it
#: "${TMPDIR:-/tmp}/ftfleet-agent-<pid>.exit".
AGENT_EXIT_FILE = "ftfleet-agent-{pid}.exit"


def agent_exit_file(agent_pid: int, tmpdir: str | None = None) -> str:
    """Where the exit code of the node whose torchrun agent is ``agent_pid`` is left."""
    base = tmpdir if tmpdir is not None else os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(base, AGENT_EXIT_FILE.format(pid=agent_pid))


# ---------------------------------------------------------------------------
# Replacements of nodes, and their bound
# ---------------------------------------------------------------------------

#: Every replacement a node asks for itself (a failed boot, an image that cannot be
#: pulled) is recorded as an empty object in the primary bucket under
#: <REPLACEMENTS_PREFIX><run id>/<group role>/<unix seconds, 10 digits>-<instance id>,
#: before the node marks itself Unhealthy. A node counts the records of its group in the
#: last REPLACEMENT_WINDOW_S seconds (its own included) and asks for a replacement only
#: while they are at most REPLACEMENT_BUDGET; past that the cause is shared (the image,
#: the AMI, the registry, the file system) and a new node would fail the same way. Remediation
#: functions that replace nodes record and count in the same place.
REPLACEMENTS_PREFIX = "ftfleet-replacements/"
REPLACEMENT_BUDGET = 3
REPLACEMENT_WINDOW_S = 3600


#: Where a fleet keeps each run's lease (FTFLEET_LEASE_URI) in the home region's bucket:
#: outside the checkpoints' prefix, so the fast tier's association never imports the
#: object it rewrites every quarter of the lease's TTL, and no checkpoint rule ages it.
LEASE_PREFIX = "ftfleet-leases/"


def lease_key(run_id: str) -> str:
    return f"{LEASE_PREFIX}{run_id}.json"


def lease_holder(stack: str, region: str) -> str:
    """FTFLEET_LEASE_HOLDER of a fleet's nodes: the stack and the region it trains in."""
    return f"{stack}/{region}"


def replacement_key(run_id: str, role: str, unix_seconds: int, instance_id: str) -> str:
    return f"{REPLACEMENTS_PREFIX}{run_id}/{role}/{unix_seconds:010d}-{instance_id}"


# ---------------------------------------------------------------------------
# Checkpoint layout and the commit marker
# ---------------------------------------------------------------------------

#: Checkpoint N lives in <tier root>/step-N/ (no zero padding; sort numerically).
STEP_DIR_PREFIX = "step-"
#: Written last, atomically, inside the step directory: a step directory without it
#: does not exist as far as any loader is concerned.
MANIFEST_NAME = "manifest.json"
#: Per-node commit markers live in <tier root>/markers/<node id>.json.
MARKER_DIR = "markers"


#: The default of FTFLEET_SHM_DIR.
SHM_ROOT = "/dev/shm"
#: Where a fleet node mounts the snapshots' own RAM file system, on huge pages
#: (``huge=within_size``), and what its FTFLEET_SHM_DIR says: a new snapshot file is
#: allocated and mapped far faster there than in /dev/shm's 4 KiB pages
#: (``bench/hostmem_bench.py``).
SHM_MOUNT = "/run/ftfleet-shm"
#: Its size: tmpfs's own default, said outright (pages are taken only when written).
SHM_SIZE = "50%"


def memory_dir(root: str, run_id: str) -> str:
    """The run's in-memory snapshot tier under FTFLEET_SHM_DIR (``root``)."""
    return os.path.join(root or SHM_ROOT, f"ftfleet-{run_id}")


#: Under a run's tier (:func:`memory_dir`): files a warm spare node allocated for the
#: snapshots it will take once it trains.
RESERVE_DIR = "reserve"


def reserved_name(local_rank: int, index: int) -> str:
    """The name of local rank ``local_rank``'s ``index``-th reserved file in ``RESERVE_DIR``."""
    return f"local{local_rank}-{index}"


#: A step is an int64 counter: at most 19 decimal digits.
STEP_DIGITS_MAX = 19


def step_dir_name(step: int) -> str:
    return f"{STEP_DIR_PREFIX}{step}"


def parse_step_dir(name: str) -> int | None:
    """The step of a `step-N` directory name, or None for anything else: N is ASCII
    digits without zero padding (exactly what :func:`step_dir_name` writes), so a name
    that only looks like one (``step-²``, ``step-١٢``, ``step-007``) is no checkpoint."""
    if not name.startswith(STEP_DIR_PREFIX):
        return None
    digits = name[len(STEP_DIR_PREFIX) :]
    if not (digits.isascii() and digits.isdigit()) or (len(digits) > 1 and digits[0] == "0"):
        return None
    if len(digits) > STEP_DIGITS_MAX:  # no step counter gets there; a path would be too long
        return None
    return int(digits)


def marker_key(node_id: str) -> str:
    """Path of a node's commit marker relative to a tier root (directory or bucket prefix)."""
    return f"{MARKER_DIR}/{node_id}.json"


@dataclasses.dataclass(frozen=True, slots=True)
class CommitMarker:
    """Says: node `node_id` may be terminated; checkpoint `step` of `run_id` is committed.

    The trainer writes it (on each node, after every rank's shard of the emergency
    checkpoint is committed to the fast tier) to the fast tier and, when a durable tier
    is configured, to the durable tier's ``markers/`` prefix, where the lifecycle
    handoff function polls for it before completing the termination lifecycle action.
    ``durable`` tells whether the checkpoint had also reached the durable tier when the
    marker was written. A marker whose ``written_at`` is older than the termination
    notice is stale and must be ignored.
    """

    run_id: str
    node_id: str
    step: int
    reason: str  # "termination" | "rebalance" | "maintenance" | "signal"
    durable: bool
    written_at: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CommitMarker:
        try:
            data = json.loads(text)
            marker = cls(
                run_id=str(data["run_id"]),
                node_id=str(data["node_id"]),
                step=int(data["step"]),
                reason=str(data["reason"]),
                durable=bool(data["durable"]),
                written_at=float(data["written_at"]),
            )
            if not math.isfinite(marker.written_at):
                raise ValueError(f"written_at is {marker.written_at}")
            return marker
        # OverflowError: a number past a float (int(1e999)); RecursionError: nesting
        # deeper than the parser goes. Both are just malformed JSON here.
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise ContractError(f"malformed commit marker: {exc}") from None

    @classmethod
    def now(cls, run_id: str, node_id: str, step: int, reason: str, durable: bool) -> CommitMarker:
        return cls(run_id, node_id, step, reason, durable, time.time())


# ---------------------------------------------------------------------------
# Remediation functions and the node (lambdas/)
# ---------------------------------------------------------------------------
#
# What the remediation functions (lambdas/: AWS Lambda now, Cloud Functions later) and
# the nodes agree on. The trainer's side of each item lands with the trainer's
# restructure; the functions already read and write exactly what is defined here.

#: CloudWatch namespace of every ftfleet metric, the trainer's and the functions'. The
#: node role may publish only into it (a ``cloudwatch:namespace`` condition).
METRICS_NAMESPACE = "ftfleet"

#: Name of the termination lifecycle hook on every Auto Scaling group of a stack. The
#: lifecycle_handoff function ignores lifecycle actions of any other hook, and the node
#: completes the action of this hook once its commit marker is written.
TERMINATION_HOOK_NAME = "ftfleet-emergency-checkpoint"

#: Instance tags the spot_interruption function sets on a node of the stack (value: the
#: notice's time, ISO 8601). A node can read them through IMDS
#: (``meta-data/tags/instance/<key>``: the launch templates allow tags in metadata).
SPOT_INTERRUPTION_TAG = "ftfleet:spot-interruption"
REBALANCE_TAG = "ftfleet:rebalance-recommendation"


@dataclasses.dataclass(frozen=True, slots=True)
class NodeMetric:
    """A per-node CloudWatch metric that a node publishes and a function judges.

    Published by the trainer itself (local rank 0 of each node, a background thread,
    ``PutMetricData`` once every :data:`NODE_METRIC_PERIOD_S`), not by a CloudWatch agent
    scraping the Prometheus port: the node role already holds ``cloudwatch:PutMetricData``
    for :data:`METRICS_NAMESPACE`, the same code publishes under the drill's local AWS
    endpoint, a dead or hung trainer stops publishing on its own (an agent keeps
    scraping a hung exporter thread), and the image needs no agent nor a scrape config
    for eight per-rank ports. Dimensions: ``RunId`` (FTFLEET_RUN_ID) and ``NodeId``
    (FTFLEET_NODE_ID, the instance id).
    """

    name: str
    unit: str
    doc: str

    def dimensions(self, run_id: str, node_id: str) -> list[dict[str, str]]:
        """The metric's dimensions in CloudWatch's wire shape."""
        return [{"Name": "RunId", "Value": run_id}, {"Name": "NodeId", "Value": node_id}]


#: Seconds between two data points of a node metric.
NODE_METRIC_PERIOD_S = 60

#: Optimizer steps completed since the node's previous data point (0 when none). The
#: unhealthy_node function replaces a node whose sum stays 0, or that publishes nothing,
#: for ``unhealthyNodeGraceSeconds``, once any node of the run has ever published it.
PROGRESS_METRIC = NodeMetric(
    "TrainerSteps", "Count", "optimizer steps completed since the node's previous data point (0 when none)"
)
#: GPU errors that mean broken hardware (XID and uncorrectable ECC, from DCGM or
#: nvidia-smi) since the previous data point. Any in the grace window replaces the node,
#: even when the whole fleet is stalled.
GPU_ERRORS_METRIC = NodeMetric(
    "GpuErrors", "Count", "XID and uncorrectable ECC errors since the node's previous data point"
)
NODE_METRICS = (PROGRESS_METRIC, GPU_ERRORS_METRIC)

#: A termination marker written up to this many seconds before the lifecycle event still
#: releases the node: EC2's spot notice (which the trainer acts on) comes up to two
#: minutes before the group's terminate lifecycle action, so the emergency checkpoint
#: may well be committed before the group's event exists.
MARKER_NOTICE_SLACK_S = 120.0


def marker_releases(marker: CommitMarker, *, node_id: str, run_id: str, notice_at: float) -> bool:
    """Whether ``marker`` lets the lifecycle action of ``node_id``'s termination at epoch
    ``notice_at`` complete: the same node and run, written for a termination (a
    rebalance's early checkpoint lets the node carry on, it does not release it), and
    not older than the notice less :data:`MARKER_NOTICE_SLACK_S` (an older one is stale:
    it belongs to an earlier notice)."""
    return (
        marker.node_id == node_id
        and marker.run_id == run_id
        and marker.reason != "rebalance"
        and marker.written_at >= notice_at - MARKER_NOTICE_SLACK_S
    )


#: The trainer reads it at start (rank 0) into ``resilience.interval.mtbf_s``.
#: The interruption-rate prior lives at ``<tier root>/fleet/interruptions.json`` of the
#: durable tier (FTFLEET_CKPT_URI): the trainer reads it with the access it already
#: has (on AWS, the FSx association also imports it onto the fast tier), and the AWS and
#: the GCP functions write the same object in their own bucket.
INTERRUPTION_PRIOR_KEY = "fleet/interruptions.json"
#: Interruptions older than this no longer count.
INTERRUPTION_WINDOW_S = 7 * 86400.0
#: Interruptions less than this apart are one interruption of the job (a capacity
#: crunch reclaims several nodes at once; the job restarts once).
INTERRUPTION_BURST_S = 300.0
#: The prior keeps at most this many interruptions (the newest).
INTERRUPTION_PRIOR_MAX = 1000
PRIOR_FORMAT = "ftfleet-interruptions/1"


@dataclasses.dataclass(frozen=True, slots=True)
class Interruption:
    node_id: str
    at: float
    """Epoch seconds of the notice."""
    zone: str
    instance_type: str


@dataclasses.dataclass(frozen=True, slots=True)
class InterruptionPrior:
    """The spot interruptions a fleet saw recently, from which the trainer's adaptive
    checkpoint interval takes its MTBF prior (``resilience.interval.mtbf_s``).

    A remediation function adds each interruption of the stack's nodes
    (:meth:`with_interruption`, idempotent by node id: a node is interrupted once) with a
    conditional write, so concurrent writers never lose one. The trainer parses it with
    :meth:`from_json` and calls :meth:`mtbf_s`: None while fewer than two job
    interruptions are known (keep the configured prior), else the mean time between the
    job interruptions since the first one in the window.
    """

    cloud: str
    run_id: str
    updated_at: float
    interruptions: tuple[Interruption, ...] = ()

    def with_interruption(self, event: Interruption, now: float) -> tuple[InterruptionPrior, bool]:
        """The prior with ``event`` added (dropping what left the window) and whether it
        was new; an interruption of a node already recorded changes nothing."""
        if any(i.node_id == event.node_id for i in self.interruptions):
            return self, False
        kept = [i for i in self.interruptions if i.at >= now - INTERRUPTION_WINDOW_S]
        kept = sorted([*kept, event], key=lambda i: i.at)[-INTERRUPTION_PRIOR_MAX:]
        return dataclasses.replace(self, updated_at=now, interruptions=tuple(kept)), True

    def job_interruptions(self, now: float) -> list[float]:
        """Start times of the job interruptions in the window (bursts collapsed)."""
        starts: list[float] = []
        for t in sorted(i.at for i in self.interruptions if now - INTERRUPTION_WINDOW_S <= i.at <= now):
            if not starts or t - starts[-1] >= INTERRUPTION_BURST_S:
                starts.append(t)
        return starts

    def mtbf_s(self, now: float) -> float | None:
        """The job's mean time between interruptions, seconds; None with fewer than two."""
        starts = self.job_interruptions(now)
        if len(starts) < 2:
            return None
        return (now - starts[0]) / (len(starts) - 1)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": PRIOR_FORMAT,
                "cloud": self.cloud,
                "run_id": self.run_id,
                "updated_at": self.updated_at,
                "interruptions": [dataclasses.asdict(i) for i in self.interruptions],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> InterruptionPrior:
        """Parse and validate; ContractError (one line) for anything else."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != PRIOR_FORMAT:
                raise ValueError(f"format is not {PRIOR_FORMAT!r}")
            events = []
            for item in data["interruptions"]:
                event = Interruption(
                    node_id=str(item["node_id"]),
                    at=float(item["at"]),
                    zone=str(item["zone"]),
                    instance_type=str(item["instance_type"]),
                )
                if not event.node_id or not math.isfinite(event.at):
                    raise ValueError(f"bad interruption {item!r}")
                events.append(event)
            prior = cls(
                cloud=str(data["cloud"]),
                run_id=str(data["run_id"]),
                updated_at=float(data["updated_at"]),
                interruptions=tuple(sorted(events, key=lambda i: i.at)),
            )
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            raise ContractError(f"malformed interruption prior ({INTERRUPTION_PRIOR_KEY}): {exc}") from None
        if prior.cloud not in DEFAULT_METADATA_ENDPOINT:
            raise ContractError(f"malformed interruption prior: cloud {prior.cloud!r} is not aws or gcp")
        return prior


def parse_interruption_prior(text: str | bytes) -> InterruptionPrior:
    """What the trainer calls on the prior object's bytes."""
    return InterruptionPrior.from_json(text)


def manifest_file_sizes(text: str | bytes) -> dict[str, int]:
    """Names and sizes of the files a checkpoint's ``manifest.json`` lists (the part of the
    trainer's manifest format that the replication watch and the retention sweep read to
    tell whether a copy of a checkpoint is complete): its own files by name, and the files
    of earlier checkpoints it references as ``../step-N/<name>`` (the key of step-N's
    file relative to this checkpoint's directory). ContractError when it lists none."""
    try:
        data = json.loads(text)
        sizes = {str(name): int(entry["size"]) for name, entry in data["files"].items()}
        for step, files in (data.get("references") or {}).items():
            if parse_step_dir(step_dir_name(step)) is None:
                raise ValueError(f"references step {step!r}")
            for name, entry in files.items():
                sizes[f"../{step_dir_name(step)}/{name}"] = int(entry["size"])
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise ContractError(f"malformed {MANIFEST_NAME}: {exc}") from None
    if not sizes:
        raise ContractError(f"malformed {MANIFEST_NAME}: it lists no files")
    if any(size < 0 for size in sizes.values()):
        raise ContractError(f"malformed {MANIFEST_NAME}: a negative size")
    return sizes


def split_manifest_path(path: str) -> tuple[int | None, str]:
    """(None, name) for a checkpoint's own file; (step, name) for a file of checkpoint
    ``step`` that :func:`manifest_file_sizes` lists as ``../step-N/<name>``."""
    if not path.startswith("../"):
        return None, path
    directory, _, name = path[3:].partition("/")
    step = parse_step_dir(directory)
    if step is None or not name or "/" in name:
        raise ContractError(f"malformed {MANIFEST_NAME}: illegal reference {path!r}")
    return step, name


if __name__ == "__main__":  # pragma: no cover - exercised by the docs test
    from ftfleet.contract_doc import render_markdown

    print(render_markdown(), end="")
