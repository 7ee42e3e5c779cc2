"""What a capacity watch decides from its measures, on both clouds
(lambdas/capacity_watch, lambdas/gcp_capacity_watch)."""

from __future__ import annotations


def decision(longest_s: float, loss_s: float, short_nodes: int) -> tuple[str, str]:
    """(decision, log level): ``capacity-lost`` once a group has been short for want of
    capacity for ``loss_s``; ``short`` while nodes are missing for another reason (or
    not yet that long); ``ok`` with every group full."""
    if longest_s >= loss_s:
        return "capacity-lost", "WARNING"
    if short_nodes:
        return "short", "INFO"
    return "ok", "INFO"
