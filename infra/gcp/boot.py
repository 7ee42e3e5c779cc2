"""The boot scripts of GCP nodes (infra/gcp/boot/*.sh), rendered for one stack.

The container's environment is the contract in ftfleet/contract.py: `trainer_env`
builds it from the settings and the deployed resources, the startup script adds the
node's own name (FTFLEET_NODE_ID, read from the metadata server at boot) and its run
directory on the fast tier (FTFLEET_RUN_DIR, `run_root(s)/<name>`), and a test checks
the result against `contract.check_env`.

Checkpoints become durable by the trainer's upload (FTFLEET_CKPT_UPLOAD=trainer):
neither Managed Lustre nor Parallelstore copies a directory to Cloud Storage on its
own. The bucket is one dual-region bucket, readable in both regions, so there is no
separate replica URI.

Coordinator discovery: the coordinator keeps one reserved internal address across
every replacement (infra/gcp/fleet.py), and workers dial that address. No node writes
DNS or needs any permission for it, and nothing can serve a stale record.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

from ftfleet import contract
from ftfleet.infra import bootscript
from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.infra.settings import launcher_env

BOOT_DIR = Path(__file__).with_name("boot")
STARTUP = BOOT_DIR / "startup.sh"
SHUTDOWN = BOOT_DIR / "shutdown.sh"
# Same values as the AWS nodes; to move into ftfleet/contract.py with the other ports.
RDZV_PORT = 29400
METRICS_PORT = 9400
#: The node health agent (boot/node_health.py): what auto-healing probes.
HEALTH_PORT = 9401
HEALTH_PATH = "/healthz"
HEALTH_AGENT = BOOT_DIR / "node_health.py"
SERVICE = "ftfleet-trainer"
#: The coordinator's job stores under the in-process launcher (the image's `stores`).
STORES_SERVICE = "ftfleet-stores"
HEALTH_SERVICE = "ftfleet-node-health"
#: Seconds the trainer gets between SIGTERM and SIGKILL when its VM shuts down: within
#: the 30 s Compute Engine gives a Spot VM's shutdown, and the 120 s of a standard VM.
STOP_SECONDS = {"SPOT": 25, "STANDARD": 100}
#: A failed package install, mount or pull is tried this often before the boot fails.
ATTEMPTS = 5
RETRY_SECONDS = 10
#: Compute Engine accepts metadata values up to 256 KiB.
METADATA_VALUE_LIMIT = 256 * 1024
#: What the startup script adds to trainer_env: only the node knows them.
NODE_ENV = ("FTFLEET_NODE_ID", "FTFLEET_RUN_DIR")
NO_RESTART_EXIT_CODES = (contract.EXIT_PREEMPTED, contract.EXIT_UNRECOVERABLE, contract.EXIT_CONFIG)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Values known only after deployment (Outputs resolved by the caller)."""

    image_uri: str
    registry_host: str
    mount_source: str
    """Managed Lustre `IP@tcp:/fs`, or Parallelstore access points, comma-separated."""
    bucket: str
    coordinator_ip: str


def checkpoint_root(s: GcpSettings) -> str:
    """Key prefix of this run's checkpoints in the bucket, and their path on the mount."""
    return f"{s.buckets.checkpoint_prefix}{s.trainer.run_id}"


def run_root(s: GcpSettings) -> str:
    """Parent of the nodes' run directories (FTFLEET_RUN_DIR is `<this>/<instance name>`,
    set by the startup script, which alone knows the name)."""
    return f"{s.storage.mount_point}/runs/{s.trainer.run_id}"


