"""Built-in task families (importing this package registers them)."""

from agentrt.decomposer.families import eventplan  # noqa: F401
from agentrt.decomposer.families import shopping  # noqa: F401
from agentrt.decomposer.families import wordchain  # noqa: F401
