"""agentrt.memory (see DESIGN.md)."""
