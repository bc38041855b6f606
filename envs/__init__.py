"""agentrt.envs (see DESIGN.md)."""
