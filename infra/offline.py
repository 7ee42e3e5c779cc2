"""Run the real Pulumi program offline, under Pulumi's mocks, and record every resource.

This is what `ftfleet plan` and the tests use: the program in infra/__main__.py runs
unchanged, with the stack's config, and every registration is captured with its
inputs (as the program declared them), parent, provider and dependencies. Nothing is
sent anywhere. Mock outputs are deterministic stand-ins (ids, ARNs, bucket names) so
that values derived from them, like user data, can be rendered.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import runpy
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as pulumi_settings

from ftfleet.errors import ConfigError
from ftfleet.infra import settings as ftsettings
from ftfleet.infra.gcp import mocks as gcp_mocks
from ftfleet.infra.stackfile import StackFile
from ftfleet.infra.stackfile import load as load_stackfile

PROGRAM = Path(__file__).with_name("__main__.py")
MOCK_ACCOUNT = "123456789012"


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    parent: str | None
    """URN of the parent, None for children of the stack."""
    provider: str | None
    """URN of the explicit provider, None for the default provider."""
    custom: bool
    inputs: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    dependencies: list[str] = field(default_factory=list)
    """URNs of every resource this one waits for: explicit depends_on and inputs."""
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    protect: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    """Properties a later update leaves as they are (the `ignore_changes` option)."""

    def deps(self, prop: str) -> list[str]:
        """URNs of the resources the top-level input ``prop`` came from."""
        return self.property_dependencies.get(prop, [])


@dataclass
class Recording:
    stack: str
    resources: list[Resource]
    outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    """(token, args, provider URN) of every data-source call the program made."""

    def by_urn(self) -> dict[str, Resource]:
        return {r.urn: r for r in self.resources}

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]

    def region_of(self, r: Resource) -> str | None:
        """Region a resource lives in: its own `region` input, else its provider's."""
        if r.inputs.get("region"):
            return r.inputs["region"]
        if r.provider and r.provider in self.by_urn():
            return self.by_urn()[r.provider].inputs.get("region")
        return None


def _physical(name: str, suffix_len: int = 7) -> str:
    return f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:suffix_len]}"


def _hex(name: str, n: int = 17) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:n]


