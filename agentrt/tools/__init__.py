"""Commands around runs: config checks, checkpoint checks, ``agentrt debug``, ``agentrt play``."""
