"""A move's view of an AWS pair (lambdas/common/move.py): Auto Scaling groups, each
side's primary bucket, the lease in the home's, and the move's record in three tags on
the source's worker group (:data:`~ftfleet.lambdas.common.move.TAGS`)."""

from __future__ import annotations

from typing import Any

from ftfleet.lambdas.common import aws, checkpoints
from ftfleet.lambdas.common.move import JOB_WORKERS_TAG, MOVE_SINCE_TAG, MOVE_TO_TAG, TAGS, Fleet, Record, Refused
from ftfleet.lambdas.common.pair import LeaseRef, Side


class AwsFleet(Fleet):
    """Auto Scaling groups; the record in tags on the source's worker group."""

    record_place = f"the tags {', '.join(TAGS)} on the source's worker group"
    _KEYS = {"to": MOVE_TO_TAG, "workers": JOB_WORKERS_TAG, "since": MOVE_SINCE_TAG}

    def _group(self, side: Side, name: str) -> dict[str, Any]:
        asg = aws.client("autoscaling", side.region)
        got = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not got:
            raise Refused(f"{side.stack}'s group {name} is not in {side.region}: run `pulumi up -s {side.stack}`")
        return got[0]

    def sizes(self, side: Side, group: str) -> tuple[int, int, int | None]:
        g = self._group(side, group)
        return int(g["DesiredCapacity"]), int(g["MinSize"]), int(g["MaxSize"])

    def resize(self, side: Side, group: str, size: int) -> str:
        aws.client("autoscaling", side.region).update_auto_scaling_group(
            AutoScalingGroupName=group, MinSize=size, DesiredCapacity=size
        )
        return f"min {size}, desired {size}"

    def listed(self, side: Side, group: str) -> int:
        return len(self._group(side, group).get("Instances", []))

    def record(self, source: Side) -> dict[str, str]:
        tags = aws.tags_of(self._group(source, source.worker_group))
        return {field: tags[key] for field, key in self._KEYS.items() if key in tags}

    def write_record(self, source: Side, record: Record) -> None:
        # Tags take no precondition: a record already there (a concurrent mover's) is
        # kept. One written between this read and the write still wins, and every later
        # step reads what is stored, so two movers go on with the same record.
        if self.record(source).get("to"):
            return
        aws.client("autoscaling", source.region).create_or_update_tags(
            Tags=[
                self._tag(source, self._KEYS[f], v) | {"PropagateAtLaunch": False} for f, v in record.fields().items()
            ]
        )

    def clear_record(self, source: Side) -> None:
        # DeleteTags with a value deletes only a tag of that value: the keys alone.
        aws.client("autoscaling", source.region).delete_tags(Tags=[self._tag(source, k) for k in TAGS])

    @staticmethod
    def _tag(source: Side, key: str, value: str | None = None) -> dict[str, Any]:
        tag = {"ResourceId": source.worker_group, "ResourceType": "auto-scaling-group", "Key": key}
        return tag if value is None else {**tag, "Value": value}

    def checkpoints(self, side: Side) -> checkpoints.CheckpointListing:
        return aws.Checkpoints(side.bucket, side.region, side.root)

    def read_lease(self, lease: LeaseRef) -> tuple[Any, str]:
        doc, _ = aws.read_json(lease.bucket, lease.key, lease.region)
        return doc, f"s3://{lease.bucket}/{lease.key}"
