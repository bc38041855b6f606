"""agentrt: RL post-training runtime for many language-model policies."""

__version__ = "0.1.0"
