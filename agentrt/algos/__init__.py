"""Algorithms as pure functions in registries: advantage estimators, policy losses, KL.

Every registry has one signature, so adding an estimator or a loss never touches the trainer:

- ``ADVANTAGES[name](inputs: AdvantageInputs, cfg) -> (advantages [B,T], returns [B,T])``
- ``POLICY_LOSSES[name](logprobs, old_logprobs, advantages, mask, cfg) -> (token_loss [B,T], metrics)``
- ``KL_ESTIMATORS[name](logprobs, ref_logprobs) -> kl [B,T]``
- ``KL_CONTROLLERS[name](cfg) -> controller`` with ``.coef`` and ``.update(kl, n_steps)``
- ``PREFERENCE_LOSSES[name](policy_logps [N], ref_logps [N], index, cfg) -> (loss [G], metrics)``
"""

from agentrt.algos.advantages import ADVANTAGES, AdvantageInputs, masked_whiten
from agentrt.algos.kl import KL_CONTROLLERS, KL_ESTIMATORS
from agentrt.algos.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    entropy_from_logits,
    sft_token_loss,
    value_token_loss,
)
from agentrt.algos.preference import (
    PREFERENCE_LOSSES,
    PreferenceIndex,
    preference_metrics,
    sequence_logps,
)
# importing rae registers the "rae" estimator in ADVANTAGES
from agentrt.algos.rae import RAE_BASELINES, RAEState, rae_group_id, use_rae_state

__all__ = [
    "ADVANTAGES", "AdvantageInputs", "masked_whiten", "KL_CONTROLLERS", "KL_ESTIMATORS",
    "AGGREGATIONS", "POLICY_LOSSES", "aggregate", "entropy_from_logits", "sft_token_loss",
    "value_token_loss", "RAE_BASELINES", "RAEState", "rae_group_id", "use_rae_state",
    "PREFERENCE_LOSSES", "PreferenceIndex", "preference_metrics", "sequence_logps",
]
