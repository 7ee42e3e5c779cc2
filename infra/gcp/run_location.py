"""Where the run trains, read at `pulumi up` from its run lease, so that a GCP home's
deployment does not undo a failover (as infra/aws/run_location.py does on AWS).

A move sets the home's worker groups to 0 outside the program
(lambdas/common/gcp_fleet.py); the home's program declares their sizes, so a
`pulumi up` after a move would boot its workers again, to wait fenced by the lease,
billed. So the home's program reads the run lease first: when it names another holder
and is current, the home's worker groups are held at 0 until a failback moves the run
home again. (The coordinator group is the per-instance config's, never sized by the
program.)

Read with two data sources, which run at preview and update alike:
``gcp.storage.getBucketObjects`` (the listing first, as a missing lease, a first
deployment or a run not started, must not fail the deployment), then
``gcp.storage.getBucketObjectContent`` (``content_base64``: the bytes whatever their
type).
"""

from __future__ import annotations

import time

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.run_lease import other_holder


def trains_elsewhere(bucket: pulumi.Input[str], key: str, holder: str, provider: gcp.Provider) -> pulumi.Output[str]:
    """The holder the run trains with when it is another stack's (``other_holder``),
    read from ``gs://<bucket>/<key>`` at this `pulumi up`."""
    opts = pulumi.InvokeOutputOptions(provider=provider)
    listed = gcp.storage.get_bucket_objects_output(bucket=bucket, prefix=key, opts=opts)

    def read(objects: list | None) -> pulumi.Output[str] | str:
        if key not in [o.name for o in objects or []]:
            return ""
        body = gcp.storage.get_bucket_object_content_output(bucket=bucket, name=key, opts=opts).content_base64
        return body.apply(lambda data: other_holder(data, holder, time.time()))

    return listed.bucket_objects.apply(read)
