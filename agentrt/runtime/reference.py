"""The reference a policy's KL (or online preference loss) is measured against.

It lives on the policy's :class:`~agentrt.runtime.shared_model.SharedModel`: ``name`` None is the
model folder's weights (LoRA: the base with the adapters off); a full-weight policy's is a frozen
copy ``"<policy>@ref"`` made at the start; after :meth:`Reference.rebase` (the end of an SFT warm
start) it is a snapshot ``"<policy>@ref"`` of the warm-started weights, which a checkpoint must
carry since the model folder cannot rebuild it.
"""

from __future__ import annotations

import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.runtime.shared_model import SharedModel


class Reference:
    """The reference of policy ``policy_id`` on ``shared``, kept only where ``needed``.

    Args:
        shared: The model that hosts the policy.
        policy_id: The policy's name.
        algo: The policy's algorithm.

    Attributes:
        needed: The algorithm reads reference log-probs during training: KL on, or online
            preference learning (offline preference data gets its reference log-probs once,
            before training).
    """

    def __init__(self, shared: SharedModel, policy_id: str, algo: AlgorithmConfig) -> None:
        self.shared, self.policy_id = shared, policy_id
        self.rebase_every, self.mix = algo.kl.rebase_every, algo.kl.rebase_mix
        self.needed = algo.kl.coef > 0.0 or (algo.is_preference and algo.online)
        self.name: str | None = None
        self.warm_start = False
        if self.needed and not shared.is_lora:
            self.name = f"{policy_id}@ref"
            shared.freeze(policy_id, self.name, serve=False)

    def rebase(self) -> None:
        """Makes the policy's current weights the reference: a frozen snapshot (an adapter for
        LoRA policies, CPU weights otherwise)."""
        if not self.needed:
            return
        if self.name is not None:
            self.shared.drop(self.name)
        self.name = f"{self.policy_id}@ref"
        self.shared.freeze(self.policy_id, self.name, serve=False)
        self.warm_start = True

    def after_update(self, version: int) -> None:
        """A moving reference (``algorithm.kl.rebase_every``): the current weights after every
        N-th update (``version`` counts them), or ``rebase_mix`` of the way to them; checkpoints
        carry it, as a warm start's."""
        if self.rebase_every is None or version % self.rebase_every:
            return
        if self.mix < 1.0 and self.name is not None:
            ref, now = self.shared.weights(self.name), self.shared.weights(self.policy_id)
            self.shared.load_weights(self.name, {
                k: torch.lerp(v, now[k], self.mix) if v.is_floating_point() else now[k]
                for k, v in ref.items()})
            self.warm_start = True  # the model folder cannot rebuild it
        else:
            self.rebase()

    def state(self) -> dict[str, torch.Tensor] | None:
        """The weights a checkpoint carries: a warm-started reference's, else None."""
        return self.shared.weights(self.name) if self.name is not None and self.warm_start \
            else None

    def load(self, weights: dict[str, torch.Tensor] | None) -> None:
        """Restores a checkpoint's warm-started reference (None: the one built at the start)."""
        if weights is not None:
            self.rebase()
            self.shared.load_weights(str(self.name), weights)
