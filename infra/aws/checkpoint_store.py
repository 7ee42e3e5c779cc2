"""CheckpointStore: FSx for Lustre PERSISTENT_2, the fast checkpoint tier.

A data repository association maps `/<checkpointPrefix>` on the file system to the
same prefix in the primary bucket. It exports new and changed files, never deletions:
the trainer prunes old checkpoints from the fast tier, and that must not erase the
bucket's history, which the lifecycle rules govern. It imports new and changed objects,
so a checkpoint restored into the bucket (e.g. from the replica) appears on the mount.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from ftfleet.infra.settings import Settings


class CheckpointStore(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        subnet_id: pulumi.Input[str],
        security_group_id: pulumi.Input[str],
        key_arn: pulumi.Input[str],
        bucket: pulumi.Input[str],
        provider: aws.Provider,
        security_group_rules: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``security_group_rules``: the ingress rules of the file system's group;
        CreateFileSystem rejects a group that does not admit port 988 at that moment."""
        super().__init__("ftfleet:aws:CheckpointStore", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        st = settings.storage
        self.file_system = aws.fsx.LustreFileSystem(
            f"{name}-lustre",
            deployment_type="PERSISTENT_2",
            storage_type="SSD",
            storage_capacity=st.fsx_storage_capacity_gib,
            per_unit_storage_throughput=st.fsx_throughput_per_tib,
            data_compression_type=st.fsx_compression,
            file_system_type_version="2.15",
            metadata_configuration=aws.fsx.LustreFileSystemMetadataConfigurationArgs(mode="AUTOMATIC"),
            # PERSISTENT_2 lives in one subnet (a string in pulumi_aws 7, not a list).
            subnet_ids=subnet_id,
            security_group_ids=[security_group_id],
            kms_key_id=key_arn,
            log_configuration=aws.fsx.LustreFileSystemLogConfigurationArgs(level="WARN_ERROR"),
            automatic_backup_retention_days=0,
            # Checkpoints on the fast tier outlive any one `pulumi up`: never replaced
            # or deleted by a typo (unprotect explicitly to remove it).
            opts=pulumi.ResourceOptions.merge(
                o, pulumi.ResourceOptions(protect=True, depends_on=list(security_group_rules))
            ),
        )
        prefix = settings.buckets.checkpoint_prefix
        self.association = aws.fsx.DataRepositoryAssociation(
            f"{name}-export",
            file_system_id=self.file_system.id,
            file_system_path=f"/{prefix.rstrip('/')}",
            data_repository_path=pulumi.Output.concat("s3://", bucket, "/", prefix),
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(events=["NEW", "CHANGED"]),
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(events=["NEW", "CHANGED"]),
            ),
            opts=o,
        )
        self.register_outputs({"dns_name": self.file_system.dns_name, "mount_name": self.file_system.mount_name})
