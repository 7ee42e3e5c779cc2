"""Pollers of the clouds' instance metadata services, one daemon thread each.

* **AWS IMDSv2**: a session token from ``PUT /latest/api/token`` (TTL header), then
  ``GET /latest/meta-data/spot/instance-action`` (404: no interruption),
  ``GET /latest/meta-data/events/recommendations/rebalance`` (404: none) and
  ``GET /latest/meta-data/autoscaling/target-lifecycle-state`` (``Terminated``: the
  Auto Scaling group is terminating the instance; 404 outside a group), polled.
* **GCP**: ``instance/preempted`` and ``instance/maintenance-event`` (header
  ``Metadata-Flavor: Google``), each long-polled with ``wait_for_change`` and
  ``last_etag``.

Each poller hands :class:`~trainer.resilience.notices.notice.Notice` objects to a ``report``
callable and never holds the watcher's lock during I/O. An unreachable endpoint is
logged once, retried with exponential backoff, and logged again when it answers.
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource

if TYPE_CHECKING:
    from ftfleet.trainer.resilience.notices.watcher import WatcherConfig

log = logging.getLogger(__name__)

AWS_TOKEN_PATH = "/latest/api/token"
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
AWS_LIFECYCLE_PATH = "/latest/meta-data/autoscaling/target-lifecycle-state"
#: The group's name as an instance tag (the launch templates allow tags in metadata).
AWS_GROUP_TAG_PATH = "/latest/meta-data/tags/instance/aws:autoscaling:groupName"

GCP_HEADERS = {"Metadata-Flavor": "Google"}
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCP_MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"


class Unreachable(Exception):
    """The endpoint did not answer, or answered something we cannot use."""


class Poller(threading.Thread):
    """A daemon thread that calls ``poll_once`` until stopped, backing off
    exponentially (and logging once) while the endpoint is unreachable."""

    def __init__(
        self, name: str, url: str, config: WatcherConfig, report: Callable[[Notice], None], stop: threading.Event
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.url = url
        self.config = config
        self.report = report
        self.stop_event = stop
        self._failures = 0
        self._conn_lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def poll_once(self) -> float:
        """One round; returns the seconds to wait before the next."""
        raise NotImplementedError

    def http(
        self, method: str, path_and_query: str, headers: Mapping[str, str], timeout_s: float
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request, on a connection :meth:`abort` can cut. http.client, not urllib:
        metadata services are link-local and must never go through an HTTP proxy."""
        url = urllib.parse.urlsplit(self.url + path_and_query)
        cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = cls(url.hostname or "", url.port, timeout=timeout_s)
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            conn.connect()
            # Registered only once connected, and only if stop() has not begun: abort()
            # either sees this connection's socket or this check sees the stop.
            with self._conn_lock:
                if self.stop_event.is_set():
                    raise Unreachable("watcher stopped")
                self._conn = conn
            conn.request(method, target, headers=dict(headers))
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        finally:
            with self._conn_lock:
                self._conn = None
            conn.close()

    def abort(self) -> None:
        """Cut the request in flight (a long poll) so that the thread ends promptly."""
        with self._conn_lock:
            sock = self._conn.sock if self._conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self) -> None:
        delay = 0.0
        backoff = self.config.poll_interval_s
        while not self.stop_event.wait(delay):
            try:
                delay = self.poll_once()
            except Unreachable as exc:
                if self.stop_event.is_set():
                    return
                if self._failures == 0:
                    log.warning(
                        "%s: metadata endpoint %s unreachable (%s); retrying with "
                        "backoff up to %.0fs, notices are missed meanwhile",
                        self.name,
                        self.url,
                        exc,
                        self.config.max_backoff_s,
                    )
                self._failures += 1
                delay = backoff
                backoff = min(backoff * 2, self.config.max_backoff_s)
                continue
            except Exception:  # noqa: BLE001 - a watcher that dies silently is worse
                log.exception("%s: unexpected error; retrying", self.name)
                delay = self.config.max_backoff_s
                continue
            if self._failures:
                log.info(
                    "%s: metadata endpoint %s answers again after %d failed attempts",
                    self.name,
                    self.url,
                    self._failures,
                )
                self._failures = 0
            backoff = self.config.poll_interval_s


