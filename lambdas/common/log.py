"""One structured JSON line per decision, on stdout (where Lambda and Cloud Functions
collect it), so that a log query can count decisions by kind, stack or resource."""

from __future__ import annotations

import datetime
import json
import sys
from typing import IO, Any


class DecisionLog:
    """Writes decisions of one invocation; every line carries the same context fields."""

    def __init__(self, stream: IO[str] | None = None, **context: Any):
        self._stream = stream
        self.context = context

    def decision(self, decision: str, level: str = "INFO", **fields: Any) -> dict[str, Any]:
        """Log ``decision`` with ``fields``; returns the record (handlers return it)."""
        record = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "level": level,
            **self.context,
            "decision": decision,
            **fields,
        }
        stream = self._stream or sys.stdout
        stream.write(json.dumps(record, default=str, sort_keys=False) + "\n")
        stream.flush()
        return record