# ARNs in the shape AWS gives each resource type (Service Authorization Reference,
# "Resource types defined by ..."), so that checks of the policies that name them (the
# IAM linter in the tests, the policies module) see what AWS would.
ARN_FORMATS: dict[str, str] = {
    "aws:s3/bucket:Bucket": "arn:aws:s3:::{name}",
    "aws:ecr/repository:Repository": "arn:aws:ecr:{region}:{account}:repository/{name}",
    "aws:route53/zone:Zone": "arn:aws:route53:::hostedzone/{id}",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "arn:aws:fsx:{region}:{account}:file-system/{id}",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": (
        "arn:aws:fsx:{region}:{account}:association/{file_system_id}/{id}"
    ),
    "aws:kms/key:Key": "arn:aws:kms:{region}:{account}:key/{id}",
    "aws:kms/replicaKey:ReplicaKey": "arn:aws:kms:{region}:{account}:key/{id}",
    "aws:kms/alias:Alias": "arn:aws:kms:{region}:{account}:{name}",
    "aws:autoscaling/group:Group": (
        "arn:aws:autoscaling:{region}:{account}:autoScalingGroup:{uuid}:autoScalingGroupName/{name}"
    ),
    "aws:iam/role:Role": "arn:aws:iam::{account}:role/{name}",
    "aws:iam/policy:Policy": "arn:aws:iam::{account}:policy/{name}",
    "aws:iam/instanceProfile:InstanceProfile": "arn:aws:iam::{account}:instance-profile/{name}",
    "aws:ec2/launchTemplate:LaunchTemplate": "arn:aws:ec2:{region}:{account}:launch-template/{id}",
    "aws:ec2/securityGroup:SecurityGroup": "arn:aws:ec2:{region}:{account}:security-group/{id}",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        "arn:aws:ec2:{region}:{account}:security-group-rule/{id}"
    ),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": (
        "arn:aws:ec2:{region}:{account}:security-group-rule/{id}"
    ),
    "aws:ec2/vpc:Vpc": "arn:aws:ec2:{region}:{account}:vpc/{id}",
    "aws:ec2/subnet:Subnet": "arn:aws:ec2:{region}:{account}:subnet/{id}",
    "aws:ec2/placementGroup:PlacementGroup": "arn:aws:ec2:{region}:{account}:placement-group/{name}",
    "aws:ec2/natGateway:NatGateway": "arn:aws:ec2:{region}:{account}:natgateway/{id}",
    "aws:ec2/internetGateway:InternetGateway": "arn:aws:ec2:{region}:{account}:internet-gateway/{id}",
    "aws:ec2/routeTable:RouteTable": "arn:aws:ec2:{region}:{account}:route-table/{id}",
    "aws:ec2/vpcEndpoint:VpcEndpoint": "arn:aws:ec2:{region}:{account}:vpc-endpoint/{id}",
    "aws:ec2/eip:Eip": "arn:aws:ec2:{region}:{account}:elastic-ip/{id}",
    "aws:sqs/queue:Queue": "arn:aws:sqs:{region}:{account}:{name}",
    "aws:sns/topic:Topic": "arn:aws:sns:{region}:{account}:{name}",
    "aws:lambda/function:Function": "arn:aws:lambda:{region}:{account}:function:{name}",
    "aws:cloudwatch/eventRule:EventRule": "arn:aws:events:{region}:{account}:rule/{name}",
    "aws:cloudwatch/logGroup:LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}",
    "aws:cloudwatch/metricAlarm:MetricAlarm": "arn:aws:cloudwatch:{region}:{account}:alarm:{name}",
    "aws:cloudtrail/trail:Trail": "arn:aws:cloudtrail:{region}:{account}:trail/{name}",
    "aws:ssm/parameter:Parameter": "arn:aws:ssm:{region}:{account}:parameter/{bare_name}",
    "aws:dynamodb/table:Table": "arn:aws:dynamodb:{region}:{account}:table/{name}",
}

# Resource ids in EC2's shape (the prefix names the kind, as in sg-0123...).
ID_PREFIXES: dict[str, str] = {
    "aws:ec2/securityGroup:SecurityGroup": "sg-",
    "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
    "aws:ec2/vpc:Vpc": "vpc-",
    "aws:ec2/subnet:Subnet": "subnet-",
    "aws:ec2/natGateway:NatGateway": "nat-",
    "aws:ec2/internetGateway:InternetGateway": "igw-",
    "aws:ec2/routeTable:RouteTable": "rtb-",
    "aws:ec2/vpcEndpoint:VpcEndpoint": "vpce-",
    "aws:ec2/eip:Eip": "eipalloc-",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": "sgr-",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": "sgr-",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "fs-",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": "dra-",
}
# Resources whose id is their name in the provider (buckets, roles, groups, ...).
NAME_IS_ID = (
    "aws:s3/bucket:Bucket",
    "aws:iam/role:Role",
    "aws:iam/instanceProfile:InstanceProfile",
    "aws:autoscaling/group:Group",
    "aws:ecr/repository:Repository",
    "aws:ec2/placementGroup:PlacementGroup",
    "aws:lambda/function:Function",
    "aws:cloudwatch/eventRule:EventRule",
    "aws:cloudwatch/logGroup:LogGroup",
)


