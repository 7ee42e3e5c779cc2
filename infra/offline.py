"""Run the real Pulumi program offline, under Pulumi's mocks, and record every resource.

This is what `ftfleet plan` and the tests use: the program in infra/__main__.py runs
unchanged, with the stack's config, and every registration is captured with its
inputs (as the program declared them), parent, provider and dependencies. Nothing is
sent anywhere. Mock outputs are deterministic stand-ins (ids, ARNs, bucket names) so
that values derived from them, like user data, can be rendered.
"""

from __future__ import annotations

import asyncio
import hashlib
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as pulumi_settings

from ftfleet.infra import settings as ftsettings
from ftfleet.infra.gcp import mocks as gcp_mocks
from ftfleet.infra.stackfile import StackFile

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
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    protect: bool = False


@dataclass
class Recording:
    stack: str
    resources: list[Resource]
    outputs: dict[str, Any]

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


class _Mocks(pulumi.runtime.Mocks):
    """Deterministic outputs for the resources and invokes the program uses."""

    gcp_project: str | None = None

    def __init__(self, region_of_provider: dict[str, str], default_region: str):
        self._region_of_provider = region_of_provider
        self._default_region = default_region

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        outs = dict(args.inputs)
        if args.typ.startswith("pulumi:providers:"):
            return f"{args.name}-provider-id", outs
        provider_urn = (args.provider or "").split("::id")[0].rsplit("::", 1)[0]
        region = outs.get("region") or self._region_of_provider.get(provider_urn, self._default_region)
        if args.typ.startswith("gcp:"):
            return gcp_mocks.new_resource(args.typ, args.name, outs, region, self.gcp_project)
        service = args.typ.split(":")[1].split("/")[0]
        physical = outs.get("name") if isinstance(outs.get("name"), str) else _physical(args.name)
        rid = f"{args.name}-id"
        outs.setdefault("arn", f"arn:aws:{service}:{region}:{MOCK_ACCOUNT}:{physical}")
        outs.setdefault("name", physical)
        if args.typ == "aws:s3/bucket:Bucket":
            outs["bucket"] = physical
            outs["arn"] = f"arn:aws:s3:::{physical}"
            rid = physical
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            rid = "fs-" + hashlib.sha256(args.name.encode()).hexdigest()[:17]
            outs.update(
                dnsName=f"{rid}.fsx.{region}.amazonaws.com", mountName=hashlib.sha256(rid.encode()).hexdigest()[:8]
            )
        elif args.typ == "aws:ecr/repository:Repository":
            outs["repositoryUrl"] = f"{MOCK_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{physical}"
        elif args.typ == "aws:route53/zone:Zone":
            outs["zoneId"] = "Z" + hashlib.sha256(args.name.encode()).hexdigest()[:20].upper()
            outs["arn"] = f"arn:aws:route53:::hostedzone/{outs['zoneId']}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outs["latestVersion"] = 1
        elif args.typ in ("aws:kms/key:Key", "aws:kms/replicaKey:ReplicaKey"):
            outs["keyId"] = "mrk-" + hashlib.sha256(args.name.encode()).hexdigest()[:32]
            outs["arn"] = f"arn:aws:kms:{region}:{MOCK_ACCOUNT}:key/{outs['keyId']}"
        return rid, outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        gcp_result = gcp_mocks.call(args.token, dict(args.args), self.gcp_project)
        if gcp_result is not None:
            return gcp_result
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": MOCK_ACCOUNT,
                "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/ftfleet-plan",
                "userId": "AIDAFTFLEETPLAN",
                "id": MOCK_ACCOUNT,
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
    if isinstance(value, pulumi.Archive | pulumi.Asset):
        return {"asset": type(value).__name__, "path": getattr(value, "path", None)}
    return str(value)


def run(stack: StackFile, validate_first: bool = True) -> Recording:
    """Validate the stack's config, then run the program under mocks and record it.

    Raises ConfigError (one line) for invalid config before anything runs; with
    ``validate_first=False`` the program's own validation reports it (as pulumi.RunError).
    """
    if validate_first:
        stack.settings()  # fail fast, with the same validation the program applies
    config = stack.as_pulumi_strings()
    region = stack.region() or ""
    provider_regions: dict[str, str] = {}

    # Pulumi's runtime keeps per-run state in context variables and the event loop.
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi_settings.ROOT.set(None)
    mocks = _Mocks(provider_regions, region)
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
    return Recording(stack=stack.name, resources=monitor.recorded, outputs=_plain(exports))
