"""``agentrt serve``: the policies of a run behind an OpenAI-compatible HTTP API, hot-swappable.

See docs/serving.md. Importing this package imports neither torch nor the HTTP stack.
"""
