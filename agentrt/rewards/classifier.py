"""What a learned reward model's folder must be: a local sequence classifier with 1 or 2 labels.

Read by the ``model`` source's check (:mod:`agentrt.rewards.sources`) and by its executor
(:mod:`agentrt.rewards.model`); nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrt.core.errors import ConfigError


def classifier_labels(folder: str, field: str) -> int:
    """The number of labels of a sequence-classification folder, else ConfigError."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        missing = "does not exist" if not path.exists() else "has no config.json"
        raise ConfigError(f"{field}: {folder!r} {missing}; give a local Hugging Face "
                          "sequence-classification folder (examples/train_reward_model.py makes one)")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{field}: {folder}/config.json is not readable JSON") from None
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        shown = ", ".join(archs) or "no architectures"
        raise ConfigError(f"{field}: {folder!r} is {shown}, not a sequence classifier; give an "
                          "AutoModelForSequenceClassification folder (examples/"
                          "train_reward_model.py trains one)")
    labels = len(cfg.get("id2label") or {}) or int(cfg.get("num_labels", 2))
    if labels not in (1, 2):
        raise ConfigError(f"{field}: {folder!r} has {labels} labels; a reward model has 1 (a "
                          "score) or 2 (wrong/right)")
    return labels
