"""AWS clients of the trainer's node-side calls (metrics, the lifecycle action).

Built on first use, never at import (the image runs on GCP too, and tests point
``AWS_ENDPOINT_URL`` at a local server before the first call), with botocore's
``standard`` retries and short timeouts: these calls run beside training or on the
exit path, and a slow answer must cost seconds, not minutes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ftfleet.trainer.environment import TrainerEnvironment

#: Attempts per call, the first included (botocore's standard mode backs off with jitter).
ATTEMPTS = 3
_lock = threading.Lock()


def client(service: str, region: str, *, attempts: int = ATTEMPTS, read_timeout_s: float = 10.0) -> Any:
    """A boto3 client in ``region``; the endpoint follows boto3's own settings
    (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_<SERVICE>``)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": attempts},
        connect_timeout=3,
        read_timeout=read_timeout_s,
    )
    with _lock:  # building clients is not thread-safe in boto3
        return boto3.session.Session().client(service, region_name=region, config=config)


def on_aws(environ: Mapping[str, str] | None = None) -> str | None:
    """The node's region when the trainer runs on AWS (FTFLEET_CLOUD=aws and
    FTFLEET_REGION set), else None: the node-side AWS calls are off."""
    return TrainerEnvironment(environ).aws_region
