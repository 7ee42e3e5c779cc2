"""Scheduled: whether the stack's managed instance groups get the nodes they ask for,
and since when they do not, from the groups' own errors.

Cloud Scheduler publishes to the function's topic; any tick will do. For each regional
managed instance group of the stack: the nodes it is short (``targetSize`` less its
instances that are ``RUNNING`` with ``currentAction`` ``NONE``;
regionInstanceGroupManagers.get and .listManagedInstances), and, when short, since when
it has lacked capacity: the oldest of its errors (regionInstanceGroupManagers.listErrors)
that is a resource availability error (:func:`is_capacity_error`) newer than the last
time this function saw the group not short. A group short without such an error is
booting, not out of capacity. A group that does not exist (404) is named in
``missing_groups``.

listErrors keeps no record of when a group was last whole, so the function keeps one: a
JSON object in the run's bucket (``FTFLEET_STATE_KEY``, one per stack: a standby
shares its home's bucket), per group ``last_full`` (epoch seconds it became full again)
and ``since`` (the start of its current shortage for want of capacity, or null),
written, only when it changes, with generation preconditions
(:func:`~ftfleet.lambdas.common.gcp.update_json`). ``since`` is kept while the group
stays short, so errors that age out of listErrors do not shorten a shortage, and is
cleared when the group is full again; a later shortage counts only from errors after
that. A group with no ``last_full`` yet (the first runs after deploy) counts from the
oldest capacity error listErrors still holds: it may err early, never late.

Published per stack (labels stack and run, config.METRICS), at every run:
``capacity_short_nodes`` (every group's shortfall) and ``capacity_short_seconds`` (the
longest a group has been short for want of capacity, 0 when none is). The decision is
``capacity-lost`` (WARNING) at or past ``FTFLEET_CAPACITY_LOSS_S``, else ``short`` or
``ok``; the stack's alert policy on the metric tells a person. Read-only towards the
groups: it never resizes, recreates or deletes anything.
"""

from __future__ import annotations

import datetime
import os
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from ftfleet.lambdas.common import capacity, gcp, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.gcp_capacity_watch.config import CAPACITY_SHORT_NODES, CAPACITY_SHORT_SECONDS, Config

NAME = "gcp_capacity_watch"
COMPUTE = "https://compute.googleapis.com"
#: The error codes and messages of a zone without the resources asked for, as
#: "Troubleshoot resource availability errors" lists them
#: (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability).
#: A quota error is not one: a quota increase fixes it, moving the run does not.
CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
CAPACITY_MESSAGES = re.compile(
    r"does not have enough resources available to fulfill the request|is currently unavailable in the \S+ zone",
    re.IGNORECASE,
)
#: Instances that count as the group's nodes; any other status or action is on its way.
READY = ("RUNNING", "NONE")
#: Compute Engine's largest page; listing stops after PAGES pages of a group.
PAGE_SIZE, PAGES = 500, 20

clock = runtime.Clock()
_sessions: dict[str, Any] = {}


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def compute() -> tuple[str, Any]:
    """(endpoint, session) for Compute Engine's REST API, built on first use:
    Application Default Credentials with the read-only scope, or, when
    ``FTFLEET_COMPUTE_ENDPOINT`` names another endpoint (tests), no credentials."""
    endpoint = os.environ.get("FTFLEET_COMPUTE_ENDPOINT", COMPUTE).rstrip("/")
    if endpoint not in _sessions:
        if endpoint == COMPUTE:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/compute.readonly"])
            _sessions[endpoint] = AuthorizedSession(credentials)
        else:
            import requests

            _sessions[endpoint] = requests.Session()
    return endpoint, _sessions[endpoint]


