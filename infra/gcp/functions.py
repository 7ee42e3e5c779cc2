"""RemediationFunctions: the GCP stack's remediation functions (Cloud Functions 2nd gen).

Five functions, each switched by its ``remediation*`` key (the code is in lambdas/):

* ``gcp_preemption`` (remediationSpotInterruption): a project log sink routes the
  ``compute.instances.preempted`` system events of this stack's instances to a topic;
  the function adds each to the interruption prior next to the checkpoints (the MTBF
  prior the trainer reads, as on AWS); a log-based metric counts its decision lines per
  zone and machine type.
* ``gcp_storage_drift`` (remediationStorageDrift): a sink routes the Admin Activity audit
  entries that change the checkpoint bucket's settings or IAM policy to a topic; the
  function restores what the program rendered and reads it back.
* ``gcp_replication_watch`` (remediationReplicationLag): Cloud Scheduler publishes to a
  topic every five minutes; the function measures how far the newest committed checkpoint
  may be from both regions and writes its metrics. The alert policies (infra/gcp/alerts.py)
  fire on Cloud Storage's own replication delay above replicationLagAlarmSeconds and
  when the watch stops reporting.
* ``gcp_capacity_watch`` (remediationCapacityWatch): Cloud Scheduler publishes to a
  topic every two minutes; the function measures, per managed instance group of the
  stack, the nodes it is short and since when its instance creations have failed for
  want of resources, and writes its metrics; the alert policy fires past
  capacityLossMinutes. A standby's with standbyAutoFailover also watches its home's
  groups and moves the run to the region that has capacity, one step per run
  (lambdas/common/move.py); without it a person moves the run (docs/FAILOVER.md).
* ``gcp_retention_sweep`` (remediationRetentionSweep): Cloud Scheduler publishes to a
  topic every hour; the function deletes the run's committed checkpoints that its
  retention schedule (the manifests' recorded policy, else checkpointRetention) no longer
  keeps, and old debris, from the checkpoint bucket. The alert policies fire when a step
  fails to delete and when the sweep stops reporting.

remediationUnhealthyNodes has no function on GCP: the managed instance groups' health
check already recreates a node that stops answering (infra/gcp/fleet.py).

Build: Cloud Build builds each function as a dedicated build account holding only
``roles/run.builder``, not as the project's default build account (which projects
created since mid-2024 leave without the permissions a build needs).

Delivery: each function is an HTTP function reached only from inside the project
(``ALLOW_INTERNAL_ONLY``) through a push subscription the stack owns, with an OIDC token
of a push identity that alone may invoke it. An Eventarc trigger would create its own
subscription, without the dead-letter topic and the retry backoff set here; with the
stack's subscription a message that keeps failing goes, after MAX_DELIVERY_ATTEMPTS, to
the function's dead-letter topic, whose subscription keeps it for a week. Each function
runs as its own service account with only what it needs, on this stack's resources.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pulumi
import pulumi_gcp as gcp

from ftfleet import contract
from ftfleet.infra.gcp import boot
from ftfleet.infra.gcp import function_package as package
from ftfleet.infra.gcp.alerts import Alerts
from ftfleet.infra.gcp.function_source import FunctionSource
from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.lambdas.common.gcp import Metric
from ftfleet.lambdas.common.pair import LeaseRef, Pair, Side
from ftfleet.lambdas.gcp_capacity_watch import config as capacity_config
from ftfleet.lambdas.gcp_capacity_watch.config import Config as CapacityConfig
from ftfleet.lambdas.gcp_preemption import config as preemption_config
from ftfleet.lambdas.gcp_preemption.config import PREEMPTED_METHOD
from ftfleet.lambdas.gcp_preemption.config import Config as PreemptionConfig
from ftfleet.lambdas.gcp_replication_watch import config as watch_config
from ftfleet.lambdas.gcp_replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.gcp_retention_sweep import config as sweep_config
from ftfleet.lambdas.gcp_retention_sweep.config import Config as SweepConfig
from ftfleet.lambdas.gcp_storage_drift.config import WATCHED_METHODS
from ftfleet.lambdas.gcp_storage_drift.config import Config as DriftConfig

#: Pub/Sub's bounds are 5 to 100 ("Dead-letter topics", https://cloud.google.com/pubsub/docs/handling-failures).
MAX_DELIVERY_ATTEMPTS = 5
#: Redelivery backoff of a failed message (Pub/Sub allows 0 to 600 s).
RETRY_BACKOFF = ("10s", "600s")
DEAD_LETTER_RETENTION = "604800s"
#: Cloud Scheduler's unix-cron format ("Cron job format and time zone",
#: https://cloud.google.com/scheduler/docs/configuring/cron-job-schedules), in Etc/UTC.
REPLICATION_SCHEDULE = "*/5 * * * *"
#: Every two minutes, as the AWS capacity watch (capacityLossMinutes is at least 5).
CAPACITY_SCHEDULE = "*/2 * * * *"
#: Read the stack's managed instance groups, their instances and their errors
#: (regionInstanceGroupManagers get, listManagedInstances, listErrors all require
#: compute.instanceGroupManagers.get), and no more.
CAPACITY_PERMISSIONS = ("compute.instanceGroupManagers.get",)
#: A standby's watch that moves the run also resizes both stacks' worker groups and
#: deletes a coordinator VM (regionInstanceGroupManagers.resize and .deleteInstances
#: require compute.instanceGroupManagers.update). Granted on the project: an instance
#: group manager takes no IAM policy of its own, and IAM Conditions' resource
#: attributes do not cover its type ("Resource attributes for IAM Conditions"), so a
#: condition on its name would deny the move rather than narrow it.
MOVE_PERMISSIONS = (*CAPACITY_PERMISSIONS, "compute.instanceGroupManagers.update")
#: Every hour on the hour: the default schedule keeps every checkpoint of the last six
#: hours, and what it lets go may wait an hour.
RETENTION_SCHEDULE = "0 * * * *"
#: The sweep's timeout. A push subscription's acknowledgement deadline is at most 600 s
#: ("Push subscriptions", https://cloud.google.com/pubsub/docs/push): a longer run
#: would be redelivered while it still runs. A backlog the sweep cannot finish in one
#: run is the next hour's.
SWEEP_TIMEOUT_S = 540
#: APIs the functions need; left enabled on destroy (other stacks of the project use them).
SERVICES = (
    "cloudfunctions.googleapis.com",
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "pubsub.googleapis.com",
    "cloudscheduler.googleapis.com",
    "monitoring.googleapis.com",
)
MONITORING = "monitoring.googleapis.com"
#: "Cloud Run Builder": what a function build needs (read its source, write and read
#: its image in Artifact Registry, write build logs), granted on the project, the
#: lowest level Google allows ("Configure a build service account" for Cloud Run
#: functions, https://cloud.google.com/run/docs/configuring/services/build-service-account).
BUILDER_ROLE = "roles/run.builder"
#: Permissions of the storage-drift function on the checkpoint bucket, and no more.
DRIFT_PERMISSIONS = (
    "storage.buckets.get",
    "storage.buckets.update",
    "storage.buckets.getIamPolicy",
    "storage.buckets.setIamPolicy",
)
#: Permissions of the retention sweep on the checkpoint bucket, and no more: list the
#: run's objects, read its manifests, delete.
SWEEP_PERMISSIONS = ("storage.objects.list", "storage.objects.get", "storage.objects.delete")


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    function: str
    short: str
    """Suffix of its resource and account names (account ids are at most 30 characters)."""
    timeout_s: int
    env: pulumi.Output[dict[str, str]]
    metrics: tuple[Metric, ...] = ()
    max_instances: int = 3
    """At most this many instances at once (1: one run at a time)."""
    """Custom metrics it writes: their descriptors exist before it does."""


def function_name(s: GcpSettings, function: str) -> str:
    """The deployed function's name (also its Cloud Run service's name)."""
    return f"{s.name}-{function.removeprefix('gcp_').replace('_', '-')}"


def preemption_count_filter(stack: str, service: str) -> str:
    """The preemption function's counted decision lines. Cloud Run parses a one-line
    JSON object on stdout into the entry's jsonPayload ("Writing structured logs")."""
    return " AND ".join(
        [
            'resource.type="cloud_run_revision"',
            f'resource.labels.service_name="{service}"',
            'jsonPayload.function="gcp_preemption"',
            f'jsonPayload.stack="{stack}"',
            f'jsonPayload.decision="{preemption_config.COUNTED}"',
        ]
    )


