"""A user's reward module that raises while it is imported (tests/test_bad_input_table.py)."""

raise RuntimeError("the reward module is broken")


def reward(prompt: str, response: str, info: dict) -> float:  # never reached
    return 0.0
