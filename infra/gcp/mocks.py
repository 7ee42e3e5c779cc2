"""Plausible outputs for GCP resources and invokes under `ftfleet plan`'s mocks.

infra/offline.py calls these for every `gcp:` type. The shapes follow what the GCP
APIs return (ids as resource paths, selfLinks as URLs, service-account emails, bucket
`gs://` URLs), so that values derived from them read as they would after a deploy.
Nothing here is random: the same stack gives the same plan.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from typing import Any

#: Project of the plan when the stack sets no gcp:project.
PLAN_PROJECT = "ftfleet-plan"
PLAN_PROJECT_NUMBER = "123456789012"
COMPUTE = "https://www.googleapis.com/compute/v1"
#: File system addresses come from private services access; the default range of vpcCidr.
SERVICES_RANGE = "10.40.240.0/20"


def _digest(name: str, n: int = 8) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:n]


def _ip(name: str, network: str = "10.250.0.0/16") -> str:
    """A stable address inside ``network`` (not its first or last few)."""
    net = ipaddress.IPv4Network(network)
    return str(net.network_address + 2 + int(_digest(name, 6), 16) % (net.num_addresses - 8))


def new_resource(typ: str, name: str, inputs: dict[str, Any], region: str, project: str | None) -> tuple[str, dict]:
    """(id, outputs) of one GCP resource."""
    outs = dict(inputs)
    project = inputs.get("project") or project or PLAN_PROJECT
    region = inputs.get("region") or region
    outs.setdefault("project", project)
    physical = inputs.get("name") or f"{name}-{_digest(name, 7)}"
    module, kind = typ.split(":")[1].split("/")[0], typ.split(":")[2]
    if module == "compute":
        rid = _compute_id(kind, project, region, physical, inputs)
        outs.setdefault("name", physical)
        outs["selfLink"] = f"{COMPUTE}/{rid}"
        if kind == "RegionInstanceTemplate":
            physical = f"{inputs.get('namePrefix', name)}{_digest(name, 12)}"
            rid = f"projects/{project}/regions/{region}/instanceTemplates/{physical}"
            outs.update(name=physical, selfLink=f"{COMPUTE}/{rid}")
        elif kind == "RegionInstanceGroupManager":
            outs["instanceGroup"] = f"{COMPUTE}/projects/{project}/regions/{region}/instanceGroups/{physical}"
        elif kind == "Address":
            outs.setdefault("address", _ip(name))
        return rid, outs
    if typ == "gcp:storage/bucket:Bucket":
        bucket = inputs.get("name") or f"{name}-{_digest(name, 7)}"
        outs.update(name=bucket, url=f"gs://{bucket}", selfLink=f"https://www.googleapis.com/storage/v1/b/{bucket}")
        outs["projectNumber"] = PLAN_PROJECT_NUMBER
        return bucket, outs
    if typ == "gcp:serviceaccount/account:Account":
        email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
        outs.update(
            email=email,
            member=f"serviceAccount:{email}",
            name=f"projects/{project}/serviceAccounts/{email}",
            uniqueId=str(int(_digest(name, 10), 16)),
        )
        return outs["name"], outs
    if typ == "gcp:artifactregistry/repository:Repository":
        location, repo = inputs["location"], inputs["repositoryId"]
        outs.update(
            name=repo,
            registryUri=f"{location}-docker.pkg.dev/{project}/{repo}",
        )
        return f"projects/{project}/locations/{location}/repositories/{repo}", outs
    if typ == "gcp:lustre/instance:Instance":
        rid = f"projects/{project}/locations/{inputs['location']}/instances/{inputs['instanceId']}"
        outs.update(name=rid, mountPoint=f"{_ip(name, SERVICES_RANGE)}@tcp:/{inputs['filesystem']}", state="ACTIVE")
        return rid, outs
    if typ == "gcp:parallelstore/instance:Instance":
        rid = f"projects/{project}/locations/{inputs['location']}/instances/{inputs['instanceId']}"
        outs.update(name=rid, accessPoints=[_ip(f"{name}-{i}", SERVICES_RANGE) for i in range(3)], state="ACTIVE")
        return rid, outs
    if typ == "gcp:kms/keyRing:KeyRing":
        rid = f"projects/{project}/locations/{inputs['location']}/keyRings/{inputs['name']}"
        return rid, outs
    if typ == "gcp:kms/cryptoKey:CryptoKey":
        rid = f"{inputs['keyRing']}/cryptoKeys/{inputs['name']}"
        return rid, outs
    if typ == "gcp:pubsub/topic:Topic":
        topic = inputs.get("name") or physical
        outs["name"] = topic
        return f"projects/{project}/topics/{topic}", outs
    if typ == "gcp:pubsub/subscription:Subscription":
        sub = inputs.get("name") or physical
        outs["name"] = sub
        return f"projects/{project}/subscriptions/{sub}", outs
    if typ == "gcp:cloudfunctionsv2/function:Function":
        fn, location = inputs.get("name") or physical, inputs.get("location") or region
        rid = f"projects/{project}/locations/{location}/functions/{fn}"
        outs.update(name=fn, url=f"https://{location}-{project}.cloudfunctions.net/{fn}", state="ACTIVE")
        return rid, outs
    if typ == "gcp:logging/projectSink:ProjectSink":
        outs["writerIdentity"] = f"serviceAccount:service-{PLAN_PROJECT_NUMBER}@gcp-sa-logging.iam.gserviceaccount.com"
        return f"projects/{project}/sinks/{inputs.get('name') or physical}", outs
    if typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
        rid = f"projects/{project}/roles/{inputs['roleId']}"
        outs["name"] = rid
        return rid, outs
    if typ == "gcp:projects/serviceIdentity:ServiceIdentity":
        # Google's agents are service-<project number>@gcp-sa-<service>.iam.gserviceaccount.com.
        email = f"service-{PLAN_PROJECT_NUMBER}@gcp-sa-{inputs['service'].split('.')[0]}.iam.gserviceaccount.com"
        outs.update(email=email, member=f"serviceAccount:{email}")
        return f"projects/{project}/services/{inputs['service']}", outs
    if typ == "gcp:servicenetworking/connection:Connection":
        outs["peering"] = "servicenetworking-googleapis-com"
        return f"{inputs.get('network')}:{inputs.get('service')}", outs
    outs.setdefault("etag", _digest(name, 12))
    return f"{name}-id", outs


def _compute_id(kind: str, project: str, region: str, physical: str, inputs: dict) -> str:
    collections = {
        "Network": "global/networks",
        "GlobalAddress": "global/addresses",
        "Firewall": "global/firewalls",
        "Subnetwork": f"regions/{region}/subnetworks",
        "Router": f"regions/{region}/routers",
        "Address": f"regions/{region}/addresses",
        "RegionHealthCheck": f"regions/{region}/healthChecks",
        "RegionInstanceGroupManager": f"regions/{region}/instanceGroupManagers",
    }
    collection = collections.get(kind, f"regions/{region}/{kind[0].lower()}{kind[1:]}s")
    return f"projects/{project}/{collection}/{physical}"


def call(token: str, args: dict[str, Any], project: str | None, objects: dict[str, bytes] | None = None) -> dict | None:
    """Outputs of a GCP invoke, or None when the token is not a GCP one. ``objects``:
    what the deployed buckets hold (``bucket/name`` -> bytes; none by default)."""
    objects = objects or {}
    if token == "gcp:storage/getBucketObjects:getBucketObjects":
        bucket, prefix = args.get("bucket", ""), args.get("prefix", "")
        names = sorted(k.split("/", 1)[1] for k in objects if k.startswith(f"{bucket}/{prefix}"))
        listed = [
            {"name": n, "contentType": "application/json", "mediaLink": "", "selfLink": "", "storageClass": "STANDARD"}
            for n in names
        ]
        return {"bucket": bucket, "prefix": prefix, "bucketObjects": listed, "id": bucket}
    if token == "gcp:storage/getBucketObjectContent:getBucketObjectContent":
        bucket, name = args.get("bucket", ""), args.get("name", "")
        data = objects.get(f"{bucket}/{name}", b"")
        return {
            "bucket": bucket,
            "name": name,
            "content": data.decode(errors="replace"),
            "contentBase64": base64.b64encode(data).decode(),
            "id": name,
        }
    project = args.get("project") or project or PLAN_PROJECT
    if token == "gcp:organizations/getProject:getProject":
        return {"projectId": project, "number": PLAN_PROJECT_NUMBER, "name": project, "id": f"projects/{project}"}
    if token == "gcp:storage/getProjectServiceAccount:getProjectServiceAccount":
        email = f"service-{PLAN_PROJECT_NUMBER}@gs-project-accounts.iam.gserviceaccount.com"
        return {"emailAddress": email, "member": f"serviceAccount:{email}", "project": project, "id": email}
    return None
