"""Constraints AWS enforces at create time or on the node, read off the declared
resources. Mocks accept any value of the right type; these catch what AWS would not.
Each docstring names the AWS document the constraint comes from."""

from __future__ import annotations

from ftfleet.infra import catalog
from ftfleet.infra.policies.model import Res, as_list, linked, of_type, role, statements

BUCKET = "aws:s3/bucket:Bucket"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
KEYS = ("aws:kms/key:Key", "aws:kms/replicaKey:ReplicaKey")
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:autoscaling/group:Group"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
EFA_TYPES = ("efa", "efa-only")
FSX_S3_ROLE = "AWSServiceRoleForFSxS3Access_"
STATEFUL = (BUCKET, *KEYS, LUSTRE)
IDENTITY_POLICIES = (
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/policy:Policy",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
)


# --- resource policies: (Res) -> list of messages ---------------------------------


def stateful_protected(r: Res) -> list[str]:
    """Buckets, KMS keys and file systems hold checkpoints (or the key to them): a typo
    that would delete or replace one must stop the update. Pulumi documentation,
    "Resource options: protect", https://www.pulumi.com/docs/iac/concepts/options/protect/."""
    if r.type not in STATEFUL or r.protect:
        return []
    return [f"{r.type.split(':')[-1]} is not protected; set protect=True"]


def _efa_interfaces(r: Res) -> list[dict]:
    return [i for i in r.props.get("networkInterfaces") or [] if i.get("interfaceType") in EFA_TYPES]


def efa_per_network_card(r: Res) -> list[str]:
    """One EFA interface per network card of the instance type, on distinct cards, and a
    primary interface at card 0 device 0 (Amazon EC2 User Guide, "Maximize network bandwidth on
    accelerated computing instances with EFA",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html)."""
    if r.type != LAUNCH_TEMPLATE:
        return []
    efa = _efa_interfaces(r)
    itype = r.props.get("instanceType")
    spec = catalog.instance("aws", itype) if isinstance(itype, str) else None
    if not efa or spec is None:
        return []
    out = []
    if len(efa) != spec.efa_interfaces:
        out.append(f"{len(efa)} EFA interface(s) on {itype}, which has {spec.efa_interfaces} network cards for EFA")
    cards = [i.get("networkCardIndex") for i in efa]
    if all(isinstance(c, int) for c in cards) and sorted(cards) != list(range(len(cards))):
        out.append(f"EFA interfaces on network cards {cards}; use each card 0..{len(cards) - 1} once")
    everything = r.props.get("networkInterfaces") or []
    if not any(i.get("networkCardIndex") in (0, None) and i.get("deviceIndex") in (0, None) for i in everything):
        out.append("no primary interface at network card 0, device index 0")
    return out


