"""Cross-key rules of an AWS stack that come from AWS's documentation.

settings.parse calls these once the single keys are valid; each raises ConfigError
with one line that names the key to change. Like settings.py, nothing here talks to a
cloud: regions come from the provider's own list, instance facts from catalog.json.
"""

from __future__ import annotations

import difflib
import ipaddress
import re

from ftfleet.errors import ConfigError
from ftfleet.infra import catalog

PROJECT = "ftfleet"

# The partition whose ARNs (arn:aws:...) the program and its policies write.
PARTITION_PREFIXES = {
    "cn-": "aws-cn",
    "us-gov-": "aws-us-gov",
    "us-isob-": "aws-iso-b",
    "us-isof-": "aws-iso-f",
    "us-iso-": "aws-iso",
    "eu-isoe-": "aws-iso-e",
    "eusc-": "aws-eusc",
}

# Addresses AWS keeps in every subnet (network, router, DNS, future use, broadcast).
SUBNET_RESERVED = 5
# Room left in the nodes' subnet for the FSx file servers and endpoint interfaces.
SUBNET_HEADROOM = 32


def known_aws_regions() -> tuple[str, ...]:
    """The regions the installed pulumi-aws knows (its `Region` enum, read offline)."""
    from pulumi_aws import Region  # the provider's list: no network, no credentials

    return tuple(r.value for r in Region)


def partition(region: str) -> str:
    for prefix, name in PARTITION_PREFIXES.items():
        if region.startswith(prefix):
            return name
    return "aws"


def _region_problem(region: str, known: tuple[str, ...]) -> str | None:
    if region in known:
        if partition(region) != "aws":
            return (
                f"is {region!r}, in the {partition(region)} partition; ftfleet writes arn:aws: ARNs and "
                "deploys to the aws partition only"
            )
        return None
    hint = difflib.get_close_matches(region, [r for r in known if partition(r) == "aws"], n=1)
    fix = f"did you mean {hint[0]}?" if hint else "use an AWS region such as us-east-1"
    return (
        f"is {region!r}, which is not an AWS region that pulumi-aws knows; {fix} "
        "(a region newer than the installed pulumi-aws needs a newer pulumi-aws)"
    )


def check_regions(cloud: str, region: str, replica_region: str, known: tuple[str, ...] | None = None) -> None:
    """Each region is blamed on its own key, before anything derived from it (the zones)
    is checked, so a mistyped region is not reported as zones that do not match it."""
    if cloud != "aws":
        return
    known = known_aws_regions() if known is None else known
    problem = _region_problem(region, known)
    if problem:
        raise ConfigError(f"aws:region {problem}")
    problem = _region_problem(replica_region, known)
    if problem:
        raise ConfigError(f"{PROJECT}:replicaRegion {problem}")


def _specs(cloud: str, names: tuple[str, ...]) -> list[catalog.InstanceSpec]:
    return [catalog.instance(cloud, n) for n in names]


def same_generation(cloud: str, generation: str) -> list[str]:
    return [n for n in catalog.instance_names(cloud) if catalog.instance(cloud, n).generation == generation]


def check_fleet_types(cloud: str, coordinator: str, workers: tuple[str, ...], efa: bool) -> None:
    """One GPU generation per job, and with EFA one EFA group.

    Every rank takes part in every step, so a job runs at the pace (and within the
    memory) of its slowest node: H100 and H200 may share a job, A100 and H100 may not.
    EFA traffic between P4d/P4de/DL1 and other instance types is not supported
    (Amazon EC2 User Guide, "Elastic Fabric Adapter": EFA limitations,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html).
    """
    specs = _specs(cloud, workers)
    generations = {s.generation for s in specs}
    if len(generations) > 1:
        listing = ", ".join(f"{s.name} is {s.generation}" for s in specs)
        first = specs[0].generation
        raise ConfigError(
            f"{PROJECT}:workerInstanceTypes mixes GPU generations ({listing}); every step runs at the pace of "
            f"the slowest node, so list types of one generation ({first}: "
            f"{', '.join(same_generation(cloud, first))})"
        )
    generation = specs[0].generation
    coord = catalog.instance(cloud, coordinator)
    if coord.generation != generation:
        raise ConfigError(
            f"{PROJECT}:coordinatorInstanceType is {coordinator} ({coord.generation}) but the workers are "
            f"{generation}; the coordinator trains too, so pick a {generation} type: "
            f"{', '.join(same_generation(cloud, generation))}"
        )
    if efa:
        groups: dict[str, list[str]] = {}
        for s in (coord, *specs):
            groups.setdefault(s.efa_group, []).append(s.name)
        if len(groups) > 1:
            listing = "; ".join(f"{', '.join(dict.fromkeys(names))} ({g or 'none'})" for g, names in groups.items())
            raise ConfigError(
                f"{PROJECT}:workerInstanceTypes mixes types that cannot exchange EFA traffic with efaEnabled "
                f"({listing}); AWS's EFA limitations forbid EFA between P4d/P4de/DL1 and other types, so list "
                "types of one EFA group"
            )


