"""The drill's local cloud for the tests that need one (moto on 127.0.0.1)."""

from __future__ import annotations

import boto3
import pytest

from drill.cloud import LocalCloud


@pytest.fixture(scope="session")
def cloud():
    with LocalCloud() as c:
        yield c


def client(cloud):
    return boto3.client(
        "s3", endpoint_url=cloud.endpoint_url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


@pytest.fixture
def s3(cloud):
    return client(cloud)


@pytest.fixture
def own_cloud(request):
    """Buckets of the test's own, for tests that delete a bucket or need no neighbours
    (moto keeps one state per process: every server sees every bucket)."""
    name = request.node.name[5:30].replace("_", "-")
    with LocalCloud(primary=f"p-{name}", replica=f"r-{name}") as c:
        yield c


def put_step(s3, cloud, step, payload=b"0123456789" * 100, bucket=None):
    base = f"{cloud.prefix}/step-{step}/"
    s3.put_object(Bucket=bucket or cloud.primary, Key=base + "__0_0.distcp", Body=payload)
    s3.put_object(Bucket=bucket or cloud.primary, Key=base + "manifest.json", Body=b"{}")