class AwsPoller(Poller):
    def __init__(
        self, endpoint: str, config: WatcherConfig, report: Callable[[Notice], None], stop: threading.Event
    ) -> None:
        super().__init__("notice-watcher-aws", endpoint, config, report, stop)
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen: set[tuple[str, bytes]] = set()

    def _get_token(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires:
            ttl = self.config.aws_token_ttl_s
            status, _, body = self.http(
                "PUT", AWS_TOKEN_PATH, {AWS_TOKEN_TTL_HEADER: str(ttl)}, self.config.request_timeout_s
            )
            if status != 200 or not body.strip():
                raise Unreachable(f"IMDSv2 token request returned HTTP {status}")
            self._token = body.decode().strip()
            # Renew well before expiry so a poll never carries a dead token.
            self._token_expires = time.monotonic() + ttl * 0.8
        return self._token

    def _get(self, path: str) -> bytes | None:
        """The body of a metadata item, or None for 404 (item absent)."""
        for _ in range(2):
            status, _, body = self.http(
                "GET", path, {AWS_TOKEN_HEADER: self._get_token()}, self.config.request_timeout_s
            )
            if status == 401:  # token expired or revoked: fetch a new one, once
                self._token = None
                continue
            if status == 404:
                return None
            if status == 200:
                return body
            raise Unreachable(f"GET {path} returned HTTP {status}")
        raise Unreachable(f"GET {path} refused a fresh IMDSv2 token (HTTP 401)")

    def poll_once(self) -> float:
        action = self._get(AWS_INSTANCE_ACTION_PATH)
        if action is not None and (AWS_INSTANCE_ACTION_PATH, action) not in self._seen:
            self._seen.add((AWS_INSTANCE_ACTION_PATH, action))
            self.report(self._termination(action, time.time()))
        rebalance = self._get(AWS_REBALANCE_PATH)
        if rebalance is not None and (AWS_REBALANCE_PATH, rebalance) not in self._seen:
            self._seen.add((AWS_REBALANCE_PATH, rebalance))
            self.report(
                Notice.create(
                    NoticeKind.REBALANCE,
                    NoticeSource.AWS_REBALANCE,
                    self.config.rebalance_budget_s,
                    terminal=False,
                    received_at=time.time(),
                )
            )
        lifecycle = self._get(AWS_LIFECYCLE_PATH)
        if lifecycle is not None and lifecycle.strip() == b"Terminated" and (AWS_LIFECYCLE_PATH, b"") not in self._seen:
            self._seen.add((AWS_LIFECYCLE_PATH, b""))
            log.warning("autoscaling target-lifecycle-state: Terminated (the group is terminating this instance)")
            self.report(
                Notice.create(
                    NoticeKind.TERMINATION,
                    NoticeSource.AWS_LIFECYCLE,
                    self.config.aws_lifecycle_notice_s,
                    received_at=time.time(),
                )
            )
        return self.config.poll_interval_s

    def _termination(self, body: bytes, received: float) -> Notice:
        # {"action": "terminate" | "stop" | "hibernate", "time": "2017-09-18T08:22:00Z"}
        when = None
        try:
            data = json.loads(body)
            moment = datetime.datetime.fromisoformat(str(data["time"]))
            if moment.tzinfo is None:  # IMDS writes UTC ("...Z"); never local time
                moment = moment.replace(tzinfo=datetime.UTC)
            when = moment.timestamp()
            log.warning("spot instance-action: %s at %s", data.get("action"), data["time"])
        except (ValueError, KeyError, TypeError):
            log.warning(
                "spot instance-action with an unreadable body %r: assuming %.0fs",
                body[:200],
                self.config.aws_termination_notice_s,
            )
        return Notice.create(
            NoticeKind.TERMINATION,
            NoticeSource.AWS_SPOT,
            self.config.aws_termination_notice_s,
            received_at=received,
            deadline=when,
        )


class GcpPoller(Poller):
    """Long-polls one metadata key with ``wait_for_change`` and ``last_etag``: the
    server answers at once when the value differs from ``last_etag``, otherwise when
    it changes or after ``timeout_sec``."""

    def __init__(
        self,
        endpoint: str,
        path: str,
        config: WatcherConfig,
        report: Callable[[Notice], None],
        clear: Callable[[NoticeSource], None],
        stop: threading.Event,
    ) -> None:
        super().__init__(f"notice-watcher-gcp-{path.rsplit('/', 1)[-1]}", endpoint, config, report, stop)
        self.path = path
        self.clear = clear
        self._etag: str | None = None
        self._value: str | None = None

    def poll_once(self) -> float:
        url = self.path
        timeout = self.config.request_timeout_s
        if self._etag is not None:
            query = {
                "wait_for_change": "true",
                "last_etag": self._etag,
                "timeout_sec": str(int(self.config.gcp_wait_timeout_s)),
            }
            url += "?" + urllib.parse.urlencode(query)
            timeout += self.config.gcp_wait_timeout_s
        status, headers, body = self.http("GET", url, GCP_HEADERS, timeout)
        # A long poll answers when the value changes: now is when we learnt of it.
        received = time.time()
        if status != 200:
            raise Unreachable(f"GET {self.path} returned HTTP {status}")
        self._etag = headers.get("ETag") or None
        value = body.decode(errors="replace").strip()
        if value != self._value:
            self._value = value
            self._handle(value, received)
        # Without an ETag we cannot long-poll: fall back to plain polling.
        return 0.0 if self._etag else self.config.poll_interval_s

    def _handle(self, value: str, received: float) -> None:
        cfg = self.config
        if self.path == GCP_PREEMPTED_PATH:
            if value.upper() == "TRUE":
                self.report(
                    Notice.create(
                        NoticeKind.TERMINATION,
                        NoticeSource.GCP_PREEMPTED,
                        cfg.gcp_preemption_notice_s,
                        received_at=received,
                    )
                )
            return
        if value.upper() in ("", "NONE"):
            self.clear(NoticeSource.GCP_MAINTENANCE)
            return
        # TERMINATE_ON_HOST_MAINTENANCE ends the VM; MIGRATE_ON_HOST_MAINTENANCE is a
        # live migration: checkpoint early and carry on. Unknown values are treated by
        # the word they contain.
        terminal = "TERMINATE" in value.upper()
        log.warning("maintenance-event: %s", value)
        self.report(
            Notice.create(
                NoticeKind.MAINTENANCE,
                NoticeSource.GCP_MAINTENANCE,
                cfg.gcp_maintenance_notice_s,
                terminal=terminal,
                received_at=received,
            )
        )
