"""A scheduled function (lambdas/) run in the drill's own process, as Lambda would run
it: its configuration and region in the environment, every AWS call to a local
endpoint, an EventBridge Scheduled Event per invocation, and its decision lines (which
a function writes to stdout) in a log file of the drill's. :class:`PushedFunction` runs
a GCP function likewise: Cloud Scheduler's Pub/Sub message as a push request, Cloud
Storage, Compute Engine and Cloud Monitoring at local endpoints.

While it is open, this process's ``AWS_*`` variables are the function's (none of the
user's profile, token or endpoints stays visible to its clients) and are put back when
it closes. The functions cache their clients and configuration per process
(``aws.client``, ``runtime.config``); both caches are cleared on the way in and out.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from drill.cloud import CREDENTIALS

ACCOUNT = "123456789012"


def scheduled_event(t: float, region: str, rule: str) -> dict[str, Any]:
    """The EventBridge Scheduled Event of rule ``rule`` at epoch seconds ``t``."""
    from ftfleet.lambdas.common.events import iso

    return {
        "version": "0",
        "id": f"drill-{t:.3f}",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": iso(t),
        "region": region,
        "resources": [f"arn:aws:events:{region}:{ACCOUNT}:rule/{rule}"],
        "detail": {},
    }


class ScheduledFunction:
    """``with ScheduledFunction(handler, config, region, url, log) as f: f.invoke()``.

    ``handler``: the function's ``handler(event, context)``; ``config``: its config
    dataclass (rendered with ``to_env``)."""

    def __init__(
        self,
        handler: Callable[[Any, Any], dict[str, Any]],
        config: Any,
        region: str,
        endpoint_url: str,
        log_path: Path,
        rule: str = "drill",
    ) -> None:
        self.handler, self.region, self.rule, self.log_path = handler, region, rule, log_path
        self.env = {
            **CREDENTIALS,
            "AWS_DEFAULT_REGION": region,
            "AWS_REGION": region,
            "AWS_ENDPOINT_URL": endpoint_url,
            **config.to_env(),
        }
        self._saved: dict[str, str | None] = {}
        self._log: IO[str] | None = None

    def __enter__(self) -> ScheduledFunction:
        stray = [k for k in os.environ if k.startswith("AWS_") and k not in self.env]
        self._saved = {k: os.environ.get(k) for k in [*self.env, *stray]}
        for k in stray:
            del os.environ[k]
        os.environ.update(self.env)
        _reset_caches()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reset_caches()

    def invoke(self) -> dict[str, Any]:
        """One invocation; the decision it returned. Raises what the function raised
        (Lambda would retry the event; a scheduled one comes again anyway)."""
        assert self._log is not None, "use it in a with block"
        with contextlib.redirect_stdout(self._log):
            return self.handler(scheduled_event(time.time(), self.region, self.rule), None)


def _reset_caches() -> None:
    from ftfleet.lambdas.common import aws, runtime

    aws.reset()
    runtime.reset()


def pushed_message(t: float, subscription: str) -> dict[str, Any]:
    """A Pub/Sub push request's body carrying Cloud Scheduler's (empty) message at ``t``."""
    return {
        "data": {
            "message": {"data": base64.b64encode(b"{}").decode(), "messageId": f"drill-{t:.3f}", "attributes": {}},
            "subscription": subscription,
        }
    }


class PushedFunction(ScheduledFunction):
    """A GCP function: ``env`` names the local endpoints (``STORAGE_EMULATOR_HOST``,
    ``FTFLEET_COMPUTE_ENDPOINT``, ``FTFLEET_MONITORING_ENDPOINT``) and the project."""

    def __init__(self, handler: Callable[..., dict[str, Any]], config: Any, env: dict[str, str], log_path: Path):
        self.handler, self.region, self.rule, self.log_path = handler, "", "", log_path
        self.env = {**env, **config.to_env()}
        self._saved = {}
        self._log = None

    def __enter__(self) -> PushedFunction:
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        _reset_gcp()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a")
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        _reset_gcp()

    def invoke(self) -> dict[str, Any]:
        assert self._log is not None, "use it in a with block"
        with contextlib.redirect_stdout(self._log):
            return self.handler(pushed_message(time.time(), "projects/drill/subscriptions/capacity-watch"))


def _reset_gcp() -> None:
    from ftfleet.lambdas.common import gcp, gcp_groups, runtime

    gcp.reset()
    gcp_groups.reset()
    runtime.reset()
