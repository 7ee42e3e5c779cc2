"""Every physical name fits its service's limits for any stack name ftfleet accepts, and
the stacks whose names already fit keep them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftfleet.errors import ConfigError
from ftfleet.infra import offline, policies, stackfile
from ftfleet.infra.aws import names
from tests.infra.conftest import recording, res_view

LONGEST = ("aws-" + "0123456789" * 10)[:100]


def run_as(stack_name: str, tmp_path: Path, base: str = "aws-prod") -> offline.Recording:
    config = dict(stackfile.load(base).config)
    return offline.run(stackfile.StackFile(name=stack_name, path=tmp_path / f"Pulumi.{stack_name}.yaml", config=config))


def name_violations(rec: offline.Recording) -> list[tuple[str, str]]:
    return [(n, m) for p, n, m in policies.evaluate(res_view(rec)) if p == "names-within-limits"]


@pytest.mark.parametrize("stack_name", ["aws-staging", "a", LONGEST, "-".join(["ab"] * 33) + "-a"])
def test_every_name_fits_for_a_stack_name_of_any_valid_length(stack_name, tmp_path):
    rec = run_as(stack_name, tmp_path)
    assert name_violations(rec) == []
    roles = [r for r in rec.of_type("aws:iam/role:Role")]
    assert roles and all(len(r.outputs.get("name") or "") <= 64 or r.inputs.get("namePrefix") for r in roles)


def test_the_recorded_stacks_keep_the_names_pulumi_gives_them():
    # names.generated() adds nothing while Pulumi's own name fits: no replacement on update.
    for stack in ("aws-dev", "aws-prod"):
        rec = recording(stack)
        assert name_violations(rec) == []
        assert not [r.name for r in rec.resources if "namePrefix" in r.inputs or "bucketPrefix" in r.inputs]
        (zone,) = rec.of_type("aws:route53/zone:Zone")
        assert zone.inputs["name"] == f"{stack}.ftfleet.internal"


def test_a_long_stack_name_gets_prefixes_and_fitted_names(tmp_path):
    rec = run_as(LONGEST, tmp_path)
    functions = [r.inputs["name"] for r in rec.of_type("aws:lambda/function:Function")]
    assert functions and all(len(n) <= 64 for n in functions) and len(set(functions)) == len(functions)
    assert all(len(r.inputs["bucketPrefix"]) <= 63 - 26 for r in rec.of_type("aws:s3/bucket:Bucket"))
    (zone,) = rec.of_type("aws:route53/zone:Zone")
    assert len(zone.inputs["name"].split(".")[0]) == 63


def res(type_token, props, name="r"):
    return policies.Res(type=type_token, name=name, urn=f"urn:{name}", props=props)


@pytest.mark.parametrize(
    ("resource", "words"),
    [
        (res("aws:iam/role:Role", {"name": "r" * 65}), "has 65 characters; iam/role allows 64"),
        (res("aws:iam/role:Role", {}, name="x" * 57), "the name Pulumi generates"),
        (res("aws:iam/role:Role", {"namePrefix": "p" * 39}), "the prefix with its suffix"),
        (res("aws:s3/bucket:Bucket", {"bucket": "Upper-Case"}), "characters s3/bucket does not allow"),
        (res("aws:lambda/function:Function", {"name": "fn.with.dots"}), "does not allow"),
        (res("aws:cloudtrail/trail:Trail", {"name": "a--b"}), "does not allow"),
        (res("aws:route53/zone:Zone", {"name": "x" * 64 + ".ftfleet.internal"}), "DNS allows 63"),
    ],
)
def test_a_name_beyond_its_service_s_limits_is_caught(resource, words):
    (message,) = policies.names_within_limits(resource)
    assert words in message


def test_fit_leaves_a_fitting_name_alone_and_keeps_long_ones_apart():
    assert names.fit("ftfleet-aws-dev-x", 64) == "ftfleet-aws-dev-x"
    a, b = names.fit("a" * 80 + "-one", 64), names.fit("a" * 80 + "-two", 64)
    assert len(a) == len(b) == 64 and a != b
    assert names.generated("aws:iam/role:Role", "short") == {}
    assert names.generated("aws:s3/bucket:Bucket", "X" * 60) == {"bucket_prefix": names.fit("X" * 60, 36).lower() + "-"}


@pytest.mark.parametrize("stack_name", ["AWS-dev", "aws_dev", "aws.dev", "aws--dev", "-aws", LONGEST + "x"])
def test_a_stack_name_aws_cannot_take_is_refused_in_one_line(stack_name):
    stack = stackfile.load("aws-dev")
    with pytest.raises(ConfigError) as info:
        stackfile.StackFile(name=stack_name, path=stack.path, config=stack.config).settings()
    assert "\n" not in str(info.value) and "lowercase letters, digits and single hyphens" in str(info.value)
