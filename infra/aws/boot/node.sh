#!/bin/bash
# ftfleet node boot script: the EC2 user data of the coordinator and the worker groups.
#
# In order: install the helper ftfleet-node (also this script's functions), read the
# instance's identity, install FSx's Lustre client for the running kernel unless the
# AMI has one, mount the file system, give the image's user its directories, publish
# (coordinator) or wait for (worker) the coordinator's name, then start the trainer
# under systemd: ftfleet-image.service pulls the image with backoff, and
# ftfleet-trainer.service runs it as a node of the job (every node, the coordinator
# too). Under the in-process launcher the coordinator also runs the job's stores,
# ftfleet-stores.service (the image's `stores`), before its trainer: it is on demand,
# and the stores must outlive every training node. A step that still fails after its retries fails the
# boot: the node logs why and asks for its replacement, within the bound that
# ftfleet-node enforces. Log: /var/log/ftfleet-boot.log (and cloud-init-output.log).
#
# Rendered by infra/aws/userdata.py; every path it writes is under $ROOT.
# ftfleet-params: ROOT ROLE LAUNCHER REGION MOUNT_POINT FSX_DNS_NAME FSX_MOUNT_NAME CKPT_DIR MARKER_DIR RUN_ROOT TRAINER_UID SHM_DIR SHM_SIZE TRAINER_ENV IMAGE_URI EFA_ENABLED EFA_DEVICE_DIR ZONE_ID COORDINATOR_HOST RECORD_TTL STOP_TIMEOUT NODE_FINAL_EXITS NODE_HELPER_GZ
set -Eeuo pipefail

# FSx's own apt repository and key (FSx for Lustre guide, "Installing the Lustre client",
# Ubuntu): Ubuntu's archive has no client modules for the AWS kernels.
LUSTRE_KEY_URL=https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc
LUSTRE_REPO=https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu
LUSTRE_KEYRING=/usr/share/keyrings/fsx-ubuntu-public-key.gpg
DNS_WAIT_S=300
HELPER="$ROOT/usr/local/sbin/ftfleet-node"
STEP="install ftfleet-node"
export DEBIAN_FRONTEND=noninteractive
# needrestart would restart services (docker among them) after the install: list only.
export NEEDRESTART_MODE=l
export AWS_DEFAULT_REGION="$REGION"

mkdir -p "$ROOT/usr/local/sbin" "$ROOT/etc/ftfleet" "$ROOT/etc/systemd/system" "$ROOT/var/lib/ftfleet"
# The helper travels gzipped and base64-encoded: EC2 takes at most 16 KiB of user data.
base64 -d <<<"$NODE_HELPER_GZ" | gunzip >"$HELPER"
chmod 0755 "$HELPER"
# shellcheck source=/dev/null
source "$HELPER"

boot_failed() {
  local rc=$1
  if [[ $BASHPID != "$$" ]]; then
    exit "$rc" # a failed command substitution: the main shell reports it
  fi
  trap - ERR
  set +e
  log "BOOT FAILED at step '$STEP' (exit $rc): the trainer was not started"
  replace "boot failed at step '$STEP'"
  exit 1
}
trap 'boot_failed $?' ERR

step() {
  STEP=$1
  log "step: $STEP"
}

# A step's own failure: say why in one line, then fail the boot.
fail() {
  log "$*"
  boot_failed 1
}

