"""An Auto Scaling group with the contract's termination hook, in a moto server, for
the lifecycle tests: what the fleet would have made."""

from __future__ import annotations

import boto3

from ftfleet import contract

GROUP = "ftfleet-drill-workers"


def make_group(endpoint_url: str, name: str = GROUP) -> str:
    """The group (one instance) and its hook; returns the instance id."""
    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    ec2 = session.client("ec2", endpoint_url=endpoint_url)
    asg = session.client("autoscaling", endpoint_url=endpoint_url)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    # moto's backends are per process, shared by every moto server a test session starts:
    # another module's group of this name (tests/trainer/scenarios/test_lifecycle_handoff.py) goes.
    if asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]:
        asg.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
    if ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [f"{name}-lt"]}])[
        "LaunchTemplates"
    ]:
        ec2.delete_launch_template(LaunchTemplateName=f"{name}-lt")
    ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": image, "InstanceType": "t3.micro"}
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
        MinSize=1,
        MaxSize=1,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )
    asg.put_lifecycle_hook(
        AutoScalingGroupName=name,
        LifecycleHookName=contract.TERMINATION_HOOK_NAME,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=300,
        DefaultResult="CONTINUE",
    )
    (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return group["Instances"][0]["InstanceId"]
