"""``agentrt train``: the prompt workload, its tasks' data sources and its config."""