def preemption_count_extractors() -> dict[str, str]:
    """Label -> the field of the counted line it is read from ("Log-based metrics labels")."""
    return {label: f"EXTRACT(jsonPayload.{label})" for label in preemption_config.COUNT_LABELS}


def instance_machine_types(s: GcpSettings) -> dict[str, str]:
    """Base instance name -> machine type of its group (a flexible group: its types,
    joined by '|'; a preempted VM is deleted before anyone can ask which it was)."""
    workers = "|".join(s.fleet.worker_machine_types)
    out = {f"{s.name}-coordinator": s.fleet.coordinator_machine_type, f"{s.name}-workers": workers}
    if s.fleet.spot and s.fleet.on_demand_workers:
        out[f"{s.name}-workers-ondemand"] = s.fleet.worker_machine_types[0]
    return out


class RemediationFunctions(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        s: GcpSettings,
        bucket: gcp.storage.Bucket,
        source: FunctionSource | None,
        provider: gcp.Provider,
        groups: pulumi.Input[list[str]] | None = None,
        home: pulumi.Output[Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``source``: the functions' source bucket (and the drift function's desired
        state), declared before the checkpoint bucket; None when no function is on.
        ``groups``: the stack's managed instance groups (None: it has none yet, a
        standby whose file system comes with a failover), which the capacity watch reads,
        the coordinator's first. ``home``: a standby's home (infra/gcp/standby.py), whose
        groups a standby with standbyAutoFailover moves the run from and to."""
        super().__init__("ftfleet:gcp:RemediationFunctions", name, None, opts)
        self._name, self._s = name, s
        self._o = pulumi.ResourceOptions(parent=self, provider=provider)
        r = s.remediation
        common = {"stack": s.stack, "run_id": s.trainer.run_id}
        root = boot.checkpoint_root(s)
        project = gcp.organizations.get_project_output(opts=pulumi.InvokeOutputOptions(provider=provider))
        self._project_id = project.project_id
        specs: list[FunctionSpec] = []
        self.moves = s.standby is not None and s.standby.auto_failover and home is not None
        if r.spot_interruption:
            env = pulumi.Output.all(self._project_id, bucket.name).apply(
                lambda a: PreemptionConfig(
                    **common,
                    project=a[0],
                    prefixes=tuple(instance_machine_types(s)),
                    machine_types=instance_machine_types(s),
                    bucket=a[1],
                    root=root,
                ).to_env()
            )
            specs.append(FunctionSpec("gcp_preemption", "preempt", 60, env, preemption_config.METRICS))
        if r.storage_drift:
            env = pulumi.Output.all(self._project_id, bucket.name, source.desired_uri).apply(
                lambda a: DriftConfig(**common, project=a[0], buckets=(a[1],), desired_uri=a[2]).to_env()
            )
            specs.append(FunctionSpec("gcp_storage_drift", "drift", 300, env))
        if r.replication_lag:
            env = pulumi.Output.all(self._project_id, bucket.name).apply(
                lambda a: WatchConfig(
                    **common,
                    project=a[0],
                    bucket=a[1],
                    root=root,
                    rpo="ASYNC_TURBO" if s.buckets.turbo_replication else "DEFAULT",
                    lag_alarm_s=float(r.replication_lag_alarm_seconds),
                ).to_env()
            )
            specs.append(FunctionSpec("gcp_replication_watch", "replwatch", 120, env, watch_config.METRICS))
        if r.capacity_watch and groups is not None:
            env = pulumi.Output.all(self._project_id, bucket.name, groups, home).apply(
                lambda a: CapacityConfig(
                    **common,
                    project=a[0],
                    region=s.region,
                    groups=tuple(a[2]),
                    loss_s=float(r.capacity_loss_minutes * 60),
                    bucket=a[1],
                    # One per stack: a standby shares its home's bucket and root.
                    state_key=f"{root}/fleet/capacity-watch-{s.stack}.json",
                    failover=move_pair(s, a[0], a[1], root, a[2], a[3]) if self.moves else None,
                ).to_env()
            )
            specs.append(
                FunctionSpec(
                    "gcp_capacity_watch",
                    "capwatch",
                    120,
                    env,
                    capacity_config.METRICS,
                    max_instances=1 if self.moves else 3,
                )
            )
        if r.retention_sweep:
            env = pulumi.Output.all(self._project_id, bucket.name).apply(
                lambda a: SweepConfig(
                    **common,
                    project=a[0],
                    bucket=a[1],
                    root=root,
                    rules=r.checkpoint_retention,
                    timeout_s=float(SWEEP_TIMEOUT_S),
                ).to_env()
            )
            specs.append(FunctionSpec("gcp_retention_sweep", "sweep", SWEEP_TIMEOUT_S, env, sweep_config.METRICS))

        self.functions: dict[str, gcp.cloudfunctionsv2.Function] = {}
        self.topics: dict[str, gcp.pubsub.Topic] = {}
        self.dead_letter_topics: dict[str, gcp.pubsub.Topic] = {}
        if not specs:
            self.register_outputs({})
            return
        self.services = [
            gcp.projects.Service(f"{name}-{api.split('.')[0]}", service=api, disable_on_destroy=False, opts=self._o)
            for api in SERVICES
        ]
        self.source = source.bucket
        # Pub/Sub's service agent mints the push tokens and forwards dead letters. On a
        # project that never used Pub/Sub it may not exist yet, and a grant to an agent
        # that does not exist fails ("Create and grant roles to service agents"):
        # the stack creates it and takes its identity from that resource.
        self.pubsub_agent = gcp.projects.ServiceIdentity(
            f"{name}-pubsub-agent",
            project=self._project_id,
            service="pubsub.googleapis.com",
            opts=self._opts(depends_on=[self.services[SERVICES.index("pubsub.googleapis.com")]]),
        )
        # The identity in the push subscriptions' OIDC tokens: it may invoke the
        # functions and nothing else. Pub/Sub's service agent mints its tokens.
        self.pusher = gcp.serviceaccount.Account(
            f"{name}-push",
            account_id=self._account_id("push"),
            display_name=f"{s.name} Pub/Sub push to remediation functions",
            opts=self._o,
        )
        self.pusher_tokens = gcp.serviceaccount.IAMMember(
            f"{name}-push-tokens",
            service_account_id=self.pusher.name,
            role="roles/iam.serviceAccountTokenCreator",
            member=self.pubsub_agent.member,
            opts=self._o,
        )
        # Cloud Build builds each function's container. Projects created since mid-2024
        # leave the default build account without the permissions a function build
        # needs ("Custom service account for Cloud Build"): the builds run as this
        # account, with the one role Google documents for it.
        self.builder = gcp.serviceaccount.Account(
            f"{name}-build",
            account_id=self._account_id("build"),
            display_name=f"{s.name} remediation function builds",
            description="Cloud Build runs the remediation functions' builds as this account",
            opts=self._o,
        )
        self.builder_role = gcp.projects.IAMMember(
            f"{name}-build-builder",
            project=self._project_id,
            role=BUILDER_ROLE,
            member=self.builder.member,
            opts=self._o,
        )
        self.alerts = Alerts(
            f"{name}-alerts",
            s,
            tuple(metric for spec in specs for metric in spec.metrics),
            bucket,
            provider,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.services[SERVICES.index(MONITORING)]]),
        )
        for spec in specs:
            self._function(spec, bucket)
        if r.spot_interruption:
            self._preemption_count(f"{name}-preempt")
            self._log_sink(
                "preempt",
                "gcp_preemption",
                " AND ".join(
                    [
                        'resource.type="gce_instance"',
                        f'protoPayload.methodName="{PREEMPTED_METHOD}"',
                        f'protoPayload.resourceName:"/instances/{s.name}-"',
                    ]
                ),
            )
        if r.storage_drift:
            methods = " OR ".join(f'"{m}"' for m in WATCHED_METHODS)
            self._log_sink(
                "drift",
                "gcp_storage_drift",
                bucket.name.apply(
                    lambda b: " AND ".join(
                        [
                            'resource.type="gcs_bucket"',
                            f'resource.labels.bucket_name="{b}"',
                            'logName:"cloudaudit.googleapis.com%2Factivity"',
                            f"protoPayload.methodName=({methods})",
                        ]
                    )
                ),
            )
        self.schedules: dict[str, gcp.cloudscheduler.Job] = {}
        if r.replication_lag:
            self._schedule("replwatch", "gcp_replication_watch", REPLICATION_SCHEDULE, "run the replication watch")
        if "gcp_capacity_watch" in self.functions:
            self._schedule("capwatch", "gcp_capacity_watch", CAPACITY_SCHEDULE, "run the capacity watch")
        if r.retention_sweep:
            self._schedule("sweep", "gcp_retention_sweep", RETENTION_SCHEDULE, "run the retention sweep")
        self.register_outputs({"functions": {k: f.name for k, f in self.functions.items()}})

    # --- helpers ------------------------------------------------------------------------

    def _opts(self, **kw) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions.merge(self._o, pulumi.ResourceOptions(**kw))

    def _account_id(self, short: str) -> str:
        """6-30 characters: the stack's name, cut to fit, then the function's suffix."""
        return f"{self._s.name[: 29 - len(short)].rstrip('-')}-{short}"

    def _function(self, spec: FunctionSpec, bucket: gcp.storage.Bucket) -> None:
        n, s = f"{self._name}-{spec.short}", self._s
        account = gcp.serviceaccount.Account(
            f"{n}-sa",
            account_id=self._account_id(spec.short),
            display_name=f"{s.name} {spec.function}",
            description=f"Runs the {spec.function} remediation function",
            opts=self._o,
        )
        self._grants(spec.function, n, account.member, bucket)
        object_name, archive = package.archive(spec.function)
        source = gcp.storage.BucketObject(
            f"{n}-source", bucket=self.source.name, name=object_name, source=archive, opts=self._o
        )
        fn = gcp.cloudfunctionsv2.Function(
            n,
            name=function_name(s, spec.function),
            location=s.region,
            description=f"ftfleet {spec.function} for stack {s.stack}",
            build_config=gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
                runtime=package.RUNTIME,
                entry_point=package.ENTRY_POINT,
                service_account=self.builder.name,
                source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
                    storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                        bucket=self.source.name, object=source.name
                    )
                ),
            ),
            service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                available_memory="256M",
                timeout_seconds=spec.timeout_s,
                max_instance_count=spec.max_instances,
                min_instance_count=0,
                max_instance_request_concurrency=1,
                ingress_settings="ALLOW_INTERNAL_ONLY",
                all_traffic_on_latest_revision=True,
                service_account_email=account.email,
                environment_variables=spec.env,
            ),
            opts=self._opts(
                depends_on=[
                    *self.services,
                    self.builder_role,
                    *(self.alerts.descriptors[x.name] for x in spec.metrics),
                ]
            ),
        )
        invoker = gcp.cloudrunv2.ServiceIamMember(
            f"{n}-invoker",
            location=s.region,
            name=fn.name,
            role="roles/run.invoker",
            member=self.pusher.member,
            opts=self._o,
        )
        topic = gcp.pubsub.Topic(
            f"{n}-events", name=f"{s.name}-{spec.short}-events", opts=self._opts(depends_on=self.services)
        )
        dead = gcp.pubsub.Topic(
            f"{n}-dead-letters", name=f"{s.name}-{spec.short}-dead-letters", opts=self._opts(depends_on=self.services)
        )
        gcp.pubsub.Subscription(
            f"{n}-dead-letters",
            name=f"{s.name}-{spec.short}-dead-letters",
            topic=dead.id,
            message_retention_duration=DEAD_LETTER_RETENTION,
            ack_deadline_seconds=60,
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            opts=self._o,
        )
        push = gcp.pubsub.Subscription(
            f"{n}-push",
            name=f"{s.name}-{spec.short}-push",
            topic=topic.id,
            ack_deadline_seconds=max(10, min(600, spec.timeout_s + 30)),
            push_config=gcp.pubsub.SubscriptionPushConfigArgs(
                push_endpoint=fn.url,
                oidc_token=gcp.pubsub.SubscriptionPushConfigOidcTokenArgs(
                    service_account_email=self.pusher.email, audience=fn.url
                ),
            ),
            retry_policy=gcp.pubsub.SubscriptionRetryPolicyArgs(
                minimum_backoff=RETRY_BACKOFF[0], maximum_backoff=RETRY_BACKOFF[1]
            ),
            dead_letter_policy=gcp.pubsub.SubscriptionDeadLetterPolicyArgs(
                dead_letter_topic=dead.id, max_delivery_attempts=MAX_DELIVERY_ATTEMPTS
            ),
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            opts=self._opts(depends_on=[invoker, self.pusher_tokens]),
        )
        # Forwarding to the dead-letter topic is done by Pub/Sub's service agent, which
        # needs to publish there and to acknowledge on the source subscription.
        agent = self.pubsub_agent.member
        gcp.pubsub.TopicIAMMember(
            f"{n}-dead-letters-publisher", topic=dead.name, role="roles/pubsub.publisher", member=agent, opts=self._o
        )
        gcp.pubsub.SubscriptionIAMMember(
            f"{n}-push-subscriber", subscription=push.name, role="roles/pubsub.subscriber", member=agent, opts=self._o
        )
        self.functions[spec.function] = fn
        self.topics[spec.function] = topic
        self.dead_letter_topics[spec.function] = dead

    def _schedule(self, short: str, function: str, schedule: str, what: str) -> None:
        """A Cloud Scheduler job that publishes a tick to the function's topic."""
        s = self._s
        self.schedules[function] = gcp.cloudscheduler.Job(
            f"{self._name}-{short}",
            region=s.region,
            schedule=schedule,
            time_zone="Etc/UTC",
            description=f"{s.name}: {what}",
            pubsub_target=gcp.cloudscheduler.JobPubsubTargetArgs(
                topic_name=self.topics[function].id,
                data=base64.b64encode(json.dumps({"stack": s.stack}).encode()).decode(),
            ),
            opts=self._opts(depends_on=self.services),
        )

    def _custom_role(self, n: str, kind: str, title: str, description: str, permissions: tuple[str, ...]):
        """A project custom role of exactly ``permissions``; the caller grants it on the bucket only."""
        return gcp.projects.IAMCustomRole(
            f"{n}-role",
            role_id=f"ftfleet{kind}{''.join(p.title() for p in self._s.stack.split('-'))}"[:64],
            title=f"{self._s.name} {title}",
            description=description,
            permissions=list(permissions),
            opts=self._o,
        )

    def _grants(self, function: str, n: str, member: pulumi.Output[str], bucket: gcp.storage.Bucket) -> None:
        """Least privilege, scoped to this stack's bucket where the role allows it.

        Bucket-level bindings without IAM conditions, as for every function and the
        nodes (infra/gcp/iam.py): the bucket is this stack's, and each function keeps to
        the run's root by its code (the handlers' tests check it). Scoping them to the
        root would be a condition on the objects' ``resource.name``
        (``projects/_/buckets/<bucket>/objects/<root>/``, "IAM Conditions" for Cloud
        Storage), for every function at once."""
        grants: list[tuple[str, pulumi.Input[str]]] = []
        if function in ("gcp_preemption", "gcp_capacity_watch"):  # a state object next to the checkpoints
            grants = [("prior" if function == "gcp_preemption" else "state", "roles/storage.objectUser")]
        if function == "gcp_capacity_watch":
            role = self._custom_role(
                n,
                "Capacity",
                "capacity watch",
                "Read the stack's managed instance groups, their instances and their errors"
                + (", and resize them and the home's to move the run" if self.moves else ""),
                MOVE_PERMISSIONS if self.moves else CAPACITY_PERMISSIONS,
            )
            gcp.projects.IAMMember(f"{n}-groups", project=self._project_id, role=role.name, member=member, opts=self._o)
        elif function == "gcp_replication_watch":
            grants = [("read", "roles/storage.objectViewer")]
        elif function == "gcp_retention_sweep":
            role = self._custom_role(
                n,
                "Sweep",
                "retention sweep",
                "List and read the run's checkpoints and delete those its retention schedule no longer keeps",
                SWEEP_PERMISSIONS,
            )
            grants = [("sweep", role.name)]
        elif function == "gcp_storage_drift":
            role = self._custom_role(
                n,
                "Drift",
                "storage drift repair",
                "Read and restore the checkpoint bucket's settings and IAM policy",
                DRIFT_PERMISSIONS,
            )
            grants = [("repair", role.name)]
            # The desired state it reads at every event (infra/gcp/function_source.py).
            gcp.storage.BucketIAMMember(
                f"{n}-desired", bucket=self.source.name, role="roles/storage.objectViewer", member=member, opts=self._o
            )
        for label, role in grants:
            gcp.storage.BucketIAMMember(f"{n}-{label}", bucket=bucket.name, role=role, member=member, opts=self._o)
        if function in ("gcp_replication_watch", "gcp_retention_sweep", "gcp_capacity_watch"):  # custom metrics
            gcp.projects.IAMMember(
                f"{n}-metrics",
                project=self._project_id,
                role="roles/monitoring.metricWriter",
                member=member,
                opts=self._o,
            )

    def _preemption_count(self, n: str) -> None:
        """Preemptions per zone and machine type, counted per interval by Cloud Logging
        from the preemption function's decision lines (never one time series point per
        preemption, which Cloud Monitoring would refuse in a wave)."""
        s = self._s
        self.preemption_count = gcp.logging.Metric(
            f"{n}-count",
            name=f"{s.name}-preemptions",
            description=f"{s.name}: Spot VMs preempted, per zone and machine type",
            filter=preemption_count_filter(s.stack, function_name(s, "gcp_preemption")),
            metric_descriptor=gcp.logging.MetricMetricDescriptorArgs(
                metric_kind="DELTA",
                value_type="INT64",
                unit="1",
                display_name=f"{s.name} preemptions",
                labels=[
                    gcp.logging.MetricMetricDescriptorLabelArgs(key=label, value_type="STRING")
                    for label in preemption_config.COUNT_LABELS
                ],
            ),
            label_extractors=preemption_count_extractors(),
            opts=self._o,
        )

    def _log_sink(self, short: str, function: str, log_filter: pulumi.Input[str]) -> None:
        n = f"{self._name}-{short}"
        topic = self.topics[function]
        sink = gcp.logging.ProjectSink(
            f"{n}-sink",
            name=f"{self._s.name}-{short}",
            destination=pulumi.Output.concat("pubsub.googleapis.com/", topic.id),
            filter=log_filter,
            unique_writer_identity=True,
            description=f"{self._s.name}: events for {function}",
            opts=self._o,
        )
        gcp.pubsub.TopicIAMMember(
            f"{n}-sink-publisher",
            topic=topic.name,
            role="roles/pubsub.publisher",
            member=sink.writer_identity,
            opts=self._o,
        )


def move_pair(s: GcpSettings, project: str, bucket: str, root: str, groups: list[str], home: Any) -> Pair:
    """What a standby's capacity watch moves: its home (``home``, infra/gcp/standby.py)
    and itself (``groups``: its coordinator's group, then its worker groups), both on
    the home's bucket, with the run lease in it."""
    home_workers = [g for g in home.worker_groups.split(",") if g]

    def side(stack: str, region: str, coordinator: str, workers: list[str]) -> Side:
        return Side(
            stack,
            region,
            coordinator,
            workers[0],
            bucket,
            root,
            cloud="gcp",
            project=project,
            more_worker_groups=tuple(workers[1:]),
        )

    return Pair(
        home=side(home.stack, home.region, home.coordinator_group, home_workers),
        standby=side(s.stack, s.region, groups[0], list(groups[1:])),
        lease=LeaseRef(bucket, contract.lease_key(s.trainer.run_id), home.region, s.trainer.run_id),
    )
