"""lifecycle_handoff: the backstop that completes the termination lifecycle action of a
stack node once its commit marker is written, or at the deadline."""