install_lustre_client() {
  local kernel codename
  kernel=$(uname -r)
  codename=$(sed -n 's/^VERSION_CODENAME=//p' "$ROOT/etc/os-release")
  if [[ -z $codename ]]; then
    fail "/etc/os-release names no VERSION_CODENAME: FSx's Lustre repository is per Ubuntu release (jammy, noble)"
  fi
  mkdir -p "$ROOT/usr/share/keyrings" "$ROOT/etc/apt/sources.list.d"
  retry 5 curl -fsSL -o "$ROOT/var/lib/ftfleet/fsx-ubuntu-public-key.asc" "$LUSTRE_KEY_URL"
  gpg --batch --yes --dearmor -o "$ROOT$LUSTRE_KEYRING" "$ROOT/var/lib/ftfleet/fsx-ubuntu-public-key.asc"
  echo "deb [signed-by=$LUSTRE_KEYRING] $LUSTRE_REPO $codename main" \
    >"$ROOT/etc/apt/sources.list.d/fsxlustreclientrepo.list"
  # The first boot races unattended-upgrades for apt's locks: retry, and wait for them.
  retry 8 apt-get -o DPkg::Lock::Timeout=120 update -y
  if ! apt-cache show "lustre-client-modules-$kernel" >/dev/null 2>&1; then
    fail "FSx's Lustre repository has no lustre-client-modules-$kernel (it lags new AWS kernels):" \
      "set ftfleet:imageId to an AMI whose kernel it lists (apt-cache search lustre-client-modules)"
  fi
  retry 8 apt-get -o DPkg::Lock::Timeout=120 install -y "lustre-client-modules-$kernel"
}

publish_coordinator() {
  local batch change
  batch=$(printf '{"Comment":"ftfleet coordinator %s","Changes":[{"Action":"UPSERT","ResourceRecordSet":{"Name":"%s","Type":"A","TTL":%s,"ResourceRecords":[{"Value":"%s"}]}}]}' \
    "$INSTANCE_ID" "$COORDINATOR_HOST" "$RECORD_TTL" "$PRIVATE_IP")
  change=$(aws route53 change-resource-record-sets --hosted-zone-id "$ZONE_ID" --change-batch "$batch" \
    --query ChangeInfo.Id --output text) || return 1
  log "published $COORDINATOR_HOST as $PRIVATE_IP ($change); waiting until it is INSYNC"
  timeout "$DNS_WAIT_S" aws route53 wait resource-record-sets-changed --id "$change"
}

# Workers resolve the name until the coordinator has published it. The resolver may
# have cached "no such name" from before that: the zone's SOA keeps that short, and the
# cache is flushed before every try.
coordinator_resolves() {
  resolvectl flush-caches >/dev/null 2>&1 || true
  getent hosts "$COORDINATOR_HOST" >/dev/null
}

step "instance identity"
INSTANCE_ID=$(retry 5 imds instance-id)
PRIVATE_IP=$(retry 5 imds local-ipv4)
RUN_DIR="$RUN_ROOT/$INSTANCE_ID"
log "instance $INSTANCE_ID ($PRIVATE_IP), $ROLE node"

step "Lustre client"
if modinfo lustre >/dev/null 2>&1; then
  log "the AMI already has a Lustre client for $(uname -r)"
else
  install_lustre_client
fi

step "mount FSx for Lustre at $MOUNT_POINT"
fsx_source="$FSX_DNS_NAME@tcp:/$FSX_MOUNT_NAME"
mkdir -p "$ROOT$MOUNT_POINT"
if ! grep -qs " $MOUNT_POINT lustre " "$ROOT/etc/fstab"; then
  # Ubuntu 22.04 has no network.service: order the mount after network-online.target.
  echo "$fsx_source $MOUNT_POINT lustre defaults,noatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network-online.target 0 0" \
    >>"$ROOT/etc/fstab"
fi
retry 6 mount -t lustre -o noatime,flock "$fsx_source" "$ROOT$MOUNT_POINT"

step "directories for uid $TRAINER_UID"
mkdir -p "$ROOT$CKPT_DIR" "$ROOT$MARKER_DIR" "$ROOT$RUN_DIR"
chown "$TRAINER_UID:$TRAINER_UID" "$ROOT$CKPT_DIR" "$ROOT$MARKER_DIR" "$ROOT$RUN_ROOT" "$ROOT$RUN_DIR"

step "snapshot memory at $SHM_DIR"
# The in-memory snapshots' own RAM file system (FTFLEET_SHM_DIR) on huge pages: a new
# snapshot file is allocated and mapped about 8x faster than in /dev/shm (4 KiB pages).
# It outlives the container (a restart restores from it), not the node.
mkdir -p "$ROOT$SHM_DIR"
shm_opts="size=$SHM_SIZE,mode=0700,uid=$TRAINER_UID,gid=$TRAINER_UID"
if ! mount -t tmpfs -o "huge=within_size,$shm_opts" ftfleet-shm "$ROOT$SHM_DIR"; then
  log "the kernel refused huge pages for $SHM_DIR: 4 KiB pages"
  mount -t tmpfs -o "$shm_opts" ftfleet-shm "$ROOT$SHM_DIR"
