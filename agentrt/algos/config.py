"""Config of a policy's algorithm: the preset, advantage estimator, policy loss, KL and
preference-loss settings (``policy.algorithm`` in a run config; docs in agentrt.config.sections)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentrt.core.schema import ConfigModel


class KLConfig(ConfigModel):
    coef: float = Field(0.0, ge=0.0, description="KL coefficient beta; 0 turns KL off.")
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Per-token KL estimator.")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="Add KL as a loss term or subtract it from per-token rewards."
    )
    controller: Literal["fixed", "adaptive", "decay"] = Field(
        "fixed", description="How beta evolves: fixed, adaptive (toward a target KL) or decay "
        "(beta * half_life / (half_life + updates): anneals a regularised equilibrium toward "
        "the game's).")
    target: float = Field(0.1, gt=0.0, description="Adaptive controller: target KL.")
    horizon: int = Field(10000, gt=0, description="Adaptive controller: horizon in samples.")
    half_life: int = Field(100, gt=0, description="Decay controller: updates after which beta "
                                                  "has halved.")
    rebase_every: int | None = Field(
        None, gt=0, description="Make the current weights the KL reference every N updates (a "
        "moving reference: the proximal-point form of magnetic mirror descent, whose fixed point "
        "is an equilibrium rather than one regularised toward the start); null keeps the start "
        "(or the warm start) as the reference.")
    rebase_mix: float = Field(
        1.0, gt=0.0, le=1.0, description="At each rebase the reference moves this share of the "
        "way to the current weights, ref <- mix * policy + (1 - mix) * ref (TRL's "
        "ref_model_mixup_alpha, TR-DPO): 1 replaces it; with rebase_every 1 a small share makes "
        "it a running average of past policies (a magnet that moves slowly). Full-weight "
        "policies only.")

    @model_validator(mode="after")
    def _mix_needs_rebase(self) -> KLConfig:
        if self.rebase_mix < 1.0 and self.rebase_every is None:
            raise ValueError("rebase_mix: mixing happens at each rebase; set rebase_every "
                             "(1: every update) or rebase_mix: 1")
        return self


ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "grpo"},
    "ppo": {"advantage": "gae", "critic": True},
    "rloo": {"advantage": "rloo"},
    "reinforce++": {"advantage": "reinforce++"},
    # Preference post-training (agentrt.runtime.preference): a preference loss, no advantage estimator.
    "dpo": {"preference_loss": "dpo"},
    "ipo": {"preference_loss": "ipo"},
    "kto": {"preference_loss": "kto"},
    "listwise": {"preference_loss": "listwise"},
}


class AlgorithmConfig(ConfigModel):
    name: Literal["grpo", "ppo", "rloo", "reinforce++", "dpo", "ipo", "kto", "listwise"] = Field(
        "grpo", description="Preset that picks the estimator (or preference loss) and critic."
    )
    advantage: str | None = Field(None, description="Advantage estimator (default: the preset's).")
    policy_loss: str = Field("ppo", description="Policy loss from algos.POLICY_LOSSES.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "token-mean", description="How token losses reduce to a scalar."
    )
    clip_ratio_low: float = Field(0.2, ge=0.0, description="PPO clip below 1.")
    clip_ratio_high: float = Field(0.2, ge=0.0, description="PPO clip above 1 (clip-higher).")
    clip_ratio_c: float | None = Field(None, gt=1.0, description="Dual-clip bound; None is off.")
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount over generated tokens.")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda.")
    norm_std: bool = Field(True, description="GRPO: divide by the group std (False: Dr. GRPO).")
    norm_adv: bool = Field(True, description="GAE: whiten advantages over the batch.")
    eps: float = Field(1e-6, gt=0.0, description="Numerical floor in normalisations.")
    rae_alpha: float = Field(0.95, ge=0.0, lt=1.0, description="RAE: EMA decay of role baselines.")
    rae_init: Literal["batch", "zero"] = Field(
        "batch", description="RAE: a new role baseline starts at its first batch's mean or at 0 "
                             "(SPIRAL).")
    rae_per_state: bool = Field(
        False, description="RAE, turns as rows (template.history false): one baseline per "
        "prompt (the state the policy saw) and opponent line, starting at its role's, so a "
        "turn's advantage is its return against the mean return from that same state "
        "(turn-level credit; a tabular critic over the prompts seen).")
    kl: KLConfig = Field(default_factory=KLConfig)
    ppo_epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    train_dropout: bool = Field(
        False, description="Keep dropout on in RL and preference updates. Off by default (as TRL's "
        "disable_dropout): old and reference log-probs are computed without dropout, so with it "
        "on the PPO ratio is not 1 at the first update.")
    mini_batches: int = Field(1, gt=0, description="Optimizer steps per pass.")
    old_logprobs: Literal["auto", "recompute", "rollout"] = Field(
        "auto", description="Where the PPO ratio's old log-probs come from. auto: with one "
        "optimizer step per batch (ppo_epochs 1, mini_batches 1, no train_dropout, KL not in the "
        "reward) on fresh samples they equal the update's own log-probs, so its forward pass gives "
        "them (detached) and none is computed twice; stale samples use the rollout's; with more "
        "steps per batch, the rollout's where its numerics are the trainer's (fp32, HF backend; "
        "every update's first step measures the gap and a gap over 1e-4 a token switches to "
        "recompute), else 'recompute'; train_dropout always recomputes. recompute: a separate "
        "forward pass of the trainer before the update. rollout: the rollout's log-probs, no "
        "extra pass; only where the rollout's numerics match the trainer's (fp32 HF rollout).")
    critic: bool = Field(False, description="Train a value model (set by the ppo preset).")
    vf_coef: float = Field(1.0, gt=0.0, description="Scale of the value loss.")
    value_clip: float | None = Field(0.2, gt=0.0, description="Value clipping range.")
    critic_lr: float = Field(1e-4, gt=0.0, le=1.0, description="Critic learning rate.")
    # --- preference post-training (dpo, ipo, kto, listwise); see docs/preference.md
    preference_loss: str | None = Field(
        None, description="Loss from algos.PREFERENCE_LOSSES (set by the dpo/ipo/kto/listwise "
        "presets); None means RL with an advantage estimator.")
    beta: float = Field(0.1, gt=0.0, description="Preference losses: inverse temperature beta.")
    label_smoothing: float = Field(
        0.0, ge=0.0, lt=0.5, description="DPO: share of flipped labels assumed (cDPO); 0 is off.")
    kto_desirable_weight: float = Field(1.0, gt=0.0, description="KTO: weight of desirable rows.")
    kto_undesirable_weight: float = Field(
        1.0, gt=0.0, description="KTO: weight of undesirable rows.")
    online: bool = Field(
        False, description="Preference losses: build pairs from the policy's own rollouts "
        "(ranked by the reward) instead of reading data.path.")
    chosen_nll_coef: float = Field(
        0.0, ge=0.0, description="Preference losses: add this times the per-token NLL of each "
        "example's best responses (RPO, arXiv:2404.19733); 0 is off.")

    @property
    def is_preference(self) -> bool:
        """True when the policy trains with a preference loss instead of advantages."""
        return self.preference_loss is not None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        if isinstance(data, str):
            data = {"name": data}
        if isinstance(data, dict):
            preset = ALGORITHM_PRESETS.get(data.get("name", "grpo"), {})
            data = {**preset, **data}
        return data

    @model_validator(mode="after")
    def _moving_reference_in_rl_only(self) -> AlgorithmConfig:
        if self.is_preference and self.kl.rebase_every is not None:
            raise ValueError("kl.rebase_every: a moving reference follows RL updates; a "
                             "preference loss keeps its reference (offline data's reference "
                             "log-probs are computed once), so TR-DPO's reference sync is not "
                             "built; remove kl.rebase_every")
        return self

    @model_validator(mode="after")
    def _known_names(self) -> AlgorithmConfig:
        from agentrt.algos import ADVANTAGES, POLICY_LOSSES, PREFERENCE_LOSSES

        if self.preference_loss is not None:
            if self.preference_loss not in PREFERENCE_LOSSES:
                raise ValueError(
                    f"preference_loss {self.preference_loss!r} is not registered; valid: "
                    f"{', '.join(PREFERENCE_LOSSES.names())}"
                )
            return self
        if self.advantage not in ADVANTAGES:
            raise ValueError(
                f"advantage {self.advantage!r} is not registered; valid: "
                f"{', '.join(ADVANTAGES.names())}"
            )
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"policy_loss {self.policy_loss!r} is not registered; valid: "
                f"{', '.join(POLICY_LOSSES.names())}"
            )
        if self.advantage == "gae" and not self.critic:
            raise ValueError("advantage 'gae' needs a value model; set critic: true")
        return self
