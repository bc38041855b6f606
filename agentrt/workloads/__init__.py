"""Workloads of the controller loop that live inside agentrt (tournaments and the decomposer are their own packages)."""
