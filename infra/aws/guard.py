"""The creation guard: a run that would replace stored data stops before it starts.

See infra/creation.py for what is recorded and compared. The program reads its own
stack's last outputs through a StackReference (on a stack never deployed they are
empty, and the guard passes) and makes both providers wait for the comparison, so
that no resource is created or changed when it fails.
"""

from __future__ import annotations

import pulumi

from ftfleet.errors import ConfigError
from ftfleet.infra import creation
from ftfleet.infra.settings import Settings


def creation_guard(s: Settings) -> pulumi.Output[dict]:
    """This run's creation-only settings, once checked against the stack's last
    deployment; fails the run with one line if a change would replace a bucket, a key
    or the file system."""
    own = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    previous = pulumi.StackReference(f"{s.name}-previous", stack_name=own).get_output(creation.OUTPUT)
    current = creation.recorded(s)

    def verify(before):
        try:
            creation.check(before, current, s.cloud)
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None  # one line, no traceback
        return current

    return previous.apply(verify)
