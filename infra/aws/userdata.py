"""User data of every node: the boot script in infra/aws/boot/, rendered for one group.

`boot/node.sh` is the script a node runs; `boot/ftfleet-node.sh` is the helper it
installs (the image pull under systemd, the bounded self-replacement, IMDS), passed to
node.sh as a parameter, gzipped and base64-encoded to stay well under EC2's 16 KiB.
Both are plain bash files that shellcheck and the stub harness read
(tests/infra/test_boot_aws.py); this module only supplies their values.

The container's environment is the contract in ftfleet/contract.py: `trainer_env` builds
the part every node of a stack shares; node.sh adds the node's own FTFLEET_NODE_ID and
FTFLEET_RUN_DIR, which only the instance knows.

Coordinator discovery: a Route 53 private hosted zone (`<stack>.ftfleet.internal`)
holds `coordinator.<zone>`. The coordinator UPSERTs its private IP at every boot (TTL
10 s) and waits until the change is INSYNC, so after a replacement the name points at
the new node. Workers always use the name: their launcher resolves it again on every
rendezvous attempt (torchrun) or start (the in-process launcher, which reaches the job's
stores there), and systemd restarts the service when that fails, so workers follow a
replaced coordinator without being replaced themselves.
"""

from __future__ import annotations

import base64
import gzip
from dataclasses import dataclass
from pathlib import Path

from ftfleet import contract
from ftfleet.infra import bootscript
from ftfleet.infra.settings import Settings, launcher_env

BOOT_DIR = Path(__file__).with_name("boot")
NODE_SCRIPT = BOOT_DIR / "node.sh"
NODE_HELPER = BOOT_DIR / "ftfleet-node.sh"
#: TTL of the coordinator's A record, and the zone's negative-caching TTL (infra/aws/dns.py).
RECORD_TTL = 10
#: Failed pulls before a node asks for its replacement (about 20 minutes with the
#: helper's backoff: 15 s doubling to 5 minutes); it keeps retrying after that.
PULL_ATTEMPTS = 8
#: What node.sh adds to trainer_env on the node.
NODE_ENV = ("FTFLEET_NODE_ID", "FTFLEET_RUN_DIR")


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Values known only after deployment (Outputs resolved by the caller)."""

    role: str  # "coordinator" | "worker"
    image_uri: str
    registry_host: str
    fsx_dns_name: str
    fsx_mount_name: str
    primary_bucket: str
    replica_bucket: str
    zone_id: str
    zone_name: str

    @property
    def coordinator_host(self) -> str:
        return coordinator_host(self.zone_name)


def coordinator_host(zone_name: str) -> str:
    return f"coordinator.{zone_name.rstrip('.')}"


def lease_bucket(s: Settings, ctx: NodeContext) -> str:
    """Where the run lease lives: the primary bucket, or for a standby its replica (the
    home stack's primary bucket), so that both regions contend for one object."""
    return ctx.replica_bucket if s.standby else ctx.primary_bucket


def checkpoint_root(s: Settings) -> str:
    """Bucket key prefix of this run's checkpoints; the FSx association maps the same
    path, so the fast tier and the bucket agree on every key."""
    return f"{s.buckets.checkpoint_prefix}{s.trainer.run_id}"


def run_root(s: Settings) -> str:
    """Parent of the nodes' run directories (FTFLEET_RUN_DIR is `<this>/<instance id>`):
    on the fast tier, outside the path the FSx association exports."""
    return f"{s.storage.fsx_mount_point}/runs/{s.trainer.run_id}"


def trainer_env(s: Settings, ctx: NodeContext) -> dict[str, str]:
    """The container environment (contract.TRAINER_ENV) shared by the stack's nodes."""
    root = checkpoint_root(s)
    return {
        "FTFLEET_RUN_ID": s.trainer.run_id,
        "FTFLEET_CLOUD": s.cloud,
        "FTFLEET_CONFIG": s.trainer.config,
        "FTFLEET_CKPT_DIR": f"{s.storage.fsx_mount_point}/{root}",
        "FTFLEET_CKPT_URI": f"s3://{ctx.primary_bucket}/{root}",
        "FTFLEET_CKPT_REPLICA_URI": f"s3://{ctx.replica_bucket}/{root}",
        # The FSx association exports every committed file to FTFLEET_CKPT_URI.
        "FTFLEET_CKPT_UPLOAD": "fsx-export",
        "FTFLEET_LEASE_URI": f"s3://{lease_bucket(s, ctx)}/{contract.lease_key(s.trainer.run_id)}",
        "FTFLEET_LEASE_HOLDER": contract.lease_holder(s.stack, s.region),
        **launcher_env(s.trainer.launcher, s.fleet),
        "FTFLEET_NPROC_PER_NODE": str(s.fleet.gpus_per_node),
        "FTFLEET_RDZV_ENDPOINT": f"{ctx.coordinator_host}:{contract.RDZV_PORT}",
        "FTFLEET_REGION": s.region,
        "FTFLEET_REPLICA_REGION": s.replica_region,
        "FTFLEET_METADATA_ENDPOINT": contract.DEFAULT_METADATA_ENDPOINT[s.cloud],
        "FTFLEET_METRICS_PORT": str(contract.METRICS_PORT),
        # The snapshots' RAM file system, on huge pages: the boot script mounts it.
        "FTFLEET_SHM_DIR": contract.SHM_MOUNT,
    }


def helper_values(s: Settings, ctx: NodeContext, root: str = "") -> dict[str, str | int]:
    return {
        "ROOT": root,
        "ROLE": ctx.role,
        "REGION": s.region,
        "RUN_ID": s.trainer.run_id,
        "IMAGE_URI": ctx.image_uri,
        "REGISTRY_HOST": ctx.registry_host,
        "BUCKET": ctx.primary_bucket,
        "REPLACEMENTS_PREFIX": contract.REPLACEMENTS_PREFIX,
        "REPLACEMENT_BUDGET": contract.REPLACEMENT_BUDGET,
        "REPLACEMENT_WINDOW_S": contract.REPLACEMENT_WINDOW_S,
        "PULL_ATTEMPTS": PULL_ATTEMPTS,
    }


def pack(text: str) -> str:
    """How node.sh receives the helper: gzip (mtime 0, so the same text packs to the
    same user data and causes no launch-template diff), then base64."""
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=9, mtime=0)).decode()