fi

if [[ $ROLE == coordinator ]]; then
  step "publish $COORDINATOR_HOST"
  retry 5 publish_coordinator
else
  step "find $COORDINATOR_HOST"
  if ! retry 8 coordinator_resolves; then
    log "$COORDINATOR_HOST does not resolve yet; the trainer retries the rendezvous until it does"
  fi
fi

step "trainer service"
{
  printf '%s\n' "$TRAINER_ENV"
  echo "FTFLEET_NODE_ID=$INSTANCE_ID"
  echo "FTFLEET_RUN_DIR=$RUN_DIR"
} >"$ROOT/etc/ftfleet/trainer.env"
devices=""
if [[ $EFA_ENABLED == true ]]; then
  for dev in "$ROOT$EFA_DEVICE_DIR"/uverbs*; do
    if [[ ! -e $dev ]]; then
      fail "efaEnabled is true but $EFA_DEVICE_DIR has no uverbs devices: the AMI did not load the EFA driver"
    fi
    devices+=" --device=${dev#"$ROOT"}"
  done
fi

cat >"$ROOT/etc/systemd/system/ftfleet-image.service" <<UNIT
[Unit]
Description=ftfleet: pull the trainer image, retrying with backoff
Wants=network-online.target
After=network-online.target docker.service
Requires=docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=infinity
ExecStart=/usr/local/sbin/ftfleet-node pull
UNIT

units=(ftfleet-trainer.service)
stores_deps=""
if [[ $ROLE == coordinator && $LAUNCHER == inprocess ]]; then
  # Wants, not Requires: a restart of the stores does not stop the trainer; its
  # launcher finds out from the stores themselves.
  units=(ftfleet-stores.service ftfleet-trainer.service)
  stores_deps=$'\nWants=ftfleet-stores.service\nAfter=ftfleet-stores.service'
  cat >"$ROOT/etc/systemd/system/ftfleet-stores.service" <<UNIT
[Unit]
Description=ftfleet: the job's stores (in-process launcher)
After=ftfleet-image.service docker.service network-online.target
Requires=ftfleet-image.service docker.service
StartLimitIntervalSec=0

[Service]
ExecStartPre=-/usr/bin/docker rm -f ftfleet-stores
ExecStart=/usr/bin/docker run --rm --init --name ftfleet-stores --network host --env-file /etc/ftfleet/trainer.env $IMAGE_URI stores
ExecStop=/usr/bin/docker stop ftfleet-stores
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
fi

cat >"$ROOT/etc/systemd/system/ftfleet-trainer.service" <<UNIT
[Unit]
Description=ftfleet trainer ($ROLE)
After=ftfleet-image.service docker.service network-online.target
Requires=ftfleet-image.service docker.service
RequiresMountsFor=$MOUNT_POINT
StartLimitIntervalSec=0$stores_deps

[Service]
ExecStartPre=-/usr/bin/docker rm -f ftfleet-trainer
ExecStart=/usr/bin/docker run --rm --init --name ftfleet-trainer --gpus all --network host --ipc host --ulimit memlock=-1 --ulimit stack=67108864$devices --env-file /etc/ftfleet/trainer.env -v $MOUNT_POINT:$MOUNT_POINT -v $SHM_DIR:$SHM_DIR $IMAGE_URI
ExecStop=/usr/bin/docker stop --time $STOP_TIMEOUT ftfleet-trainer
TimeoutStopSec=$((STOP_TIMEOUT + 5))
Restart=on-failure
RestartSec=10
RestartPreventExitStatus=$NODE_FINAL_EXITS

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable "${units[@]}"
# --no-block: the pull may wait for an image that is not pushed yet.
systemctl start --no-block "${units[@]}"
trap - ERR
log "boot done; ${units[*]} start once the image is pulled (journalctl -u ftfleet-image -u ftfleet-trainer)"
