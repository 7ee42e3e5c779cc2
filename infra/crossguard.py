"""The CrossGuard policy pack: infra/policies/ wrapped for `pulumi preview --policy-pack policy/`.

Kept apart from policy/__main__.py because constructing a PolicyPack starts the
analyzer server and blocks; tests build the policies here and call them directly.
"""

from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from ftfleet.infra import policies

PACK_NAME = "ftfleet-invariants"


def _res(r) -> policies.Res:
    """From ResourceValidationArgs (one resource) or PolicyResource (a stack's)."""
    provider = getattr(r, "provider", None)
    region = (r.props or {}).get("region") or (provider.props.get("region") if provider else None)
    deps = {k: [d.urn for d in v] for k, v in (getattr(r, "property_dependencies", None) or {}).items()}
    opts = getattr(r, "opts", None)
    return policies.Res(
        type=r.resource_type,
        name=r.name,
        urn=r.urn,
        props=r.props or {},
        region=region,
        property_dependencies=deps,
        dependencies=[d.urn for d in getattr(r, "dependencies", None) or []],
        protect=bool(getattr(opts, "protect", False)),
        ignore_changes=list(getattr(opts, "ignore_changes", None) or []),
        id=(r.props or {}).get("id") if isinstance((r.props or {}).get("id"), str) else None,
    )


def _resource_policy(p: policies.Policy):
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        res = _res(args)
        if p.name == "spot-diversified":
            messages = p.check(res, int(args.get_config().get("minTypes", 3)))
        else:
            messages = p.check(res)
        for message in messages:
            report(message)

    schema = None
    if p.name == "spot-diversified":
        schema = PolicyConfigSchema(properties={"minTypes": {"type": "integer", "default": 3, "minimum": 1}})
    return ResourceValidationPolicy(
        name=p.name,
        description=p.description,
        validate=validate,
        config_schema=schema,
        enforcement_level=EnforcementLevel.ADVISORY if p.advisory else None,
    )


def _stack_policy(p: policies.Policy):
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [_res(r) for r in args.resources]
        urns = {r.name: r.urn for r in resources}
        for name, message in p.check(resources):
            report(message, urns.get(name))

    return StackValidationPolicy(
        name=p.name,
        description=p.description,
        validate=validate,
        enforcement_level=EnforcementLevel.ADVISORY if p.advisory else None,
    )


def build_policies() -> list:
    return [(_stack_policy if p.stack else _resource_policy)(p) for p in policies.POLICIES]


def serve() -> None:  # pragma: no cover - blocks forever serving the Pulumi CLI
    PolicyPack(name=PACK_NAME, enforcement_level=EnforcementLevel.MANDATORY, policies=build_policies())