def mock_arn(typ: str, region: str, name: str, rid: str, inputs: dict[str, Any]) -> str:
    service = typ.split(":")[1].split("/")[0]
    kind = typ.split("/")[-1].split(":")[0]
    default = f"arn:aws:{service}:{region}:{MOCK_ACCOUNT}:{kind}/{name}"
    return ARN_FORMATS.get(typ, default).format(
        region=region,
        account=MOCK_ACCOUNT,
        name=name,
        bare_name=name.lstrip("/"),
        id=rid,
        uuid=str(uuid.UUID(hashlib.sha256(name.encode()).hexdigest()[:32])),
        file_system_id=inputs.get("fileSystemId") or "fs-unknown",
    )


class _Mocks(pulumi.runtime.Mocks):
    """Deterministic outputs for the resources and invokes the program uses (invokes are
    recorded in ``invokes``).

    ``previous_outputs`` stands for the stack's outputs from its last deployment, as a
    StackReference to the stack itself reads them (None: never deployed)."""

    gcp_project: str | None = None

    def __init__(
        self,
        region_of_provider: dict[str, str],
        default_region: str,
        previous_outputs: dict[str, Any] | None = None,
        registry_tags: tuple[str, ...] = (),
        stack: str = "",
        other_stacks: dict[str, dict[str, Any]] | None = None,
        objects: dict[str, bytes] | None = None,
    ):
        self._objects = objects or {}
        self._region_of_provider = region_of_provider
        self._default_region = default_region
        self._previous_outputs = previous_outputs or {}
        self._stack = stack
        self._other_stacks = other_stacks or {}
        self._registry_tags = registry_tags
        self.invokes: list[tuple[str, dict[str, Any], str]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        outs = dict(args.inputs)
        if args.typ.startswith("pulumi:providers:"):
            return f"{args.name}-provider-id", outs
        if args.typ == "pulumi:pulumi:StackReference":
            referenced = str(outs.get("name") or "").rsplit("/", 1)[-1]
            if not self._stack or referenced == self._stack:
                outputs = self._previous_outputs
            else:
                outputs = self._other_stacks.get(referenced, {})
            return args.resource_id or args.name, {
                "name": outs.get("name"),
                "outputs": dict(outputs),
                "secretOutputNames": [],
            }
        provider_urn = (args.provider or "").split("::id")[0].rsplit("::", 1)[0]
        region = outs.get("region") or self._region_of_provider.get(provider_urn, self._default_region)
        if args.typ.startswith("gcp:"):
            return gcp_mocks.new_resource(args.typ, args.name, outs, region, self.gcp_project)
        if args.resource_id and args.typ in NAME_IS_ID:  # a read of an existing resource, by name
            physical = args.resource_id
        else:
            physical = outs.get("name") if isinstance(outs.get("name"), str) else _physical(args.name)
        if args.typ in ID_PREFIXES:
            rid = ID_PREFIXES[args.typ] + _hex(args.name)
        elif args.typ in NAME_IS_ID:
            rid = physical
        else:
            rid = f"{args.name}-id"
        outs.setdefault("name", physical)
        if args.typ == "aws:s3/bucket:Bucket":
            outs["bucket"] = physical
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            outs.update(
                dnsName=f"{rid}.fsx.{region}.amazonaws.com", mountName=hashlib.sha256(rid.encode()).hexdigest()[:8]
            )
        elif args.typ == "aws:ecr/repository:Repository":
            outs["repositoryUrl"] = f"{MOCK_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{physical}"
        elif args.typ == "aws:route53/zone:Zone":
            rid = "Z" + hashlib.sha256(args.name.encode()).hexdigest()[:20].upper()
            outs["zoneId"] = rid
            outs["primaryNameServer"] = "ns-1536.awsdns-00.co.uk."
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outs["latestVersion"] = 1
        elif args.typ in ("aws:kms/key:Key", "aws:kms/replicaKey:ReplicaKey"):
            rid = "mrk-" + hashlib.sha256(args.name.encode()).hexdigest()[:32]
            outs["keyId"] = rid
        elif args.typ == "aws:sqs/queue:Queue":
            outs["url"] = f"https://sqs.{region}.amazonaws.com/{MOCK_ACCOUNT}/{physical}"
            rid = outs["url"]  # a queue's id is its URL
        outs.setdefault("arn", mock_arn(args.typ, region, physical, rid, outs))
        return rid, outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        self.invokes.append((args.token, dict(args.args), (args.provider or "").rsplit("::", 1)[0]))
        gcp_result = gcp_mocks.call(args.token, dict(args.args), self.gcp_project, self._objects)
        if gcp_result is not None:
            return gcp_result
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": MOCK_ACCOUNT,
                "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/ftfleet-plan",
                "userId": "AIDAFTFLEETPLAN",
                "id": MOCK_ACCOUNT,
            }
        if args.token == "aws:ssm/getParameter:getParameter":
            # A public AMI parameter: a plausible, stable AMI id per parameter name.
            name = args.args.get("name", "")
            ami = "ami-" + hashlib.sha256(name.encode()).hexdigest()[:17]
            return {
                "arn": f"arn:aws:ssm:{self._default_region}::parameter{name}",
                "id": name,
                "name": name,
                "type": "String",
                "value": ami,
                "insecureValue": ami,
                "version": 1,
                "withDecryption": True,
                "region": self._default_region,
            }
        if args.token == "aws:s3/getObjects:getObjects":
            bucket, prefix = args.args.get("bucket", ""), args.args.get("prefix", "")
            keys = sorted(k.split("/", 1)[1] for k in self._objects if k.startswith(f"{bucket}/{prefix}"))
            return {"bucket": bucket, "prefix": prefix, "keys": keys, "commonPrefixes": [], "owners": [], "id": bucket}
        if args.token == "aws:s3/getObject:getObject":
            bucket, key = args.args.get("bucket", ""), args.args.get("key", "")
            data = self._objects.get(f"{bucket}/{key}", b"")
            return {"bucket": bucket, "key": key, "bodyBase64": base64.b64encode(data).decode(), "id": key}
        if args.token == "aws:ecr/getRepository:getRepository":
            name = args.args.get("name", "")
            region = self._default_region
            return {
                "id": name,
                "name": name,
                "arn": f"arn:aws:ecr:{region}:{MOCK_ACCOUNT}:repository/{name}",
                "registryId": MOCK_ACCOUNT,
                "repositoryUrl": f"{MOCK_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{name}",
                "region": region,
            }
        if args.token == "aws:ecr/getImages:getImages":
            repository = args.args.get("repositoryName", "")
            return {
                "id": repository,
                "repositoryName": repository,
                "region": self._default_region,
                "imageIds": [
                    {
                        "imageTag": tag,
                        "imageDigest": "sha256:" + hashlib.sha256(f"{repository}:{tag}".encode()).hexdigest(),
                    }
                    for tag in self._registry_tags
                ],
            }
        return {}