def unpack(packed: str) -> str:
    return gzip.decompress(base64.b64decode(packed)).decode()


def render(s: Settings, ctx: NodeContext, *, root: str = "") -> str:
    """The user data of ``ctx.role``'s nodes; ``root`` prefixes every path it writes
    (empty on a node). Raises BootScriptError past EC2's 16 KiB user-data limit."""
    ckpt_dir = f"{s.storage.fsx_mount_point}/{checkpoint_root(s)}"
    env = trainer_env(s, ctx)
    for name, value in env.items():
        if "\n" in value or name in NODE_ENV:
            raise bootscript.BootScriptError(f"trainer_env: {name} cannot go into docker's --env-file")
    values: dict[str, str | int | bool] = {
        "ROOT": root,
        "ROLE": ctx.role,
        "LAUNCHER": s.trainer.launcher,
        "REGION": s.region,
        "MOUNT_POINT": s.storage.fsx_mount_point,
        "FSX_DNS_NAME": ctx.fsx_dns_name,
        "FSX_MOUNT_NAME": ctx.fsx_mount_name,
        "CKPT_DIR": ckpt_dir,
        "MARKER_DIR": f"{ckpt_dir}/{contract.MARKER_DIR}",
        "RUN_ROOT": run_root(s),
        "TRAINER_UID": contract.TRAINER_UID,
        "SHM_DIR": contract.SHM_MOUNT,
        "SHM_SIZE": contract.SHM_SIZE,
        "TRAINER_ENV": "\n".join(f"{k}={v}" for k, v in env.items()),
        "IMAGE_URI": ctx.image_uri,
        "EFA_ENABLED": s.fleet.efa_enabled,
        "EFA_DEVICE_DIR": contract.EFA_DEVICE_DIR,
        "ZONE_ID": ctx.zone_id,
        "COORDINATOR_HOST": ctx.coordinator_host,
        "RECORD_TTL": RECORD_TTL,
        # systemd gives the trainer the lifecycle hook's window, less a margin, to checkpoint.
        "STOP_TIMEOUT": s.fleet.termination_hook_seconds - 10,
        "NODE_FINAL_EXITS": " ".join(str(code) for code in contract.NODE_FINAL_EXITS),
        "NODE_HELPER_GZ": pack(bootscript.render(NODE_HELPER, helper_values(s, ctx, root))),
    }
    return bootscript.render(NODE_SCRIPT, values, max_bytes=bootscript.EC2_USER_DATA_LIMIT)
