"""Token-exact data types: what a rollout produces and what a training step consumes.

A :class:`Turn` is one call to a policy: the prompt it saw and the tokens it generated, as ids.
A :class:`Trajectory` is one agent's turns in one episode (one turn for single-step tasks).
:func:`collate` turns trajectories into a padded :class:`TrainBatch`. Text is only ever decoded
for display and reward functions; training always uses the ids recorded at rollout time.

Alignment convention (used everywhere): per-token tensors have the shape of ``input_ids`` [B, T]
and position ``t`` holds the quantity for *predicting* ``input_ids[:, t]`` from ``input_ids[:, :t]``.
Position 0 therefore never carries loss.
"""

from __future__ import annotations

import functools
import uuid
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads with the first batch, so config checks and envs stay light
    import torch


@dataclass
class Turn:
    """One policy call.

    Attributes:
        prompt_ids: Token ids the policy was conditioned on (system prompt, history, observation).
        response_ids: Token ids the policy generated, eos included when it stopped on eos.
        logprobs: Rollout log-probability of each response token, ``len(response_ids)`` floats.
        reward: Scalar reward credited to this turn (at its last generated token).
        role: Role of the acting agent ("agent", "player_0", "decomposer", ...).
        policy_id: Which policy generated it.
        policy_version: The policy's weight version at generation time.
        finished: True when generation stopped on eos, False when cut by the length limit.
        memory_ids: Ids of memory records retrieved into this prompt.
        info: Free-form per-turn data (env info, decoded text for logs).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float = 0.0
    role: str = "agent"
    policy_id: str = "policy"
    policy_version: int = 0
    finished: bool = True
    memory_ids: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"Turn has {len(self.response_ids)} response ids but {len(self.logprobs)} logprobs"
            )


@functools.total_ordering
@dataclass(frozen=True)
class GroupKey:
    """Which trajectories share a baseline: everything a group must not mix, by name.

    The episode runner builds one per trajectory; the estimators read its fields (RAE: env, role,
    policy) and regrouping replaces one (``dataclasses.replace``). At most one of ``task``,
    ``seed`` and ``opponents`` is set: what else the members have in common.

    Attributes:
        env: The env id, followed by its ``make`` kwargs' JSON unless they are ``{}``.
        role: The agent (seat) that acted.
        policy: The policy that acted (a snapshot keeps its ``@tag``).
        task: The episode spec's ``group``: the prompt or task every member played ("ex3").
        seed: The env seed, for envs whose seed fixes the task (``group_by_seed``).
        opponents: The other seats' policy ids, in seat order.
        replay_step: Late feedback: the step whose episodes this group trains again.

    Plain-data form (checkpoints, the episode log): ``str(key)`` and its inverse
    :meth:`parse`, ``[feedback|s<replay_step>|]<env>|<role>|<policy>[|<rest>]`` with rest the
    task, ``seed=<seed>`` or ``vs=<opponent>,<opponent>...``: the group ids agentrt wrote before
    keys were typed, so their RAE baselines and episode logs still load. Keys order like these
    strings. A task should not itself look like ``seed=<int>``, ``vs=...`` or contain ``|``:
    it would read back as another field.
    """

    env: str
    role: str
    policy: str
    task: str | None = None
    seed: int | None = None
    opponents: tuple[str, ...] | None = None
    replay_step: int | None = None

    def __post_init__(self) -> None:
        rest = [f for f in (self.task, self.seed, self.opponents) if f is not None]
        if len(rest) > 1:
            raise ValueError(f"a group key has at most one of task, seed and opponents: {self!r}")

    def __str__(self) -> str:
        parts = [self.env, self.role, self.policy]
        if self.task is not None:
            parts.append(self.task)
        elif self.seed is not None:
            parts.append(f"seed={self.seed}")
        elif self.opponents is not None:
            parts.append("vs=" + ",".join(self.opponents))
        if self.replay_step is not None:
            parts[:0] = ["feedback", f"s{self.replay_step}"]
        return "|".join(parts)

    def __lt__(self, other: GroupKey) -> bool:
        if not isinstance(other, GroupKey):
            return NotImplemented
        return str(self) < str(other)

    @classmethod
    def parse(cls, text: str) -> GroupKey:
        """The key whose ``str`` is ``text`` (see the class docstring)."""
        replay_step = None
        if text.startswith("feedback|s"):
            step, _, text = text.removeprefix("feedback|s").partition("|")
            replay_step = int(step)
        parts = text.rsplit("|", 3)
        if len(parts) < 3 or not all(parts[:3]):
            raise ValueError(f"group key {text!r} is not '<env>|<role>|<policy>[|<rest>]'")
        if len(parts) == 3:
            return cls(*parts, replay_step=replay_step)
        env, role, policy, rest = parts
        if rest.startswith("vs="):
            names = rest.removeprefix("vs=")
            return cls(env, role, policy, opponents=tuple(names.split(",")) if names else (),
                       replay_step=replay_step)
        seed = rest.removeprefix("seed=")
        if rest.startswith("seed=") and seed.lstrip("-").isdecimal() and str(int(seed)) == seed:
            return cls(env, role, policy, seed=int(seed), replay_step=replay_step)
        return cls(env, role, policy, task=rest, replay_step=replay_step)


@dataclass
class Trajectory:
    """One agent's turns in one episode, the unit of credit assignment.

    ``group_id`` names the set of trajectories that share a baseline for group-relative
    estimators (GRPO, RLOO): the episode runner's :class:`GroupKey`, built from everything that
    must not be mixed (env, role, policy, prompt or opponents), so baselines never cross agents
    or roles. Estimators that only ask which rows share a group take any hashable label (a
    hand-built batch may use strings); RAE needs a :class:`GroupKey`.
    """

    turns: list[Turn]
    group_id: GroupKey | str = ""
    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    env: str = ""
    role: str = "agent"
    policy_id: str = "policy"
    outcome: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        """Total reward over all turns."""
        return float(sum(t.reward for t in self.turns))

    @property
    def policy_version(self) -> int:
        return min(t.policy_version for t in self.turns) if self.turns else 0

    def to_sequence(self) -> tuple[list[int], list[int], list[float], list[float]]:
        """Flattens the turns into one token sequence for training.

        Multi-turn episodes whose every prompt extends the previous turn's prompt + response (the
        episode runner builds them that way) become one sequence; otherwise each turn must be
        trained as its own trajectory (``agentrt.controller.objectives.training_trajectories``
        splits them so).

        Returns:
            ``(input_ids, loss_mask, old_logprobs, token_rewards)``, each of length T, aligned as
            described in the module docstring.
        """
        ids: list[int] = []
        mask: list[int] = []
        logp: list[float] = []
        rew: list[float] = []
        for turn in self.turns:
            if ids and turn.prompt_ids[: len(ids)] != ids:
                raise ValueError(
                    "turn prompt does not extend the previous turns; train each turn as its "
                    "own trajectory (agentrt.controller.objectives.training_trajectories)"
                )
            new_ctx = turn.prompt_ids[len(ids) :]
            ids += new_ctx
            mask += [0] * len(new_ctx)
            logp += [0.0] * len(new_ctx)
            rew += [0.0] * len(new_ctx)
            ids += turn.response_ids
            mask += [1] * len(turn.response_ids)
            logp += list(turn.logprobs)
            rew += [0.0] * len(turn.response_ids)
            if turn.response_ids:
                rew[-1] += turn.reward
            elif rew:
                rew[-1] += turn.reward
        return ids, mask, logp, rew


@dataclass
class TrainBatch:
    """A right-padded batch of sequences, ready for the loss.

    All per-token tensors are float32/long of shape [B, T]. ``advantages``, ``returns``,
    ``values`` and ``ref_logprobs`` are filled in by the trainer before the update.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    group_ids: list[GroupKey | str]
    seq_rewards: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    # Sampled by older weights than the learner's (async rollout): the PPO ratio must then use
    # the rollout's (behaviour) log-probs, never the learner's current ones.
    stale: bool = False
    # Some rows sampled by older weights in a synchronous run (replayed feedback): their rollout
    # log-probs are not the current weights', so "auto" does not take them as the old ones.
    replayed: bool = False

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Number of loss-carrying (generated) tokens."""
        return int(self.loss_mask.sum().item())

    def select(self, index: torch.Tensor | slice | list[int]) -> TrainBatch:
        """Rows ``index`` of every tensor field (for mini- and micro-batches)."""
        import torch

        if isinstance(index, slice):
            rows = list(range(self.size))[index]
        else:
            rows = [int(i) for i in index]
        idx = torch.tensor(rows, dtype=torch.long)
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                out[name] = value.index_select(0, idx)
            elif isinstance(value, list):
                out[name] = [value[i] for i in rows]
            else:
                out[name] = value
        return TrainBatch(**out)

    def to(self, device: torch.device) -> TrainBatch:
        """Every tensor field on ``device`` (the same object when it is there already)."""
        import torch

        if self.input_ids.device == device:
            return self
        return TrainBatch(**{name: value.to(device) if isinstance(value, torch.Tensor) else value
                             for name in self.__dataclass_fields__
                             for value in [getattr(self, name)]})


def collate(trajs: list[Trajectory], pad_id: int = 0) -> TrainBatch:
    """Pads trajectories into a :class:`TrainBatch` (right padding, loss only on generated ids)."""
    import torch

    if not trajs:
        raise ValueError("cannot collate an empty list of trajectories")
    seqs = [t.to_sequence() for t in trajs]
    width = max(len(s[0]) for s in seqs)
    lengths = torch.tensor([len(s[0]) for s in seqs])

    def padded(field: int, value: float, code: str, dtype: torch.dtype) -> torch.Tensor:
        # rows padded into one flat C array, then one tensor: a tensor per row and field cost
        # ~10 ms a 256-row batch, one from nested lists ~0.5 ms a field, this ~0.3
        flat, pad = array(code), [value] * width
        for s in seqs:
            flat.extend(s[field])
            flat.extend(pad[len(s[0]):])
        out = torch.frombuffer(flat, dtype=dtype) if flat else torch.empty(0, dtype=dtype)
        return out.view(len(seqs), width).clone()

    input_ids = padded(0, pad_id, "q", torch.long)
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    loss_mask = padded(1, 0.0, "f", torch.float32)
    old_lp = padded(2, 0.0, "f", torch.float32)
    rewards = padded(3, 0.0, "f", torch.float32)
    loss_mask[:, 0] = 0.0  # nothing predicts the first token
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old_lp,
        token_rewards=rewards,
        group_ids=[t.group_id for t in trajs],
        seq_rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32),
    )
