"""Scheduled: whether the stack's managed instance groups get the nodes they ask for,
and since when they do not, from the groups' own errors; a standby's with
``standbyAutoFailover`` also moves the run.

Cloud Scheduler publishes to the function's topic; any tick will do. For each regional
managed instance group of the stack: the nodes it is short (``targetSize`` less its
instances that are ``RUNNING`` with ``currentAction`` ``NONE``;
regionInstanceGroupManagers.get and .listManagedInstances, lambdas/common/gcp_groups.py),
and, when short, since when it has lacked capacity: the oldest of its errors
(regionInstanceGroupManagers.listErrors) that is a resource availability error
(:func:`is_capacity_error`) newer than the last time this function saw the group not
short. A group short without such an error is booting, not out of capacity. A group
that does not exist (404) is named in ``missing_groups``, and the decision is then
``groups-missing`` (WARNING) where it would be ``ok``.

listErrors keeps no record of when a group was last whole, so the function keeps one: a
JSON object in the run's bucket (``FTFLEET_STATE_KEY``, one per stack: a standby
shares its home's bucket), per group ``last_full`` (epoch seconds it became full again)
and ``since`` (the start of its current shortage for want of capacity, or null),
written, only when it changes, with generation preconditions
(:func:`~ftfleet.lambdas.common.gcp.update_json`). ``since`` is kept while the group
stays short and keeps recording capacity errors (one within :data:`RECENT_S`), so
errors that age out of listErrors do not shorten a shortage; it is cleared when the
group is full again, or short with no recent capacity error (``calm``), and a later
shortage counts only from errors after that (:func:`advance`). A group with no
``last_full`` yet (the first runs after deploy) counts from the oldest capacity error
listErrors still holds: it may err early, never late.

Published per stack (labels stack and run, config.METRICS), at every run:
``capacity_short_nodes`` (every group's shortfall) and ``capacity_short_seconds`` (the
longest a group of the stack has been short for want of capacity, 0 when none is). The
decision is ``capacity-lost`` (WARNING) at or past ``FTFLEET_CAPACITY_LOSS_S``, else
``short`` or ``ok``; the stack's alert policy on the metric tells a person.

A standby with ``standbyAutoFailover`` (config ``failover``) also measures its home's
groups, keeping their shortages in its own state object, and when the region the run
trains in (the side whose main worker group asks for nodes) has been short for want of
capacity for ``FTFLEET_CAPACITY_LOSS_S``, it moves the run to the other side, one step
per run (:func:`~ftfleet.lambdas.common.move.drive`: the steps of `ftfleet failover`),
either way; it runs one instance at a time. Every other stack's watch is read-only
towards the groups.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from ftfleet.lambdas.common import capacity, gcp, move, runtime
from ftfleet.lambdas.common.gcp_groups import READ_ONLY, READ_WRITE, Groups
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.common.pair import Side
from ftfleet.lambdas.gcp_capacity_watch.config import CAPACITY_SHORT_NODES, CAPACITY_SHORT_SECONDS, Config

NAME = "gcp_capacity_watch"
#: The error codes and messages of a zone without the resources asked for, as
#: "Troubleshoot resource availability errors" lists them
#: (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability).
#: A quota error is not one: a quota increase fixes it, moving the run does not.
CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
CAPACITY_MESSAGES = re.compile(
    r"does not have enough resources available to fulfill the request|is currently unavailable in the \S+ zone",
    re.IGNORECASE,
)

#: A shortage counts as for want of capacity while the group has recorded a capacity
#: error this recently (a MIG out of resources keeps trying, and failing, to create).
RECENT_S = 1800.0

clock = runtime.Clock()


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def capacity_errors(groups: Groups, group: str) -> list[float]:
    """When each of the group's resource availability errors happened (epoch seconds)."""
    times = []
    for item in groups.errors(group):
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
    when it had a shortage for capacity, a ``calm``, or none was known (a shortage
    without capacity errors left none to forget). A short one keeps its ``since`` while
    it has a capacity error in the last :data:`RECENT_S`; without one its shortage no
    longer counts as for want of capacity (a stockout that passed while the group was
    short for another reason, a preemption's replacement booting), ``since`` goes and
    ``calm`` records when, so that errors up to then are not counted again. Else a
    ``since`` starts only when the group's newest capacity error after ``last_full`` and
    ``calm`` is within :data:`RECENT_S`, at the oldest of the errors that lead up to it
    with no gap over :data:`RECENT_S` (:func:`shortage_start`): an old stockout that
    cleared between two runs never dates a later shortage. Groups not found are
    forgotten. A document of any other shape is started afresh."""
    known = document.get("groups") if isinstance(document, Mapping) else None
    known = known if isinstance(known, Mapping) else {}
    groups: dict[str, Any] = {}
    for name, (short, errors) in seen.items():
        old = known.get(name) if isinstance(known.get(name), Mapping) else {}
        last_full, since, calm = _number(old.get("last_full")), _number(old.get("since")), _number(old.get("calm"))
        if not short:
            # Written when the group becomes full (after a shortage for capacity, or at
            # first sight), not at every run: the object lives in a versioned bucket.
            fresh = last_full is None or since is not None or calm is not None
            groups[name] = {"last_full": now if fresh else last_full, "since": None}
            continue
        if since is not None and not any(t >= now - RECENT_S for t in errors):
            since, calm = None, now
        if since is None:
            floor = max((t for t in (last_full, calm) if t is not None), default=None)
            since = shortage_start([t for t in errors if floor is None or t > floor], now)
        groups[name] = {"last_full": last_full, "since": since, **({"calm": calm} if calm is not None else {})}
    return {"groups": groups}


def shortage_start(errors: list[float], now: float) -> float | None:
    """The start of the shortage ``errors`` (capacity errors' times) show at ``now``:
    None unless the newest is within :data:`RECENT_S`; else the oldest error reached
    from it going back by gaps of at most :data:`RECENT_S` (a MIG out of resources keeps
    trying and failing)."""
    times = sorted(errors, reverse=True)
    if not times or times[0] < now - RECENT_S:
        return None
    start = times[0]
    for t in times[1:]:
        if start - t > RECENT_S:
            break
        start = t
    return start


def newer_than(document: Any, now: float) -> bool:
    """Whether the state holds a time after ``now``: a later run's."""
    known = document.get("groups") if isinstance(document, Mapping) else None
    if not isinstance(known, Mapping):
        return False
    return any(
        (_number(g.get(k)) or 0.0) > now
        for g in known.values()
        if isinstance(g, Mapping)
        for k in ("last_full", "since", "calm")
    )


def measure(groups: Groups, names: tuple[str, ...] | list[str]) -> tuple[dict[str, tuple[int, list[float]]], list[str]]:
    """Per group found: (nodes short, its capacity errors' times, read only when short);
    and the groups not found."""
    seen: dict[str, tuple[int, list[float]]] = {}
    missing = []
    for name in names:
        target = groups.target_size(name)
        if target is None:
            missing.append(name)
            continue
        short = max(0, target - groups.ready(name)) if target else 0
        seen[name] = (short, capacity_errors(groups, name) if short else [])
    return seen, missing


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    gcp.message(event)  # any tick will do; a malformed message is still dropped
    now = clock.now()
    pair = cfg.failover
    scope = READ_WRITE if pair is not None else READ_ONLY
    seen, missing = measure(Groups(cfg.project, cfg.region, scope), cfg.groups)
    # A standby that moves the run also keeps the home's groups' shortages.
    home = pair.home if pair is not None else None
    home_seen = (
        measure(Groups(home.project, home.region, scope), (home.coordinator_group, *home.worker_groups))[0]
        if home is not None
        else {}
    )

    def change(document: Any) -> tuple[Any, bool]:
        if newer_than(document, now):
            # A later run wrote it already (this one was delayed or redelivered): its
            # times stand; this run's older view of the groups would move them back.
            return document, False
        new = advance(document, {**home_seen, **seen}, now)
        return new, new != document

    state, _ = gcp.update_json(cfg.bucket, cfg.state_key, change)
    seconds: dict[str, float] = {}
    for name, (short, _) in {**home_seen, **seen}.items():
        since = _number((state["groups"].get(name) or {}).get("since"))
        seconds[name] = max(0.0, now - since) if short and since is not None else 0.0
    report = {
        name: {"short": short, "short_for_capacity_s": round(seconds[name], 1)} for name, (short, _) in seen.items()
    }
    longest = max((seconds[name] for name in seen), default=0.0)
    short_nodes = sum(short for short, _ in seen.values())
    labels = {"stack": cfg.stack, "run": cfg.run_id}
    gcp.write_metrics(
        cfg.project, [(CAPACITY_SHORT_NODES, float(short_nodes), labels), (CAPACITY_SHORT_SECONDS, longest, labels)]
    )
    decision, level = capacity.decision(longest, cfg.loss_s, short_nodes)
    if missing and decision == "ok":
        # Nothing measured there is not "ok": a group deleted, or a config naming another.
        decision, level = "groups-missing", "WARNING"
    fields: dict[str, Any] = {"groups": report, "missing_groups": missing, "loss_s": cfg.loss_s}
    if pair is not None:

        def short_for(side: Side) -> float:
            return max((seconds.get(g, 0.0) for g in (side.coordinator_group, *side.worker_groups)), default=0.0)

        fields["failover"] = move.drive(pair, cfg.loss_s, now, short_for)
        decision, level = move.outcome(fields["failover"], decision, level)
    return log.decision(decision, level=level, **fields)


runtime.prime(Config)
