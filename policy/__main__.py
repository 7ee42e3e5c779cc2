"""CrossGuard entry point: `pulumi preview --policy-pack policy/` (see infra/crossguard.py)."""

from ftfleet.infra.crossguard import serve

serve()
