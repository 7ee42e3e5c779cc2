"""Settings a deployed stack cannot change without replacing what holds checkpoints.

S3 sets Object Lock only when it creates a bucket, a file system stays in its subnet
and only grows, and regional resources stay in their region: changing any of these
would make Pulumi replace a bucket, a key or the file system, that is, delete the
checkpoints. `protect=True` on those resources already stops such an update, with a
message about protection; this names the key and the fix before anything changes.

The program exports :func:`recorded` as the stack output ``creation_settings``. The next
run reads the stack's own last outputs (a StackReference to itself, infra/aws/stack.py)
and refuses, in one line, a change of any of them. Pure functions: the tests call them
directly and through the program under mocks (infra/offline.py's previous_outputs).
"""

from __future__ import annotations

import json
from typing import Any

from ftfleet.errors import ConfigError
from ftfleet.infra.settings import PROJECT, Settings

OUTPUT = "creation_settings"


def recorded(s: Settings) -> dict[str, Any]:
    net = s.network
    return {
        "objectLock": s.buckets.object_lock,
        "region": s.region,
        "replicaRegion": s.replica_region,
        # The file system lives in the first zone's subnet (created from vpcCidr, or adopted).
        "fsxZone": net.availability_zones[0],
        "fsxSubnet": net.existing_subnet_ids[0] if net.adopt else "",
        "vpcCidr": "" if net.adopt else net.vpc_cidr,
        "fsxStorageCapacityGiB": s.storage.fsx_storage_capacity_gib,
    }


def _changed(key: str, before: Any, now: Any, what: str) -> ConfigError:
    return ConfigError(
        f"{key} was {json.dumps(before)} when this stack was deployed and is now {json.dumps(now)}; {what}: set it "
        "back, or deploy "
        "the new value as a new stack"
    )


def check(previous: dict[str, Any] | None, current: dict[str, Any], cloud: str = "aws") -> None:
    """Raise ConfigError naming the first key whose change would replace stored data.
    ``previous`` is None for a stack never deployed (or deployed before this record)."""
    if not previous:
        return
    rules = (
        (
            "objectLock",
            f"{PROJECT}:objectLock",
            "S3 sets Object Lock only when it creates a bucket, so both checkpoint buckets would be replaced",
        ),
        ("region", f"{cloud}:region", "every resource would be replaced in the new region, checkpoints included"),
        ("replicaRegion", f"{PROJECT}:replicaRegion", "the replica bucket and its key would be replaced"),
        (
            "fsxZone",
            f"{PROJECT}:availabilityZones[0]",
            "the FSx file system lives in the first zone and would be replaced",
        ),
        ("fsxSubnet", f"{PROJECT}:existingSubnetIds[0]", "the FSx file system would be replaced in the new subnet"),
        ("vpcCidr", f"{PROJECT}:vpcCidr", "the VPC, its subnets and the FSx file system would be replaced"),
    )
    for field, key, what in rules:
        if field in previous and previous[field] != current.get(field):
            raise _changed(key, previous[field], current.get(field), what)
    before, now = previous.get("fsxStorageCapacityGiB"), current.get("fsxStorageCapacityGiB")
    if isinstance(before, (int, float)) and isinstance(now, int) and now < before:
        raise ConfigError(
            f"{PROJECT}:fsxStorageCapacityGiB is {now}, below the {int(before)} GiB the file system has; FSx only "
            f"grows a file system, so shrinking would replace it: set it back to {int(before)} or more"
        )
