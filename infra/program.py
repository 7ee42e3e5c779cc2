"""The Pulumi program: settings in, one cloud's environment out."""

from __future__ import annotations

from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.infra.settings import Settings


def build(settings: Settings | GcpSettings) -> None:
    if settings.cloud == "aws":
        from ftfleet.infra.aws.stack import build as build_aws

        build_aws(settings)
    else:
        from ftfleet.infra.gcp.stack import build as build_gcp

        build_gcp(settings)
