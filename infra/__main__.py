"""Entry point of `pulumi up` (Pulumi.yaml: main: infra/)."""

import pulumi

from ftfleet.errors import ConfigError
from ftfleet.infra import config, program

try:
    settings = config.load()
except ConfigError as exc:
    # One line, no traceback: RunError is Pulumi's "report and exit cleanly".
    raise pulumi.RunError(str(exc)) from None

program.build(settings)
