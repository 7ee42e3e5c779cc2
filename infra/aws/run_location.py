"""Where the run trains, read at `pulumi up` from its run lease, so that a deployment
does not undo a failover.

A failover moves the run out of a stack by setting its groups to 0 outside the program
(lambdas/common/move.py). The standby's groups ignore their sizes after creation, but a
home's take their configured sizes at every `pulumi up`: run after a failover, it would
boot the home's nodes again, to wait fenced by the lease, billed. So the home's program
reads the run lease first: when it names another holder and is current, the run trains
there, and the home's groups are held at 0 (as when the image is not pushed yet) until
a failback moves the run home again.

Read with two data sources (``aws.s3.getObjects``, then ``aws.s3.getObject``), which
run at preview and update alike: the listing first, as a missing lease (a first
deployment, a run not started) must not fail the deployment; then the object, with
``download_body`` so that its bytes come whatever its content type (``body`` alone
comes only for text and JSON types).
"""

from __future__ import annotations

import time

import pulumi
import pulumi_aws as aws

from ftfleet.infra.run_lease import other_holder


def trains_elsewhere(bucket: pulumi.Input[str], key: str, holder: str, provider: aws.Provider) -> pulumi.Output[str]:
    """The holder the run trains with when it is another stack's (``other_holder``),
    read from ``s3://<bucket>/<key>`` at this `pulumi up`."""
    opts = pulumi.InvokeOutputOptions(provider=provider)
    listed = aws.s3.get_objects_output(bucket=bucket, prefix=key, max_keys=1, opts=opts)

    def read(keys: list[str] | None) -> pulumi.Output[str] | str:
        if key not in (keys or []):
            return ""
        body = aws.s3.get_object_output(bucket=bucket, key=key, download_body="true", opts=opts).body_base64
        return body.apply(lambda data: other_holder(data, holder, time.time()))

    return listed.keys.apply(read)
