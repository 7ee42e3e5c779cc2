"""The Pulumi program: settings in, one cloud's environment out."""

from __future__ import annotations

from ftfleet.errors import ConfigError
from ftfleet.infra.settings import Settings


def build(settings: Settings) -> None:
    if settings.cloud == "aws":
        from ftfleet.infra.aws.stack import build as build_aws

        build_aws(settings)
    else:
        raise ConfigError(
            "ftfleet:cloud is gcp, but the GCP environment is not implemented yet; use cloud: aws for now"
        )
