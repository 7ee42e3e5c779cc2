#!/bin/bash
# Startup script of every ftfleet GPU node on GCP (instance metadata `startup-script`;
# Compute Engine runs it as root at every boot). In order: read the node's name from
# the metadata server; start the node health agent (what auto-healing probes, from
# boot to shutdown); install what the node image lacks (Docker, the NVIDIA container
# toolkit, the file system's client); mount the checkpoint file system; make the
# checkpoint directory writable for the trainer's uid; pull the trainer image; write
# the trainer's environment; start the trainer as a systemd service (after the mounts,
# at every boot: it is not enabled), as a node of the job (every node, the coordinator
# too). Under the in-process launcher the coordinator first starts the job's stores,
# $STORES_SERVICE (the image's `stores`): it is on demand, and the stores must outlive
# every training node. Before installing anything it turns off unattended
# upgrades and holds the kernel and NVIDIA packages. A step that fails
# (after its retries) stops the script: the agent then reports the node unhealthy (no
# mount, no container runtime) and auto-healing replaces it after its initial delay,
# which bounds how fast a broken image can churn the fleet. The agent never looks at
# the trainer: a node between runs or in rendezvous is healthy.
#
# Rendered by infra/gcp/boot.py (values header: infra/bootscript.py). Every path the
# script writes starts with $ROOT: empty on a node, a temporary directory in tests.
# ftfleet-params: ROOT ROLE LAUNCHER SERVICE STORES_SERVICE HEALTH_SERVICE HEALTH_AGENT HEALTH_PORT GPUS IMAGE_URI REGISTRY_HOST STORAGE_KIND MOUNT_SOURCE MOUNT_POINT CKPT_DIR RUN_ROOT TRAINER_UID SHM_DIR SHM_SIZE TRAINER_ENV STOP_SECONDS NO_RESTART_EXIT_CODES ATTEMPTS RETRY_SECONDS
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

METADATA=http://metadata.google.internal/computeMetadata/v1
# Managed Lustre: "Connect from Compute Engine" (Google's client packages per kernel).
LUSTRE_KEY=https://us-apt.pkg.dev/doc/repo-signing-key.gpg
LUSTRE_REPO=https://us-apt.pkg.dev/projects/lustre-client-binaries
# Parallelstore: "Connect from Compute Engine" (DAOS client).
DAOS_KEY=https://us-central1-apt.pkg.dev/doc/repo-signing-key.gpg
DAOS_REPO="https://us-central1-apt.pkg.dev/projects/parallelstore-packages v2-6-deb main"
# NVIDIA container toolkit: NVIDIA's apt repository.
NVIDIA_KEY=https://nvidia.github.io/libnvidia-container/gpgkey
NVIDIA_REPO="https://nvidia.github.io/libnvidia-container/stable/deb/\$(ARCH) /"

log() { echo "ftfleet-startup[$ROLE]: $*" >&2; }
# A failed boot tells the health agent, which then reports the node unhealthy: the
# marker lives in /run, so a reboot (and this script running again) starts clean.
BOOT_FAILED="$ROOT/run/ftfleet/boot-failed"
boot_failed() {
  log "failed at line $1: $2"
  mkdir -p "$(dirname "$BOOT_FAILED")"
  # The first failure is the cause; what fails after it (the trap on the caller) is not.
  [[ -e $BOOT_FAILED ]] || echo "startup script failed at line $1: $2" >"$BOOT_FAILED"
}
trap 'boot_failed "$LINENO" "$BASH_COMMAND"' ERR
rm -f "$BOOT_FAILED"

metadata() {
  curl -sSf --retry 5 --retry-connrefused --max-time 10 -H "Metadata-Flavor: Google" "$METADATA/$1"
}

# retry CMD ARGS...: run until it succeeds, at most $ATTEMPTS times, waiting longer each time.
retry() {
  local attempt=1
  until "$@"; do
    if ((attempt >= ATTEMPTS)); then
      boot_failed "$LINENO" "giving up after $attempt attempts: $*"
      return 1
    fi
    log "attempt $attempt of $ATTEMPTS failed: $*"
    sleep $((RETRY_SECONDS * attempt))
    attempt=$((attempt + 1))
  done
}

# add_apt_repo NAME KEY_URL SOURCE: a signed apt source, its key under /etc/apt/keyrings.
add_apt_repo() {
  mkdir -p "$ROOT/etc/apt/keyrings" "$ROOT/etc/apt/sources.list.d"
  curl -sSfL "$2" | gpg --dearmor --yes -o "$ROOT/etc/apt/keyrings/$1.gpg"
  echo "deb [signed-by=/etc/apt/keyrings/$1.gpg] $3" >"$ROOT/etc/apt/sources.list.d/$1.list"
}

codename() {
  # shellcheck source=/dev/null
  (. "$ROOT/etc/os-release" && echo "${UBUNTU_CODENAME:-${VERSION_CODENAME:-}}")
}

