"""One rank of the agreement test: ``python dist_worker.py RANK WORLD INIT_FILE``.

Runs every scenario with this rank's notice, through agree() on the default group and
on a separate gloo group, and prints {scenario: agreed notice or None} as JSON.
"""

import dataclasses
import json
import sys

import torch.distributed as dist

from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource
from ftfleet.trainer.resilience.preemption.agreement import agree

T = 1_800_000_000.0

SPOT = Notice(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, T + 1, T + 100, True)
SPOT_LATER = Notice(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, T + 0, T + 120, True)
SPOT_SOONER = Notice(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, T + 5, T + 90, True)
REBALANCE = Notice(NoticeKind.REBALANCE, NoticeSource.AWS_REBALANCE, T + 2, T + 50, False)
SIGTERM = Notice(NoticeKind.SIGNAL, NoticeSource.SIGNAL, T + 3, T + 120, True)
MIGRATE = Notice(NoticeKind.MAINTENANCE, NoticeSource.GCP_MAINTENANCE, T + 4, T + 64, False)
TERMINATE = Notice(NoticeKind.MAINTENANCE, NoticeSource.GCP_MAINTENANCE, T + 6, T + 66, True)

#: scenario -> (rank 0's pending notice, rank 1's pending notice)
SCENARIOS = {
    "nothing": (None, None),
    "one_rank_is_terminated": (None, SPOT),
    "terminal_beats_advisory": (REBALANCE, SIGTERM),
    "earliest_deadline": (SPOT_LATER, SPOT_SOONER),
    "terminal_maintenance_wins": (MIGRATE, TERMINATE),
    "advisory_only": (REBALANCE, None),
}


def main() -> None:
    rank, world, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    side_group = dist.new_group(backend="gloo")
    out = {}
    for i, (name, notices) in enumerate(SCENARIOS.items()):
        group = side_group if i % 2 else None
        agreed = agree(notices[rank], group)
        out[name] = (
            None
            if agreed is None
            else {k: (v.value if hasattr(v, "value") else v) for k, v in dataclasses.asdict(agreed).items()}
        )
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
