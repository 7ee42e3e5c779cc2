"""ftfleet: preemptible GPU fleets (Pulumi) and a trainer that survives them."""

__version__ = "0.1.0"