def _pct(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None


def replacement_within_aws_bounds(r: Res) -> list[str]:
    """Replacement percentages AWS accepts: min 0-100, max 100-200, at most 100 apart;
    and a one-node group launches before it terminates (EC2 Auto Scaling API Reference,
    InstanceMaintenancePolicy and RefreshPreferences,
    https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_InstanceMaintenancePolicy.html;
    EC2 Auto Scaling User Guide, "Instance maintenance policies",
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-instance-maintenance-policy.html)."""
    if r.type != GROUP:
        return []
    out = []
    sources = {
        "instance maintenance policy": r.props.get("instanceMaintenancePolicy") or {},
        "instance refresh": (r.props.get("instanceRefresh") or {}).get("preferences") or {},
    }
    for where, prefs in sources.items():
        low, high = _pct(prefs.get("minHealthyPercentage")), _pct(prefs.get("maxHealthyPercentage"))
        if low is not None and not 0 <= low <= 100:
            out.append(f"{where}: minHealthyPercentage {low} is outside 0-100")
        if high is not None and not 100 <= high <= 200:
            out.append(f"{where}: maxHealthyPercentage {high} is outside 100-200")
        if low is not None and high is not None and high - low > 100:
            out.append(f"{where}: min {low} and max {high} healthy percentages are more than 100 apart")
        one_node = _pct(r.props.get("maxSize")) == 1
        if one_node and prefs and (low is None or low < 100 or high is None or high <= 100):
            out.append(f"{where}: a one-node group must launch before it terminates (min 100, max above 100)")
    return out


def kms_via_service(r: Res) -> list[str]:
    """Identity policies grant KMS only through the service that uses the key
    (kms:ViaService), so a stolen node credential cannot decrypt directly (AWS KMS
    Developer Guide, "kms:ViaService",
    https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-via-service)."""
    if r.type not in IDENTITY_POLICIES:
        return []
    out = []
    for s in statements(r.props.get("policy")):
        actions = [a for a in as_list(s.get("Action")) if isinstance(a, str)]
        if s.get("Effect") != "Allow" or not any(a.lower().startswith("kms:") for a in actions):
            continue
        conds = s.get("Condition") or {}
        if not any("kms:ViaService" in (block or {}) for block in conds.values() if isinstance(block, dict)):
            out.append(f"statement {s.get('Sid', '?')!r} grants KMS without a kms:ViaService condition")
    return out


# --- stack policies: (list[Res]) -> list of (resource name, message) -------------


def _grants_fsx(statement: dict, bucket_region: str | None) -> bool:
    if statement.get("Effect") != "Allow":
        return False
    actions = {a for a in as_list(statement.get("Action")) if isinstance(a, str)}
    if not actions & {"kms:*", "kms:GenerateDataKey*", "kms:GenerateDataKey"}:
        return False
    principal = statement.get("Principal")
    named = principal.get("AWS") if isinstance(principal, dict) else principal
    conds = statement.get("Condition") or {}
    flat = {k: v for block in conds.values() if isinstance(block, dict) for k, v in block.items()}
    arns = as_list(named) + as_list(flat.get("aws:PrincipalArn", []))
    if not any(isinstance(a, str) and FSX_S3_ROLE in a for a in arns):
        return False
    via = flat.get("kms:ViaService")
    return via is None or bucket_region is None or f"s3.{bucket_region}.amazonaws.com" in as_list(via)


def fsx_export_key_grants_fsx(resources: list[Res]) -> list[tuple[str, str]]:
    """The KMS key of a bucket that an FSx data repository association reads and writes
    lets FSx's service-linked role AWSServiceRoleForFSxS3Access_<fs-id> use it through
    S3 in the bucket's region (FSx for Lustre User Guide, "Working with server-side
    encrypted Amazon S3 buckets",
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/s3-server-side-encryption-support.html)."""
    by_urn = {r.urn: r for r in resources}
    out = []
    for dra in of_type(resources, DRA):
        for bucket in linked(dra, "dataRepositoryPath", by_urn, BUCKET):
            for sse in (s for s in of_type(resources, SSE) if bucket.urn in s.deps("bucket")):
                for key in linked(sse, "rules", by_urn, *KEYS):
                    policy = key.props.get("policy")
                    if not isinstance(policy, str):
                        continue  # unknown until the key exists: skipped, not guessed
                    if not any(_grants_fsx(s, bucket.region) for s in statements(policy)):
                        out.append(
                            (
                                key.name,
                                f"key of {bucket.name}, which {dra.name} exports to, does not grant FSx's S3 role",
                            )
                        )
    return out


def _admits_self(rules: list[Res], sg: Res, direction: str) -> bool:
    standalone = SG_INGRESS if direction == "ingress" else SG_EGRESS
    for rule in rules:
        if rule.type == standalone:
            if sg.urn in rule.deps("securityGroupId") and sg.urn in rule.deps("referencedSecurityGroupId"):
                if str(rule.props.get("ipProtocol")) in ("-1", "all"):
                    return True
        elif rule.type == SG_RULE and rule.props.get("type") == direction and rule.props.get("self"):
            if sg.urn in rule.deps("securityGroupId") and str(rule.props.get("protocol")) in ("-1", "all"):
                return True
    key = "ingress" if direction == "ingress" else "egress"
    return any(x.get("self") and str(x.get("protocol")) in ("-1", "all") for x in sg.props.get(key) or [])


def efa_group_admits_itself(resources: list[Res]) -> list[tuple[str, str]]:
    """The security group of an EFA interface allows all inbound and all outbound
    traffic from and to itself: EFA's OS-bypass traffic is not routable (Amazon EC2
    User Guide, "Get started with EFA and NCCL", prepare an EFA-enabled security group,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html)."""
    by_urn = {r.urn: r for r in resources}
    rules = of_type(resources, SG_INGRESS, SG_EGRESS, SG_RULE)
    out = []
    for lt in of_type(resources, LAUNCH_TEMPLATE):
        if not _efa_interfaces(lt):
            continue
        for sg in linked(lt, "networkInterfaces", by_urn, SG):
            for direction in ("ingress", "egress"):
                if not _admits_self(rules, sg, direction):
                    out.append((sg.name, f"EFA group of {lt.name} does not allow all {direction} traffic with itself"))
    return sorted(set(out))


def _admits_lustre(rule: Res) -> bool:
    proto = str(rule.props.get("ipProtocol"))
    lo, hi = rule.props.get("fromPort"), rule.props.get("toPort")
    return proto in ("-1", "all") or (
        proto == "tcp" and isinstance(lo, int) and isinstance(hi, int) and lo <= 988 <= hi
    )


def fsx_waits_for_its_rules(resources: list[Res]) -> list[tuple[str, str]]:
    """CreateFileSystem rejects security groups that do not admit Lustre traffic on
    port 988 at that moment, so the file system depends on its groups' ingress rules
    (FSx for Lustre User Guide, "File system access control with Amazon VPC",
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html)."""
    by_urn = {r.urn: r for r in resources}
    ingress = of_type(resources, SG_INGRESS)
    out = []
    for fs in of_type(resources, LUSTRE):
        groups = linked(fs, "securityGroupIds", by_urn, SG)
        rules = [rule for rule in ingress for sg in groups if sg.urn in rule.deps("securityGroupId")]
        inline = [x for sg in groups for x in sg.props.get("ingress") or []]
        if groups and not inline and not any(_admits_lustre(rule) for rule in rules):
            out.append((fs.name, "no ingress rule of its security groups admits Lustre on TCP 988"))
        missing = [rule.name for rule in rules if rule.urn not in fs.dependencies]
        if missing:
            out.append((fs.name, f"does not wait for its security group rules {', '.join(sorted(missing))}"))
    return out


def _launches(group: Res, templates: dict[str, Res]) -> list[tuple[str | None, Res | None]]:
    """(instance type, launch template) for each way a group launches nodes; a template
    is None where its id is unknown (at preview) or not declared in the stack."""
    mip = group.props.get("mixedInstancesPolicy") or {}
    lt_block = mip.get("launchTemplate") or {}
    default = lt_block.get("launchTemplateSpecification") or {}
    overrides = lt_block.get("overrides") or []
    if overrides:
        out = []
        for o in overrides:
            spec = o.get("launchTemplateSpecification") or default
            out.append((o.get("instanceType"), templates.get(spec.get("launchTemplateId"))))
        return out
    plain = group.props.get("launchTemplate") or {}
    lt = templates.get(plain.get("id") or default.get("launchTemplateId"))
    return [(lt.props.get("instanceType") if lt else None, lt)]


def fleet_one_generation(resources: list[Res]) -> list[tuple[str, str]]:
    """A job runs on one GPU generation and, with EFA, one EFA group: no group (and no
    two groups of one fleet) mixes them. EFA traffic between P4d/P4de/DL1 and other
    instance types is not supported (Amazon EC2 User Guide, "Elastic Fabric Adapter",
    EFA limitations, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html).
    An override launches from a template made for its type, or it gets another type's
    EFA interfaces (EC2 Auto Scaling User Guide, "Use multiple launch templates",
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups-launch-template-overrides.html)."""
    templates = {lt.id: lt for lt in of_type(resources, LAUNCH_TEMPLATE) if lt.id}
    out = []
    fleet_generations: set[str] = set()
    fleet_efa_groups: set[str] = set()
    for group in of_type(resources, GROUP):
        generations: set[str] = set()
        efa_groups: set[str] = set()
        for itype, lt in _launches(group, templates):
            spec = catalog.instance("aws", itype) if isinstance(itype, str) else None
            if spec is None:
                continue
            generations.add(spec.generation)
            if lt is not None and _efa_interfaces(lt):
                efa_groups.add(spec.efa_group)
                made_for = lt.props.get("instanceType")
                if isinstance(made_for, str) and made_for != itype:
                    out.append((group.name, f"{itype} launches from {lt.name}, made for {made_for}'s EFA interfaces"))
        if len(generations) > 1:
            out.append((group.name, f"mixes GPU generations: {', '.join(sorted(generations))}"))
        if len(efa_groups) > 1:
            out.append((group.name, f"mixes types that cannot exchange EFA traffic: {', '.join(sorted(efa_groups))}"))
        if role(group):
            fleet_generations |= generations
            fleet_efa_groups |= efa_groups
    if len(fleet_generations) > 1:
        out.append(("stack", f"the fleet's groups mix GPU generations: {', '.join(sorted(fleet_generations))}"))
    if len(fleet_efa_groups) > 1:
        out.append(("stack", f"the fleet's groups mix EFA groups: {', '.join(sorted(fleet_efa_groups))}"))
    return out


ECR_REPLICATION = "aws:ecr/replicationConfiguration:ReplicationConfiguration"
ECR_REPOSITORY = "aws:ecr/repository:Repository"


def ecr_replication_valid(r: Res) -> list[str]:
    """What ECR accepts in a registry's replication configuration (Amazon ECR API
    Reference: ReplicationConfiguration, "rules ... Maximum number of 10 items";
    ReplicationRule, "destinations ... Maximum number of 100 items" and "repositoryFilters
    ... Minimum number of 1 item. Maximum number of 100 items"; RepositoryFilter,
    filterType "Valid Values: PREFIX_MATCH"). A rule without a destination replicates
    nothing (AWS::ECR::ReplicationConfiguration ReplicationRule: Destinations minimum 1)."""
    if r.type != ECR_REPLICATION:
        return []
    rules = (r.props.get("replicationConfiguration") or {}).get("rules")
    if not isinstance(rules, list):
        return []
    out = [f"{len(rules)} rules; ECR takes 1 to 10"] if not 1 <= len(rules) <= 10 else []
    for i, rule in enumerate(rules):
        destinations, filters = rule.get("destinations") or [], rule.get("repositoryFilters")
        if not 1 <= len(destinations) <= 100:
            out.append(f"rule {i}: {len(destinations)} destinations; ECR takes 1 to 100")
        if filters is not None and not 1 <= len(filters) <= 100:
            out.append(f"rule {i}: {len(filters)} repository filters; ECR takes 1 to 100, or none")
        for f in filters or []:
            if f.get("filterType") not in (None, "PREFIX_MATCH"):
                out.append(f"rule {i}: filter type {f.get('filterType')!r}; ECR takes PREFIX_MATCH")
    return out


def ecr_replication_finds_its_repository(resources: list[Res]) -> list[tuple[str, str]]:
    """A repository this stack declares in a replication destination's region, with a
    name a rule's filter matches, exists before the rule: replication creates a missing
    destination repository itself, with its own settings rather than the stack's (Amazon
    ECR User Guide, "Private image replication": the service-linked role lets the
    service create repositories), and the stack's create would then fail on the name."""
    out = []
    for config in of_type(resources, ECR_REPLICATION):
        rules = (config.props.get("replicationConfiguration") or {}).get("rules") or []
        for repo in of_type(resources, ECR_REPOSITORY):
            name = repo.props.get("name")
            if not isinstance(name, str) or repo.region is None:
                continue
            for rule in rules:
                regions = {d.get("region") for d in rule.get("destinations") or []}
                prefixes = [f.get("filter") for f in rule.get("repositoryFilters") or []]
                matched = not prefixes or any(isinstance(p, str) and name.startswith(p) for p in prefixes)
                if repo.region in regions and matched and repo.urn not in config.dependencies:
                    out.append((config.name, f"replicates into {name} in {repo.region} without waiting for it"))
    return out
