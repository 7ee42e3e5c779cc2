"""retention_sweep: the run's retention schedule applied to the primary bucket every hour,
for the checkpoints no trainer prunes (exported by the fast tier, or of a run that is gone)."""