NODE_ID=$(metadata instance/name)
# The trainer's events.jsonl and summary.json: one directory per node on the fast tier,
# which outlives the container and the VM's boot disk.
RUN_DIR="$RUN_ROOT/$NODE_ID"
log "node $NODE_ID: preparing ($STORAGE_KIND at $MOUNT_POINT, image $IMAGE_URI)"

# --- the node health agent ------------------------------------------------------
# Enabled, so systemd starts it at every boot before this script runs again.
mkdir -p "$ROOT/usr/local/lib/ftfleet" "$ROOT/etc/systemd/system"
base64 -d <<<"$HEALTH_AGENT" >"$ROOT/usr/local/lib/ftfleet/node_health.py"
cat >"$ROOT/etc/systemd/system/$HEALTH_SERVICE.service" <<UNIT
[Unit]
Description=ftfleet node health agent (auto-healing probes it)
Wants=network-online.target
After=network-online.target

[Service]
Environment=FTFLEET_HEALTH_PORT=$HEALTH_PORT
Environment=FTFLEET_HEALTH_GPUS=$GPUS
Environment=FTFLEET_HEALTH_MOUNT=$MOUNT_POINT
Environment=FTFLEET_HEALTH_BOOT_FAILED=/run/ftfleet/boot-failed
ExecStart=/usr/bin/python3 /usr/local/lib/ftfleet/node_health.py
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now "$HEALTH_SERVICE.service"

# --- no package changes under a running job ------------------------------------
# Ubuntu's unattended upgrades would replace the NVIDIA userspace under a loaded
# driver, or install a kernel the Lustre client has no module for. The node's
# packages stay as the pinned image (and this script) left them: the periodic apt
# jobs are off and the kernel and NVIDIA packages are held.
for unit in unattended-upgrades.service apt-daily.timer apt-daily-upgrade.timer; do
  systemctl disable --now "$unit" 2>/dev/null || log "$unit: not present"
done
# shellcheck disable=SC2016 # dpkg-query's own ${field} syntax, not the shell's
mapfile -t held < <(dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' \
  'linux-image-*' 'linux-modules-*' 'linux-headers-*' 'linux-gcp*' '*nvidia*' 2>/dev/null |
  awk '$1 == "ii" { print $2 }')
if ((${#held[@]})); then
  apt-mark hold "${held[@]}" >/dev/null
fi

# --- packages: one apt run for everything missing ------------------------------
packages=()
configure_nvidia=false
if ! command -v docker >/dev/null; then
  packages+=(docker.io)
fi
if ! command -v nvidia-ctk >/dev/null; then
  add_apt_repo nvidia-container-toolkit "$NVIDIA_KEY" "$NVIDIA_REPO"
  packages+=(nvidia-container-toolkit)
  configure_nvidia=true
fi
case "$STORAGE_KIND" in
  managed-lustre)
    # Google builds the client's module for specific kernels. An existing mount.lustre
    # proves nothing after a kernel change: the module for the running kernel does.
    if ! modinfo -k "$(uname -r)" lustre >/dev/null 2>&1; then
      add_apt_repo lustre-client "$LUSTRE_KEY" "$LUSTRE_REPO lustre-client-ubuntu-$(codename) main"
      packages+=("lustre-client-modules-$(uname -r)" lustre-client-utils)
    fi
    ;;
  parallelstore)
    if ! command -v dfuse >/dev/null; then
      add_apt_repo parallelstore "$DAOS_KEY" "$DAOS_REPO"
      packages+=(daos-client)
    fi
    ;;
  *)
    log "unknown storage kind $STORAGE_KIND"
    exit 2
    ;;
