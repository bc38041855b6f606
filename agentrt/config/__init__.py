"""Run configuration: the shared sections, the run configs' base, loading and validation."""
