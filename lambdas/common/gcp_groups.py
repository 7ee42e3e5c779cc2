"""Regional managed instance groups through Compute Engine's REST API
(``regionInstanceGroupManagers``), for the functions that watch or move a GCP fleet.

:func:`session` is built on first use: Application Default Credentials with the
read-only scope, or the read-write one for a caller that resizes; where
``FTFLEET_COMPUTE_ENDPOINT`` names another endpoint (tests), no credentials.
:class:`Groups` reads a group's target size, its managed instances and its errors, and
resizes it. The two lists are read page by page (``maxResults``/``pageToken``);
listManagedInstances pages only for a group whose ``listManagedInstancesResults`` is
``PAGINATED``, and answers every instance at once otherwise (the default,
``PAGELESS``): both read the same. A list longer than :data:`PAGES` pages is an error,
never a silently shorter answer.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

COMPUTE = "https://compute.googleapis.com"
READ_ONLY = "https://www.googleapis.com/auth/compute.readonly"
READ_WRITE = "https://www.googleapis.com/auth/compute"
#: Compute Engine's largest page, and the most pages read of one list.
PAGE_SIZE, PAGES = 500, 20
#: Instances that count as the group's nodes: running, no action pending.
READY = ("RUNNING", "NONE")

_sessions: dict[tuple[str, str], Any] = {}


class TooLong(RuntimeError):
    """A list went on past :data:`PAGES` pages."""


def session(scope: str = READ_ONLY) -> tuple[str, Any]:
    """(endpoint, session) for Compute Engine's REST API (module doc)."""
    endpoint = os.environ.get("FTFLEET_COMPUTE_ENDPOINT", COMPUTE).rstrip("/")
    if (endpoint, scope) not in _sessions:
        if endpoint == COMPUTE:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=[scope])
            _sessions[endpoint, scope] = AuthorizedSession(credentials)
        else:
            import requests

            _sessions[endpoint, scope] = requests.Session()
    return endpoint, _sessions[endpoint, scope]


def reset() -> None:
    """Forget sessions (tests change the environment between cases)."""
    _sessions.clear()


class Groups:
    """The regional managed instance groups of one project and region."""

    def __init__(self, project: str, region: str, scope: str = READ_ONLY):
        self.endpoint, self.session = session(scope)
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

    def resize(self, group: str, size: int) -> None:
        """regionInstanceGroupManagers.resize: the group creates or deletes instances
        until it has ``size`` (an operation; the group's instances tell its progress)."""
        response = self.session.post(self._url(group, "resize"), params={"size": size}, timeout=30)
        response.raise_for_status()

    def delete_instances(self, group: str, instances: list[str]) -> None:
        """regionInstanceGroupManagers.deleteInstances: these instances (URLs) go, and
        the group's target size drops by as many; one already gone is skipped."""
        body = {"instances": instances, "skipInstancesOnValidationError": True}
        response = self.session.post(self._url(group, "deleteInstances"), json=body, timeout=30)
        response.raise_for_status()

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
        raise TooLong(f"{url}: more than {PAGES} pages of {PAGE_SIZE}")

    def instances(self, group: str) -> list[Mapping[str, Any]]:
        """Its managed instances (listManagedInstances), running or on their way in or out."""
        return list(self._pages("POST", self._url(group, "listManagedInstances"), "managedInstances"))

    def ready(self, group: str) -> int:
        """Instances RUNNING with no action pending."""
        return sum(1 for i in self.instances(group) if (i.get("instanceStatus"), i.get("currentAction")) == READY)

    def errors(self, group: str) -> Iterator[Mapping[str, Any]]:
        """The group's errors (listErrors), newest first as the API lists them."""
        return self._pages("GET", self._url(group, "listErrors"), "items")