esac
if ((${#packages[@]})); then
  retry apt-get -o DPkg::Lock::Timeout=300 update -y
  retry apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${packages[@]}"
fi
if [[ $configure_nvidia == true ]]; then
  nvidia-ctk runtime configure --runtime=docker
  systemctl restart docker
fi

# --- the checkpoint file system --------------------------------------------------
mkdir -p "$ROOT$MOUNT_POINT"
if grep -qs " $ROOT$MOUNT_POINT " /proc/mounts; then
  log "$MOUNT_POINT is already mounted"
elif [[ $STORAGE_KIND == managed-lustre ]]; then
  modprobe lustre
  retry mount -t lustre -o noatime,flock "$MOUNT_SOURCE" "$ROOT$MOUNT_POINT"
else
  iface=$(ip -o -4 route show to default | awk '{print $5; exit}')
  mkdir -p "$ROOT/etc/daos"
  {
    printf 'access_points: ['
    IFS=, read -ra points <<<"$MOUNT_SOURCE"
    first=true
    for point in "${points[@]}"; do
      if [[ $first == true ]]; then first=false; else printf ', '; fi
      printf "'%s'" "$point"
    done
    printf ']\n'
    printf 'transport_config:\n  allow_insecure: true\n'
    printf 'fabric_ifaces:\n- numa_node: 0\n  devices:\n  - iface: %s\n    domain: %s\n' "$iface" "$iface"
  } >"$ROOT/etc/daos/daos_agent.yml"
  systemctl enable --now daos_agent.service
  threads=$(nproc)
  retry dfuse -m "$ROOT$MOUNT_POINT" --pool default-pool --container default-container \
    --disable-wb-cache --multi-user --thread-count="$threads" --eq-count=$(((threads + 1) / 2))
fi
mkdir -p "$ROOT$CKPT_DIR" "$ROOT$RUN_DIR"
chown "$TRAINER_UID:$TRAINER_UID" "$ROOT$CKPT_DIR" "$ROOT$RUN_ROOT" "$ROOT$RUN_DIR"

# --- the in-memory snapshots' RAM file system ------------------------------------
# FTFLEET_SHM_DIR, on huge pages: a new snapshot file is allocated and mapped about 8x
# faster than in /dev/shm (4 KiB pages). It outlives the container, not the node.
mkdir -p "$ROOT$SHM_DIR"
shm_opts="size=$SHM_SIZE,mode=0700,uid=$TRAINER_UID,gid=$TRAINER_UID"
if grep -qs " $ROOT$SHM_DIR " /proc/mounts; then
  log "$SHM_DIR is already mounted"
elif ! mount -t tmpfs -o "huge=within_size,$shm_opts" ftfleet-shm "$ROOT$SHM_DIR"; then
  log "the kernel refused huge pages for $SHM_DIR: 4 KiB pages"
  mount -t tmpfs -o "$shm_opts" ftfleet-shm "$ROOT$SHM_DIR"
fi

# --- the trainer image -----------------------------------------------------------
registry_login() {
  local token
  token=$(metadata instance/service-accounts/default/token |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')
  printf '%s' "$token" | docker login --username oauth2accesstoken --password-stdin "https://$REGISTRY_HOST"
}
retry registry_login
retry docker pull "$IMAGE_URI"

# --- the trainer service ---------------------------------------------------------
mkdir -p "$ROOT/etc/ftfleet" "$ROOT/etc/systemd/system"
{
  printf '%s\n' "$TRAINER_ENV"
  printf 'FTFLEET_NODE_ID=%s\n' "$NODE_ID"
  printf 'FTFLEET_RUN_DIR=%s\n' "$RUN_DIR"
} >"$ROOT/etc/ftfleet/trainer.env"

units=("$SERVICE.service")
stores_deps=""
if [[ $ROLE == coordinator && $LAUNCHER == inprocess ]]; then
  # Wants, not Requires: a restart of the stores does not stop the trainer; its
  # launcher finds out from the stores themselves.
  units=("$STORES_SERVICE.service" "$SERVICE.service")
  stores_deps=" $STORES_SERVICE.service"
  cat >"$ROOT/etc/systemd/system/$STORES_SERVICE.service" <<UNIT
[Unit]
Description=ftfleet: the job's stores (in-process launcher)
Wants=network-online.target
After=docker.service network-online.target
Requires=docker.service
StartLimitIntervalSec=0

[Service]
ExecStartPre=-/usr/bin/docker rm -f $STORES_SERVICE
ExecStart=/usr/bin/docker run --rm --init --name $STORES_SERVICE --network host \\
  --env-file /etc/ftfleet/trainer.env $IMAGE_URI stores
ExecStop=/usr/bin/docker stop $STORES_SERVICE
Restart=always
RestartSec=5
UNIT
fi

# Started by this script, never enabled: at boot systemd would start it before this
# script mounts the file system, and /ckpt would be a directory on the boot disk. The
# conditions keep a restart from running it on an unmounted node.
cat >"$ROOT/etc/systemd/system/$SERVICE.service" <<UNIT
[Unit]
Description=ftfleet trainer ($ROLE)
Wants=network-online.target$stores_deps
After=docker.service network-online.target$stores_deps
Requires=docker.service
RequiresMountsFor=$MOUNT_POINT
ConditionPathIsMountPoint=$MOUNT_POINT
ConditionPathIsMountPoint=$SHM_DIR

[Service]
ExecStartPre=-/usr/bin/docker rm -f $SERVICE
ExecStart=/usr/bin/docker run --rm --init --name $SERVICE --gpus all --network host --ipc host \\
  --ulimit memlock=-1 --ulimit stack=67108864 --env-file /etc/ftfleet/trainer.env \\
  -v $MOUNT_POINT:$MOUNT_POINT -v $SHM_DIR:$SHM_DIR $IMAGE_URI
ExecStop=/usr/bin/docker stop --time $STOP_SECONDS $SERVICE
TimeoutStopSec=$((STOP_SECONDS + 5))
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=$NO_RESTART_EXIT_CODES
UNIT
systemctl daemon-reload
systemctl start "${units[@]}"
log "node $NODE_ID: ${units[*]} started"
