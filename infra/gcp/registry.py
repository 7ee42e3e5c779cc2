"""Registry: the Artifact Registry repository of the trainer image.

Tags are immutable, so a node replaced mid-run pulls exactly what the others run.
Cleanup policies delete untagged images (layers left by re-pushes and failed builds)
after two weeks and keep every tagged release ("Configure cleanup policies",
https://cloud.google.com/artifact-registry/docs/repositories/cleanup-policy).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings

ar = gcp.artifactregistry
UNTAGGED_AFTER_SECONDS = 14 * 24 * 3600


class Registry(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        provider: gcp.Provider,
        upstream: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``upstream``: a standby's home repository (``projects/P/locations/L/
        repositories/R``); the repository here is then a read-only remote repository
        that fetches and caches what the nodes pull from it ("Remote repositories
        overview": a standard Artifact Registry repository as the upstream; the project's
        Artifact Registry service agent downloads from repositories of its project)."""
        super().__init__("ftfleet:gcp:Registry", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        if upstream is not None:
            self.repository = ar.Repository(
                f"{name}-trainer",
                repository_id=settings.name,
                location=settings.region,
                format="DOCKER",
                mode="REMOTE_REPOSITORY",
                description=f"{settings.name}: the home stack's trainer images, fetched on first pull",
                remote_repository_config=ar.RepositoryRemoteRepositoryConfigArgs(
                    description="the home stack's trainer repository",
                    common_repository=ar.RepositoryRemoteRepositoryConfigCommonRepositoryArgs(uri=upstream),
                ),
                opts=o,
            )
            self._finish(settings)
            return
        self.repository = ar.Repository(
            f"{name}-trainer",
            repository_id=settings.name,
            location=settings.region,
            format="DOCKER",
            description=f"{settings.name}: trainer image",
            docker_config=ar.RepositoryDockerConfigArgs(immutable_tags=True),
            cleanup_policy_dry_run=False,
            cleanup_policies=[
                ar.RepositoryCleanupPolicyArgs(
                    id="delete-untagged",
                    action="DELETE",
                    condition=ar.RepositoryCleanupPolicyConditionArgs(
                        tag_state="UNTAGGED", older_than=f"{UNTAGGED_AFTER_SECONDS}s"
                    ),
                ),
                ar.RepositoryCleanupPolicyArgs(
                    id="keep-releases",
                    action="KEEP",
                    condition=ar.RepositoryCleanupPolicyConditionArgs(tag_state="TAGGED"),
                ),
            ],
            opts=o,
        )
        self._finish(settings)

    def _finish(self, settings: GcpSettings) -> None:
        #: `<region>-docker.pkg.dev/<project>/<repository>`
        self.registry_uri = self.repository.registry_uri
        self.registry_host = f"{settings.region}-docker.pkg.dev"
        self.image_uri = pulumi.Output.concat(self.registry_uri, "/trainer:", settings.trainer.image_tag)
        self.register_outputs({"registry_uri": self.registry_uri, "image_uri": self.image_uri})