class Groups:
    """The regional managed instance groups of one project and region, read only."""

    def __init__(self, project: str, region: str):
        self.endpoint, self.session = compute()
        self.base = f"{self.endpoint}/compute/v1/projects/{project}/regions/{region}/instanceGroupManagers"

    def _url(self, group: str, verb: str = "") -> str:
        return f"{self.base}/{urllib.parse.quote(group, safe='')}{'/' + verb if verb else ''}"

    def target_size(self, group: str) -> int | None:
        """The group's targetSize; None when it does not exist."""
        response = self.session.get(self._url(group), timeout=30)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return int(response.json().get("targetSize") or 0)

    def _pages(self, method: str, url: str, key: str) -> Iterator[Mapping[str, Any]]:
        token = ""
        for _ in range(PAGES):
            params = {"maxResults": PAGE_SIZE, **({"pageToken": token} if token else {})}
            response = self.session.request(method, url, params=params, timeout=30)
            response.raise_for_status()
            body = response.json()
            yield from (item for item in body.get(key) or [] if isinstance(item, Mapping))
            token = body.get("nextPageToken") or ""
            if not token:
                return

    def ready(self, group: str) -> int:
        """Instances RUNNING with no action pending (listManagedInstances)."""
        return sum(
            1
            for i in self._pages("POST", self._url(group, "listManagedInstances"), "managedInstances")
            if (i.get("instanceStatus"), i.get("currentAction")) == READY
        )

    def capacity_errors(self, group: str) -> list[float]:
        """When each of the group's resource availability errors happened (epoch seconds)."""
        times = []
        for item in self._pages("GET", self._url(group, "listErrors"), "items"):
            when = _epoch(item.get("timestamp"))
            if when is not None and is_capacity_error(item.get("error")):
                times.append(when)
        return times


def is_capacity_error(error: Any) -> bool:
    if not isinstance(error, Mapping):
        return False
    if error.get("code") in CAPACITY_CODES:
        return True
    message = error.get("message")
    return isinstance(message, str) and CAPACITY_MESSAGES.search(message) is not None


def _epoch(raw: Any) -> float | None:
    """An RFC 3339 time (Compute Engine writes local offsets) as epoch seconds, or None."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)).timestamp()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def advance(document: Any, seen: Mapping[str, tuple[int, list[float]]], now: float) -> dict[str, Any]:
    """The state after this run: ``seen`` maps each group found to (nodes short, its
    capacity errors' times). A group full now has no ``since``, and ``last_full`` now
    when it had a shortage for capacity or none was known (a shortage without capacity
    errors left none to forget);
    a short one keeps its ``since``, or starts one at its oldest capacity error after
    ``last_full``. Groups not found are forgotten. A document of any other shape is
    started afresh."""
    known = document.get("groups") if isinstance(document, Mapping) else None
    known = known if isinstance(known, Mapping) else {}
    groups: dict[str, Any] = {}
    for name, (short, errors) in seen.items():
        old = known.get(name) if isinstance(known.get(name), Mapping) else {}
        last_full, since = _number(old.get("last_full")), _number(old.get("since"))
        if not short:
            # Written when the group becomes full (after a shortage for capacity, or at
            # first sight), not at every run: the object lives in a versioned bucket.
            groups[name] = {"last_full": now if last_full is None or since is not None else last_full, "since": None}
            continue
        if since is None:
            after = [t for t in errors if last_full is None or t > last_full]
            since = min(after) if after else None
        groups[name] = {"last_full": last_full, "since": since}
    return {"groups": groups}


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    gcp.message(event)  # any tick will do; a malformed message is still dropped
    now = clock.now()
    groups = Groups(cfg.project, cfg.region)
    seen: dict[str, tuple[int, list[float]]] = {}
    missing = []
    for name in cfg.groups:
        target = groups.target_size(name)
        if target is None:
            missing.append(name)
            continue
        short = max(0, target - groups.ready(name)) if target else 0
        seen[name] = (short, groups.capacity_errors(name) if short else [])

    def change(document: Any) -> tuple[Any, bool]:
        new = advance(document, seen, now)
        return new, new != document

    state, _ = gcp.update_json(cfg.bucket, cfg.state_key, change)
    report: dict[str, Any] = {}
    longest = 0.0
    for name, (short, _) in seen.items():
        since = state["groups"][name]["since"]
        seconds = max(0.0, now - since) if short and since is not None else 0.0
        longest = max(longest, seconds)
        report[name] = {"short": short, "short_for_capacity_s": round(seconds, 1)}
    short_nodes = sum(short for short, _ in seen.values())
    labels = {"stack": cfg.stack, "run": cfg.run_id}
    gcp.write_metrics(
        cfg.project, [(CAPACITY_SHORT_NODES, float(short_nodes), labels), (CAPACITY_SHORT_SECONDS, longest, labels)]
    )
    decision, level = capacity.decision(longest, cfg.loss_s, short_nodes)
    return log.decision(decision, level=level, groups=report, missing_groups=missing, loss_s=cfg.loss_s)


runtime.prime(Config)
