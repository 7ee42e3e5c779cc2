"""Physical names that fit their service's limits, whatever the stack's name.

Names derive from the stack's (``ftfleet-<stack>-...``), which may have up to Pulumi's
100 characters. Two helpers keep every name within what its service accepts
(infra/policies/names.py lists the limits and checks the result):

* :func:`fit` for a name the program sets: unchanged when it fits, else cut and ended
  with a hash of the whole name, so two long names stay apart;
* :func:`generated` for a resource whose name the provider makes up: nothing while
  Pulumi's own name (the logical name, a hyphen, 7 random characters) fits, which
  leaves every stack whose names fit as it was; else a name prefix that, with the 26
  characters the provider appends to a prefix, fits.
"""

from __future__ import annotations

import hashlib

from ftfleet.infra.policies.names import AUTONAME_SUFFIX, LIMITS, PREFIX_SUFFIX

#: The argument that takes a prefix instead of a name, by resource type (the Python
#: argument names of pulumi_aws).
_PREFIX_ARG = {
    "aws:s3/bucket:Bucket": "bucket_prefix",
    "aws:iam/role:Role": "name_prefix",
    "aws:iam/rolePolicy:RolePolicy": "name_prefix",
    "aws:iam/instanceProfile:InstanceProfile": "name_prefix",
    "aws:ec2/launchTemplate:LaunchTemplate": "name_prefix",
}
#: A DNS label's limit (RFC 1035 2.3.4).
DNS_LABEL = 63


def fit(name: str, limit: int) -> str:
    """``name`` if it has at most ``limit`` characters, else its first characters, a
    hyphen and 7 hex characters of its SHA-256."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:7]
    return f"{name[: limit - len(digest) - 1].rstrip('-.')}-{digest}"


def limit_of(type_token: str) -> int:
    return LIMITS[type_token][1]


def generated(type_token: str, logical: str) -> dict[str, str]:
    """Keyword arguments for a resource of ``type_token`` named ``logical`` that the
    provider names: ``{}`` while Pulumi's generated name fits, else a prefix."""
    limit = limit_of(type_token)
    if len(logical) + AUTONAME_SUFFIX <= limit:
        return {}
    prefix = fit(logical, limit - PREFIX_SUFFIX - 1) + "-"
    if type_token == "aws:s3/bucket:Bucket":
        prefix = prefix.lower()
    return {_PREFIX_ARG[type_token]: prefix}
