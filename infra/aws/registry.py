"""Registry: the ECR repository of the trainer image, and whether the image is in it.

The first `pulumi up` creates the repository, so nobody can have pushed the trainer
image yet. `image_pushed` asks ECR, once the repository exists, whether the configured
tag is there; the program keeps the node groups at 0 until it is (README: AWS: first
deploy), so no GPU node waits for an image nobody has pushed. A later `pulumi up` with a
tag that is not pushed shows the groups going to 0 in its preview.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from ftfleet.infra.settings import Settings

# Untagged layers pile up with every push; tagged releases are kept.
EXPIRE_UNTAGGED = json.dumps(
    {
        "rules": [
            {
                "rulePriority": 1,
                "description": "expire untagged images after 14 days",
                "selection": {
                    "tagStatus": "untagged",
                    "countType": "sinceImagePushed",
                    "countUnit": "days",
                    "countNumber": 14,
                },
                "action": {"type": "expire"},
            }
        ]
    }
)


def repository_of(stack_prefix: str) -> str:
    """The trainer repository's name for the stack whose names start ``stack_prefix``."""
    return f"{stack_prefix}/trainer"


class Registry(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        provider: aws.Provider,
        repository_name: str | None = None,
        existing: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``repository_name``: default ``<settings.name>/trainer``; a standby names its
        home's, which is the name ECR's replication writes to in this region.
        ``existing``: the repository is not this stack's (a standby whose account already
        replicates the home's repository here, which made it): it is looked up, and the
        run stops if it is not there yet."""
        super().__init__("ftfleet:aws:Registry", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        self.repository: aws.ecr.Repository | aws.ecr.GetRepositoryResult
        if existing:
            self.repository = aws.ecr.get_repository_output(
                name=repository_name or repository_of(settings.name), opts=pulumi.InvokeOutputOptions(provider=provider)
            )
            self._image(settings, provider)
            return
        self.repository = aws.ecr.Repository(
            f"{name}-trainer",
            name=repository_name or repository_of(settings.name),
            # A tag always names the same image: nodes replaced mid-run pull what the
            # others run.
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="AES256")],
            opts=o,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-trainer-lifecycle", repository=self.repository.name, policy=EXPIRE_UNTAGGED, opts=o
        )
        self._image(settings, provider)

    def _image(self, settings: Settings, provider: aws.Provider) -> None:
        self.image_uri = pulumi.Output.concat(self.repository.repository_url, ":", settings.trainer.image_tag)
        # Through repository_url (unknown until the repository exists), so the invoke
        # never asks about a repository that is still to be created.
        existing = pulumi.Output.all(self.repository.name, self.repository.repository_url).apply(lambda a: a[0])
        images = aws.ecr.get_images_output(repository_name=existing, opts=pulumi.InvokeOutputOptions(provider=provider))
        tag = settings.trainer.image_tag
        self.image_pushed: pulumi.Output[bool] = images.image_ids.apply(
            lambda ids: any(i.image_tag == tag for i in ids or [])
        )
        self.register_outputs({"repository_url": self.repository.repository_url, "image_uri": self.image_uri})
