#!/bin/bash
# Shutdown script of every ftfleet GPU node on GCP (instance metadata
# `shutdown-script`). Compute Engine runs it when the VM stops or is deleted, a Spot
# preemption included, and powers the VM off 30 s later on Spot (120 s for standard
# VMs). It hands the shutdown to the trainer: `docker stop` delivers SIGTERM, which the
# image's entrypoint passes to torchrun and the trainer turns into an emergency
# checkpoint and its commit marker; the script then waits for the container within
# the node's budget. The trainer also watches instance/preempted on the metadata
# server (set at the notice, earlier than this script with an extended preemption
# notice) and may be checkpointing already: a second SIGTERM changes nothing.
#
# Rendered by infra/gcp/boot.py (values header: infra/bootscript.py).
# ftfleet-params: ROOT SERVICE STOP_SECONDS
set -uo pipefail

METADATA=http://metadata.google.internal/computeMetadata/v1
log() { echo "ftfleet-shutdown: $*" >&2; }

preempted=$(curl -sSf --max-time 2 -H "Metadata-Flavor: Google" "$METADATA/instance/preempted" || echo UNKNOWN)
log "shutting down (preempted=$preempted)"
mkdir -p "$ROOT/var/log/ftfleet"
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) shutdown preempted=$preempted" >>"$ROOT/var/log/ftfleet/shutdown.log"

if [[ $(docker inspect --format '{{.State.Running}}' "$SERVICE" 2>/dev/null) == true ]]; then
  log "stopping $SERVICE: ${STOP_SECONDS}s for the emergency checkpoint"
  if ! docker stop --time "$STOP_SECONDS" "$SERVICE"; then
    log "docker stop $SERVICE failed"
  fi
else
  log "$SERVICE is not running"
fi