def trainer_env(s: GcpSettings, ctx: NodeContext) -> dict[str, str]:
    """The container environment (contract.TRAINER_ENV) except FTFLEET_NODE_ID and
    FTFLEET_RUN_DIR (NODE_ENV)."""
    root = checkpoint_root(s)
    f = s.fleet
    return {
        "FTFLEET_RUN_ID": s.trainer.run_id,
        "FTFLEET_CLOUD": "gcp",
        "FTFLEET_CONFIG": s.trainer.config,
        "FTFLEET_CKPT_DIR": f"{s.storage.mount_point}/{root}",
        "FTFLEET_CKPT_URI": f"gs://{ctx.bucket}/{root}",
        "FTFLEET_CKPT_UPLOAD": "trainer",
        "FTFLEET_LEASE_URI": f"gs://{ctx.bucket}/{contract.lease_key(s.trainer.run_id)}",
        "FTFLEET_LEASE_HOLDER": contract.lease_holder(s.stack, s.region),
        **launcher_env(s.trainer.launcher, f),
        "FTFLEET_NPROC_PER_NODE": str(f.gpus_per_node),
        "FTFLEET_RDZV_ENDPOINT": f"{ctx.coordinator_ip}:{RDZV_PORT}",
        "FTFLEET_REGION": s.region,
        "FTFLEET_REPLICA_REGION": s.replica_region,
        "FTFLEET_METADATA_ENDPOINT": contract.DEFAULT_METADATA_ENDPOINT["gcp"],
        "FTFLEET_METRICS_PORT": str(METRICS_PORT),
        # The snapshots' RAM file system, on huge pages: the boot script mounts it.
        "FTFLEET_SHM_DIR": contract.SHM_MOUNT,
        # An extended notice comes before the ACPI soft-off and its 30 s shutdown.
        "FTFLEET_PREEMPTION_NOTICE_S": str(f.preemption_notice_seconds + contract.GCP_PREEMPTION_NOTICE_S),
    }


def startup_script(
    s: GcpSettings,
    ctx: NodeContext,
    role: str,
    provisioning_model: str,
    *,
    root: str = "",
    retry_seconds: int = RETRY_SECONDS,
) -> str:
    """The startup script of one template. ``root`` and ``retry_seconds`` are for tests."""
    values = trainer_env(s, ctx)
    for name in NODE_ENV:
        if name in values:
            raise bootscript.BootScriptError(f"trainer_env: {name} is the startup script's to set")
    env = "\n".join(f"{k}={v}" for k, v in values.items())
    return bootscript.render(
        STARTUP,
        {
            "ROOT": root,
            "ROLE": role,
            "LAUNCHER": s.trainer.launcher,
            "SERVICE": SERVICE,
            "STORES_SERVICE": STORES_SERVICE,
            "HEALTH_SERVICE": HEALTH_SERVICE,
            # base64: the agent's source travels through the header whatever it contains.
            "HEALTH_AGENT": base64.b64encode(HEALTH_AGENT.read_bytes()).decode(),
            "HEALTH_PORT": HEALTH_PORT,
            "GPUS": s.fleet.gpus_per_node,
            "IMAGE_URI": ctx.image_uri,
            "REGISTRY_HOST": ctx.registry_host,
            "STORAGE_KIND": s.storage.kind,
            "MOUNT_SOURCE": ctx.mount_source,
            "MOUNT_POINT": s.storage.mount_point,
            "CKPT_DIR": f"{s.storage.mount_point}/{checkpoint_root(s)}",
            "RUN_ROOT": run_root(s),
            "TRAINER_UID": contract.TRAINER_UID,
            "SHM_DIR": contract.SHM_MOUNT,
            "SHM_SIZE": contract.SHM_SIZE,
            "TRAINER_ENV": env,
            "STOP_SECONDS": STOP_SECONDS[provisioning_model],
            "NO_RESTART_EXIT_CODES": " ".join(map(str, NO_RESTART_EXIT_CODES)),
            "ATTEMPTS": ATTEMPTS,
            "RETRY_SECONDS": retry_seconds,
        },
        max_bytes=METADATA_VALUE_LIMIT,
    )


def shutdown_script(provisioning_model: str, *, root: str = "") -> str:
    return bootscript.render(
        SHUTDOWN,
        {"ROOT": root, "SERVICE": SERVICE, "STOP_SECONDS": STOP_SECONDS[provisioning_model]},
        max_bytes=METADATA_VALUE_LIMIT,
    )
