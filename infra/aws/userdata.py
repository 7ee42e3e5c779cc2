"""Boot script of every node: mount FSx, publish or find the coordinator, start the
trainer image under torchrun as a systemd service.

The container's environment is the contract in ftfleet/contract.py; `trainer_env`
builds it and a test checks it satisfies `contract.check_env`.

Coordinator discovery: a Route 53 private hosted zone (`<stack>.ftfleet.internal`)
holds `coordinator.<zone>`. The coordinator UPSERTs its private IP at every boot (TTL
10 s), so after a replacement the name points at the new node. Workers always use
the name: torchrun resolves it again on every rendezvous attempt, and systemd restarts
the service when a rendezvous fails, so workers follow a replaced coordinator
without being replaced themselves.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ftfleet import contract
from ftfleet.infra.settings import Settings

RDZV_PORT = 29400
# The image's entrypoint (trainer/docker-entrypoint) turns the contract environment into
# the torchrun command line, so the unit passes the environment and no arguments.
METRICS_PORT = 9400
ENV_FILE = "/etc/ftfleet/trainer.env"
SERVICE = "ftfleet-trainer"


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
        return f"coordinator.{self.zone_name}"


def checkpoint_root(s: Settings) -> str:
    """Bucket key prefix of this run's checkpoints; the FSx association maps the same
    path, so the fast tier and the bucket agree on every key."""
    return f"{s.buckets.checkpoint_prefix}{s.trainer.run_id}"


def fstab_line(ctx: NodeContext, mount: str) -> str:
    """Adds the FSx mount to /etc/fstab once (the shell line that does it)."""
    entry = (
        f"{ctx.fsx_dns_name}@tcp:/{ctx.fsx_mount_name} {mount} lustre "
        "defaults,noatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service 0 0"
    )
    return f'grep -q " {mount} " /etc/fstab || echo "{entry}" >> /etc/fstab'


def trainer_env(s: Settings, ctx: NodeContext, node_id: str = "${INSTANCE_ID}") -> dict[str, str]:
    """The container environment (contract.TRAINER_ENV), as the env file writes it."""
    root = checkpoint_root(s)
    nodes = 1 + s.fleet.worker_max_size
    min_nodes = 1 + s.fleet.worker_min_size
    return {
        "FTFLEET_RUN_ID": s.trainer.run_id,
        "FTFLEET_CLOUD": s.cloud,
        "FTFLEET_CONFIG": s.trainer.config,
        "FTFLEET_CKPT_DIR": f"{s.storage.fsx_mount_point}/{root}",
        "FTFLEET_CKPT_URI": f"s3://{ctx.primary_bucket}/{root}",
        "FTFLEET_CKPT_REPLICA_URI": f"s3://{ctx.replica_bucket}/{root}",
        # The FSx association exports every committed file to FTFLEET_CKPT_URI.
        "FTFLEET_CKPT_UPLOAD": "fsx-export",
        "FTFLEET_NNODES": f"{min_nodes}:{nodes}",
        "FTFLEET_NPROC_PER_NODE": str(s.fleet.gpus_per_node),
        "FTFLEET_RDZV_ENDPOINT": f"{ctx.coordinator_host}:{RDZV_PORT}",
        "FTFLEET_NODE_ID": node_id,
        "FTFLEET_REGION": s.region,
        "FTFLEET_REPLICA_REGION": s.replica_region,
        "FTFLEET_METADATA_ENDPOINT": contract.DEFAULT_METADATA_ENDPOINT[s.cloud],
        "FTFLEET_METRICS_PORT": str(METRICS_PORT),
    }


def render(s: Settings, ctx: NodeContext) -> str:
    env_lines = "\n".join(f"{k}={v}" for k, v in trainer_env(s, ctx).items())
    efa = "--device=/dev/infiniband" if s.fleet.efa_enabled else ""
    # Exit codes that mean "do not restart here" (contract): the node is going away,
    # or a human must look.
    no_restart = " ".join(str(c) for c in (contract.EXIT_PREEMPTED, contract.EXIT_UNRECOVERABLE, contract.EXIT_CONFIG))
    # systemd must give the trainer the whole lifecycle-hook window to checkpoint.
    stop_timeout = s.fleet.termination_hook_seconds - 10
    publish = ""
    if ctx.role == "coordinator":
        publish = f"""
# Publish this node as the coordinator (see infra/aws/userdata.py for why DNS).
cat > /tmp/coordinator-record.json <<JSON
{{"Changes": [{{"Action": "UPSERT", "ResourceRecordSet": {{"Name": "{ctx.coordinator_host}",
  "Type": "A", "TTL": 10, "ResourceRecords": [{{"Value": "$PRIVATE_IP"}}]}}}}]}}
JSON
aws route53 change-resource-record-sets --hosted-zone-id {shlex.quote(ctx.zone_id)} \\
  --change-batch file:///tmp/coordinator-record.json
"""
    mount = s.storage.fsx_mount_point
    return f"""#!/bin/bash
# ftfleet {ctx.role} node ({s.name}); rendered by infra/aws/userdata.py.
set -euo pipefail
imds() {{
  local token
  token=$(curl -sf -X PUT http://169.254.169.254/latest/api/token \\
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
  curl -sf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}}
INSTANCE_ID=$(imds instance-id)
PRIVATE_IP=$(imds local-ipv4)
export AWS_DEFAULT_REGION={shlex.quote(s.region)}

# Fast checkpoint tier: FSx for Lustre.
if ! command -v mount.lustre >/dev/null; then
  apt-get update -y && apt-get install -y "lustre-client-modules-$(uname -r)"
fi
mkdir -p {mount}
{fstab_line(ctx, mount)}
mount {mount} || mount -a
mkdir -p {mount}/{checkpoint_root(s)}
chown {contract.TRAINER_UID}:{contract.TRAINER_UID} {mount}/{checkpoint_root(s)}
{publish}
# Trainer image.
aws ecr get-login-password | docker login --username AWS --password-stdin {shlex.quote(ctx.registry_host)}
docker pull {shlex.quote(ctx.image_uri)}

mkdir -p /etc/ftfleet
cat > {ENV_FILE} <<ENV
{env_lines}
ENV

# Quoted: systemd, not bash, expands ${{FTFLEET_*}} from the EnvironmentFile.
cat > /etc/systemd/system/{SERVICE}.service <<'UNIT'
[Unit]
Description=ftfleet trainer ({ctx.role})
After=docker.service network-online.target {mount.strip("/").replace("/", "-")}.mount
Requires=docker.service

[Service]
EnvironmentFile={ENV_FILE}
ExecStartPre=-/usr/bin/docker rm -f {SERVICE}
ExecStart=/usr/bin/docker run --rm --name {SERVICE} --gpus all --network host --ipc host \\
  --ulimit memlock=-1 --ulimit stack=67108864 {efa} --env-file {ENV_FILE} \\
  -v {mount}:{mount} {ctx.image_uri}
ExecStop=/usr/bin/docker stop --time {stop_timeout} {SERVICE}
TimeoutStopSec={stop_timeout + 5}
Restart=on-failure
RestartSec=5
RestartPreventExitStatus={no_restart}

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now {SERVICE}.service
"""
