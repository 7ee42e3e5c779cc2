"""BucketKey: the customer-managed key of the checkpoint bucket (gcsCmek: true).

Cloud Storage encrypts with the key on the bucket's behalf, as the project's Cloud
Storage service agent, so that agent (not the nodes) is granted encrypt/decrypt on the
key, and the bucket waits for the grant ("Use customer-managed encryption keys",
https://cloud.google.com/storage/docs/encryption/using-customer-managed-keys). The key
ring sits in the Cloud KMS location that matches the bucket's dual-region.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp import locations
from ftfleet.infra.gcp.settings import GcpSettings

ROTATION_SECONDS = 90 * 24 * 3600


class BucketKey(pulumi.ComponentResource):
    def __init__(
        self, name: str, settings: GcpSettings, provider: gcp.Provider, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("ftfleet:gcp:BucketKey", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        # Key rings and keys cannot be deleted in Cloud KMS, only their versions
        # destroyed: protect them so that no update tries.
        keep = pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(protect=True))
        self.ring = gcp.kms.KeyRing(
            f"{name}-ring",
            name=f"{settings.name}-ckpt",
            location=locations.KMS_LOCATIONS[settings.buckets.location],
            opts=keep,
        )
        self.key = gcp.kms.CryptoKey(
            f"{name}-key",
            name="checkpoints",
            key_ring=self.ring.id,
            purpose="ENCRYPT_DECRYPT",
            rotation_period=f"{ROTATION_SECONDS}s",
            opts=keep,
        )
        agent = gcp.storage.get_project_service_account_output(opts=pulumi.InvokeOutputOptions(provider=provider))
        self.grant = gcp.kms.CryptoKeyIAMMember(
            f"{name}-storage-agent",
            crypto_key_id=self.key.id,
            role="roles/cloudkms.cryptoKeyEncrypterDecrypter",
            member=agent.email_address.apply(lambda email: f"serviceAccount:{email}"),
            opts=o,
        )
        self.register_outputs({"key": self.key.id})