def check_efa_addresses(
    cloud: str, types: tuple[str, ...], max_nodes: int, efa: bool, vpc_cidr: str, adopt: bool
) -> None:
    """Every EFA interface (EFA with ENA) takes a private address in the nodes' subnet,
    one per network card, and a cluster placement group puts every node in one subnet."""
    if cloud != "aws" or not efa or adopt:
        return
    per_node = max(catalog.instance(cloud, t).network_cards for t in types)
    subnet = next(ipaddress.ip_network(vpc_cidr).subnets(new_prefix=20))
    room = subnet.num_addresses - SUBNET_RESERVED - SUBNET_HEADROOM
    if max_nodes * per_node > room:
        raise ConfigError(
            f"{PROJECT}:workerMaxSize allows {max_nodes} nodes with {per_node} EFA interfaces each, "
            f"{max_nodes * per_node} addresses, but a /20 subnet has room for {room}; lower workerMaxSize "
            f"to {room // per_node - 1} or fewer"
        )


#: A tag key an instance with tags in its metadata can carry: letters, digits and
#: + - = . , _ : @; no spaces or slashes; not ".", ".." or "_index" (Amazon EC2 User
#: Guide, "Tag your Amazon EC2 resources", Tag restrictions, and "View tags for your EC2
#: instances using instance metadata"). The fleet's launch templates allow tags in
#: metadata, and every tag reaches the instances.
IMDS_TAG_KEY = re.compile(r"[A-Za-z0-9+\-=._:@,]{1,128}")
IMDS_TAG_KEY_RESERVED = (".", "..", "_index")
#: EC2's limit on a tag value.
TAG_VALUE_MAX = 256


def imds_tag_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an instance tag with tags in instance metadata, or None."""
    if key in IMDS_TAG_KEY_RESERVED:
        return f"{key!r} is reserved in instance metadata"
    if not IMDS_TAG_KEY.fullmatch(key):
        return (
            "an instance tag key in instance metadata has 1-128 letters, digits and + - = . , _ : @ "
            "(no spaces or slashes)"
        )
    return None


FSX_EXPORT = "fsx-export"


def check_object_lock(cloud: str, object_lock: bool, upload_mode: str) -> None:
    """S3 requires Content-MD5 or an additional checksum on every PUT into a bucket with an
    Object Lock default retention (Amazon S3 User Guide, "Object Lock considerations":
    Uploading objects to an Object Lock enabled bucket,
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lock-managing.html).
    The FSx for Lustre guide ("Exporting changes to the data repository",
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/export-changed-data-meta-dra.html)
    documents no such header on its export writes and no support for Object Lock
    buckets, so with the export as the only writer the durable copy could silently
    never happen. Refused until AWS documents it."""
    if cloud == "aws" and object_lock and upload_mode == FSX_EXPORT:
        raise ConfigError(
            f"{PROJECT}:objectLock is true, but on AWS only the FSx data repository association writes "
            "checkpoints to the bucket (FTFLEET_CKPT_UPLOAD=fsx-export) and AWS does not document that FSx "
            "export sends the Content-MD5 or checksum that S3 requires under an Object Lock default "
            "retention; set objectLock: false (versioning and noncurrentVersionExpiryDays keep overwritten "
            "checkpoints)"
        )
