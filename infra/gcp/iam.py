"""NodeIdentity: the one service account every node runs as, with only what nodes need.

* object admin on the checkpoint bucket only (a bucket-level binding, not the
  project's): the trainer writes, reads, lists and prunes checkpoints and markers;
* reader on the trainer's Artifact Registry repository;
* log writer and metric writer on the project (Cloud Logging and Cloud Monitoring
  accept writes only through these project-level roles).

No primitive role (owner, editor, viewer) anywhere; the policies check it. The
coordinator needs nothing more: it keeps its address through its group's stateful
configuration, not by writing a DNS record.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings

PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")


class NodeIdentity(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        bucket: pulumi.Input[str],
        repository: gcp.artifactregistry.Repository,
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:gcp:NodeIdentity", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        # account_id: 6-30 characters; the stack name is cut to fit.
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=f"{settings.name[:24].rstrip('-')}-nodes",
            display_name=f"{settings.name} GPU nodes",
            description="Runs the trainer: checkpoint bucket, trainer image, logs and metrics",
            opts=o,
        )
        member = self.account.member
        self.bindings = [
            gcp.storage.BucketIAMMember(
                f"{name}-checkpoints", bucket=bucket, role="roles/storage.objectAdmin", member=member, opts=o
            ),
            gcp.artifactregistry.RepositoryIamMember(
                f"{name}-image",
                location=repository.location,
                repository=repository.name,
                role="roles/artifactregistry.reader",
                member=member,
                opts=o,
            ),
        ]
        for role in PROJECT_ROLES:
            self.bindings.append(
                gcp.projects.IAMMember(
                    f"{name}-{role.split('/')[1].replace('.', '-')}",
                    project=self.account.project,
                    role=role,
                    member=member,
                    opts=o,
                )
            )
        self.email = self.account.email
        self.register_outputs({"email": self.email})
