"""agentrt.tournaments (see DESIGN.md)."""
