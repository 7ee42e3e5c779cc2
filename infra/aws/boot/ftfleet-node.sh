#!/bin/bash
# ftfleet-node: the node's helper, installed by node.sh as /usr/local/sbin/ftfleet-node,
# and node.sh's library of functions (node.sh sources it).
#
#   ftfleet-node pull            log in to ECR and pull the trainer image, retrying with
#                                backoff for as long as it takes; after PULL_ATTEMPTS
#                                failures it asks once for a replacement (see replace).
#                                ftfleet-image.service runs this before the trainer.
#   ftfleet-node replace REASON  ask the group to replace this node, within the bound
#                                of ftfleet/contract.py (REPLACEMENT_BUDGET per
#                                REPLACEMENT_WINDOW_S per group).
#   ftfleet-node imds PATH       print instance metadata (IMDSv2).
#
# Why a bound: a node that cannot boot costs GPU hours while EC2's health check keeps it
# InService, so it asks to be replaced. But when the cause is shared (the image, the
# AMI, the registry, the file system), every replacement fails the same way and the
# group would churn through launches. Each request is recorded as an object in the
# primary bucket; past the budget a node removes itself without a replacement (the group
# shrinks), and at the group's minimum size it stays up, idle, and says why.
#
# Every path it writes is under $ROOT (empty on a node, a temporary directory in tests).
# ftfleet-params: ROOT ROLE REGION RUN_ID IMAGE_URI REGISTRY_HOST BUCKET REPLACEMENTS_PREFIX REPLACEMENT_BUDGET REPLACEMENT_WINDOW_S PULL_ATTEMPTS
set -Eeuo pipefail

export AWS_DEFAULT_REGION="$REGION"
BOOT_LOG="$ROOT/var/log/ftfleet-boot.log"
mkdir -p "$ROOT/var/log"

log() {
  printf '%s ftfleet-%s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$ROLE" "$*" | tee -a "$BOOT_LOG" >&2
}

# retry ATTEMPTS COMMAND...: run COMMAND until it succeeds, at most ATTEMPTS times,
# waiting 5, 10, 20, 40, then 60 seconds between attempts.
retry() {
  local attempts=$1 delay=5 n=1
  shift
  until "$@"; do
    if [[ $n -ge $attempts ]]; then
      log "giving up after $n attempts: $*"
      return 1
    fi
    log "attempt $n of $attempts failed: $*; next in ${delay}s"
    sleep "$delay"
    n=$((n + 1))
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

imds() {
  local token
  token=$(curl -sf --max-time 5 -X PUT http://169.254.169.254/latest/api/token \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300") || return 1
  curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}

pull() {
  local n=0 delay=15
  while true; do
    n=$((n + 1))
    if aws ecr get-login-password | docker login --username AWS --password-stdin "$REGISTRY_HOST" >/dev/null &&
      docker pull "$IMAGE_URI"; then
      log "pulled $IMAGE_URI (attempt $n)"
      return 0
    fi
    log "pull of $IMAGE_URI failed (attempt $n); next in ${delay}s"
    if [[ $n -eq $PULL_ATTEMPTS ]]; then
      replace "the trainer image $IMAGE_URI could not be pulled in $n attempts (pushed yet? README: First deploy)" ||
        log "still retrying the pull"
    fi
    sleep "$delay"
    delay=$((delay * 2 > 300 ? 300 : delay * 2))
  done
}

# The keys of this group's replacement records in the bound's window, one per line.
recent_replacements() {
  local now=$1 group="$REPLACEMENTS_PREFIX$RUN_ID/$ROLE/" listing key stamp
  listing=$(aws s3api list-objects-v2 --bucket "$BUCKET" --prefix "$group" \
    --start-after "$group$(printf '%010d' $((now - REPLACEMENT_WINDOW_S)))" \
    --query 'Contents[].Key' --output text) || return 1
  for key in $listing; do
    stamp=${key##*/}
    stamp=${stamp%%-*}
    if [[ $stamp =~ ^[0-9]+$ ]] && ((10#$stamp > now - REPLACEMENT_WINDOW_S)); then
      echo "$key"
    fi
  done
}

replace() {
  local reason=$1 id now key keys count
  if ! id=$(imds instance-id); then
    log "cannot read this node's instance id, so it cannot ask for its replacement: $reason"
    return 1
  fi
  now=$(date +%s)
  key="$REPLACEMENTS_PREFIX$RUN_ID/$ROLE/$(printf '%010d' "$now")-$id"
  if ! retry 3 aws s3api put-object --bucket "$BUCKET" --key "$key" >/dev/null; then
    log "cannot record s3://$BUCKET/$key, so cannot count replacements: not asking for one ($reason)"
    return 1
  fi
  if ! keys=$(recent_replacements "$now"); then
    log "cannot list s3://$BUCKET/$REPLACEMENTS_PREFIX$RUN_ID/$ROLE/: not asking for a replacement ($reason)"
    return 1
  fi
  count=$(printf '%s' "$keys" | grep -c . || true)
  if [[ $count -le $REPLACEMENT_BUDGET ]]; then
    log "asking for a replacement ($count of at most $REPLACEMENT_BUDGET for the $ROLE group in ${REPLACEMENT_WINDOW_S}s): $reason"
    retry 3 aws autoscaling set-instance-health --instance-id "$id" --health-status Unhealthy \
      --no-should-respect-grace-period
    return
  fi
  log "not asking for a replacement: $count for the $ROLE group in ${REPLACEMENT_WINDOW_S}s, over the bound of $REPLACEMENT_BUDGET, so the cause is shared: $reason"
  if aws autoscaling terminate-instance-in-auto-scaling-group --instance-id "$id" \
    --should-decrement-desired-capacity >/dev/null; then
    log "leaving the group without a replacement (desired capacity lowered by one; pulumi up --refresh restores it)"
  else
    log "the group is at its minimum size: this node stays up, idle and not replaced; once the cause is fixed: aws autoscaling set-instance-health --instance-id $id --health-status Unhealthy --no-should-respect-grace-period"
  fi
}

main() {
  case "${1:-}" in
    pull) pull ;;
    replace) replace "${2:?replace needs a reason}" ;;
    imds) imds "${2:?imds needs a path}" ;;
    *)
      echo "usage: ftfleet-node pull | replace REASON | imds PATH" >&2
      return 2
      ;;
  esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
