"""The runtime: the shared model and its adapters, the learner, losses, pools and workers, rollout backends."""
