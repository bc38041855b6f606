"""The controller: the one loop of every run and the run features around it (run folder, checkpoints, metrics, control)."""
