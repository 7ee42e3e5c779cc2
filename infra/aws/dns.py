"""CoordinatorName: the name workers dial, and how long a miss is remembered.

The coordinator writes `coordinator.<zone>` itself at boot (infra/aws/boot/node.sh) and
waits until Route 53 reports the change INSYNC. A worker that asks before that gets "no
such name", and resolvers (systemd-resolved on the node, the VPC resolver) cache that
answer for the zone's SOA negative-caching TTL: the smaller of the SOA record's TTL and
its last field (RFC 2308), 900 s and 86400 s in the SOA Route 53 creates. This component
takes over that SOA record and makes both short, so a worker that asked too early sees
the coordinator seconds after it is published.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_aws as aws

from ftfleet.infra.aws import userdata

#: Route 53's defaults for the other SOA fields: serial, refresh, retry, expire.
SOA_FIELDS = "1 7200 900 1209600"
SOA_TTL = 60
#: A record name as the route53:ChangeResourceRecordSetsNormalizedRecordNames condition
#: key compares it: lowercase, no trailing dot, other characters as \\ooo (octal).
_PLAIN = re.compile(r"[a-z0-9._-]")


def normalized_record_name(name: str) -> str:
    """Route 53 IAM guide, "Normalizing the condition key values"."""
    return "".join(c if _PLAIN.fullmatch(c) else f"\\{ord(c):03o}" for c in name.lower().rstrip("."))


def soa_value(primary_name_server: str, negative_ttl: int) -> str:
    return f"{primary_name_server.rstrip('.')}. awsdns-hostmaster.amazon.com. {SOA_FIELDS} {negative_ttl}"


class CoordinatorName(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        zone: aws.route53.Zone,
        provider: aws.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:CoordinatorName", name, None, opts)
        self.fqdn = zone.name.apply(userdata.coordinator_host)
        # Route 53 creates the zone's SOA; allow_overwrite lets the program own it.
        self.soa = aws.route53.Record(
            f"{name}-soa",
            zone_id=zone.zone_id,
            name=zone.name,
            type="SOA",
            ttl=SOA_TTL,
            records=[zone.primary_name_server.apply(lambda ns: soa_value(ns, userdata.RECORD_TTL))],
            allow_overwrite=True,
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        self.register_outputs({"fqdn": self.fqdn})
