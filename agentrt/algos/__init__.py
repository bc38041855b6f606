"""Algorithms as pure functions in registries: advantage estimators, policy losses, KL.

Every registry has one signature, so adding an estimator or a loss never touches the trainer:

- ``ADVANTAGES[name](inputs: AdvantageInputs, cfg) -> (advantages [B,T], returns [B,T])``
- ``POLICY_LOSSES[name](logprobs, old_logprobs, advantages, mask, cfg) -> (token_loss [B,T], metrics)``
- ``KL_ESTIMATORS[name](logprobs, ref_logprobs) -> kl [B,T]``
- ``KL_CONTROLLERS[name](cfg) -> controller`` with ``.coef`` and ``.update(kl, n_steps)``
- ``PREFERENCE_LOSSES[name](policy_logps [N], ref_logps [N], index, cfg) -> (loss [G], metrics)``
"""

from __future__ import annotations

from typing import Any, Callable

from agentrt.core.lazy import lazy_exports
from agentrt.core.registry import Registry

# The registries name their built-in entries here, loaded on first use, so a config naming an
# algorithm is checked without importing torch. User code adds its own with ``.register(name)``.
ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage estimator")
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss")
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("kl estimator")
KL_CONTROLLERS: Registry[Callable[..., Any]] = Registry("kl controller")
PREFERENCE_LOSSES: Registry[Callable[..., Any]] = Registry("preference loss")

for _registry, _module, _entries in (
    (ADVANTAGES, "advantages", {"gae": "gae", "grpo": "grpo", "rloo": "rloo",
                                "reinforce++": "reinforce_pp",
                                "reinforce++-baseline": "reinforce_pp_baseline"}),
    (ADVANTAGES, "rae", {"rae": "rae"}),
    (POLICY_LOSSES, "losses", {"ppo": "ppo_clip", "vanilla": "vanilla_pg"}),
    (KL_ESTIMATORS, "kl", {"k1": "k1", "k2": "k2", "k3": "k3"}),
    (KL_CONTROLLERS, "kl", {"fixed": "fixed_controller", "adaptive": "adaptive_controller",
                            "decay": "decay_controller"}),
    (PREFERENCE_LOSSES, "preference", {"dpo": "dpo_loss", "ipo": "ipo_loss",
                                       "listwise": "plackett_luce_loss", "kto": "kto_loss"}),
):
    for _name, _attr in _entries.items():
        _registry.add_lazy(_name, f"agentrt.algos.{_module}:{_attr}")

__getattr__, __dir__, _lazy = lazy_exports(__name__, globals(), {
    "agentrt.algos.advantages": ("AdvantageInputs", "masked_whiten"),
    "agentrt.algos.losses": ("AGGREGATIONS", "aggregate", "entropy_from_logits",
                             "sft_token_loss", "value_token_loss"),
    "agentrt.algos.preference": ("PreferenceIndex", "preference_metrics", "sequence_logps"),
    "agentrt.algos.rae": ("RAE_BASELINES", "RAEState", "use_rae_state"),
})
__all__ = ["ADVANTAGES", "KL_CONTROLLERS", "KL_ESTIMATORS", "POLICY_LOSSES", "PREFERENCE_LOSSES",
           *_lazy]
