"""storage_drift: restores the checkpoint buckets' settings and the FSx data repository
association to what the stack's program rendered, and verifies the repair."""