class _Monitor(pulumi_mocks.MockMonitor):
    """Records parent, provider and dependencies, which Mocks.new_resource never sees."""

    def __init__(self, mocks: _Mocks):
        super().__init__(mocks)
        self.recorded: list[Resource] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        is_stack_child = not request.parent or "::pulumi:pulumi:Stack::" in request.parent
        self.recorded.append(
            Resource(
                urn=response.urn,
                type=request.type,
                name=request.name,
                parent=None if is_stack_child else request.parent,
                provider=request.provider.rsplit("::", 1)[0] if request.provider else None,
                custom=bool(request.custom),
                inputs=rpc.deserialize_properties(request.object),
                outputs=self.resources[response.urn].state if response.urn in self.resources else {},
                id=response.id,
                dependencies=list(request.dependencies),
                property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
                protect=bool(request.protect),
                ignore_changes=list(request.ignoreChanges),
            )
        )
        return response


def _plain(value: Any) -> Any:
    """Inputs as plain JSON-able data (unknowns and secrets made explicit)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return {"secret": _plain(value.get("value"))}
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the mock sees every number as a float
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, pulumi.AssetArchive):
        return {"asset": "AssetArchive", "path": None, "assets": {k: _plain(v) for k, v in value.assets.items()}}
    if isinstance(value, pulumi.StringAsset):
        return {"asset": "StringAsset", "path": None, "text": value.text}
    if isinstance(value, pulumi.Archive | pulumi.Asset):
        return {"asset": type(value).__name__, "path": getattr(value, "path", None)}
    return str(value)


def run(
    stack: StackFile,
    validate_first: bool = True,
    previous_outputs: dict[str, Any] | None = None,
    registry_tags: tuple[str, ...] | None = None,
    other_stacks: dict[str, dict[str, Any]] | None = None,
    objects: dict[str, bytes] | None = None,
) -> Recording:
    """Validate the stack's config, then run the program under mocks and record it.

    Raises ConfigError (one line) for invalid config before anything runs; with
    ``validate_first=False`` the program's own validation reports it (as pulumi.RunError).
    ``previous_outputs`` are the outputs of the stack's last deployment (as `pulumi
    stack output --json` prints them); without them the stack counts as never deployed.
    ``registry_tags``: the image tags the mocked registry holds (default: the stack's
    trainerImageTag, i.e. the image has been pushed).
    ``other_stacks``: the outputs of other stacks, by name, as a StackReference to them
    reads them; a standby whose home is not among them runs its home's stack file (in
    the same folder) first and reads the outputs that run exports.
    ``objects``: what the deployed buckets hold (``bucket/key`` -> bytes), as the
    program's data sources read it (none: empty buckets).
    """
    if validate_first:
        stack.settings()  # fail fast, with the same validation the program applies
    if registry_tags is None:
        try:
            registry_tags = (stack.settings().trainer.image_tag,)
        except ConfigError:
            registry_tags = ()
    other_stacks = dict(other_stacks or {})
    home = str(stack.project_config().get("standbyOf") or "")
    if home and home not in other_stacks and home != stack.name:
        home_file = stack.path.with_name(f"Pulumi.{home}.yaml")
        if not home_file.is_file():
            raise ConfigError(
                f"{stack.path}: ftfleet:standbyOf {home} names no stack file {home_file}; "
                "put the home stack's file beside it"
            )
        other_stacks[home] = run(load_stackfile(str(home_file))).outputs
    config = stack.as_pulumi_strings()
    region = stack.region() or ""
    provider_regions: dict[str, str] = {}

    # Pulumi's runtime keeps per-run state in context variables and the event loop.
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi_settings.ROOT.set(None)
    mocks = _Mocks(provider_regions, region, previous_outputs, registry_tags, stack.name, other_stacks, objects)
    mocks.gcp_project = stack.config.get("gcp:project")
    monitor = _Monitor(mocks)
    pulumi.runtime.set_mocks(mocks, project=ftsettings.PROJECT, stack=stack.name, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(config)
    exports: dict[str, Any] = {}

    real_register = monitor.RegisterResource

    def register(request):  # learn provider regions as providers register
        response = real_register(request)
        if request.type.startswith("pulumi:providers:"):
            provider_regions[response.urn] = rpc.deserialize_properties(request.object).get("region", region)
        return response

    monitor.RegisterResource = register

    @pulumi.runtime.test
    def program():
        runpy.run_path(str(PROGRAM), run_name="__main__")
        root = pulumi.runtime.get_root_resource()
        return pulumi.Output.from_input(dict(root.outputs)).apply(exports.update)

    program()
    for r in monitor.recorded:
        r.inputs = _plain(r.inputs)
        r.outputs = _plain(r.outputs)
    return Recording(
        stack=stack.name,
        resources=monitor.recorded,
        outputs=_plain(exports),
        invokes=[(token, _plain(args), provider) for token, args, provider in mocks.invokes],
    )
