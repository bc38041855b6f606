"""Teacher-forced scoring: the summed log-prob of given responses after given prompts.

What a policy would put on a fixed text (an action's canonical string, say) without generating
it: one no-grad pass of the learner's forward passes (:meth:`ForwardPasses.logprobs`, so packing
and prompt sharing apply: the legal actions of one state share its prompt, computed once), of
the sampling distribution (logits / the policy's temperature), as rollout log-probs are.
"""

from __future__ import annotations

from agentrt.core.types import Trajectory, Turn, collate
from agentrt.runtime.learner import Learner
from agentrt.runtime.steps import chunks


def sequence_logprobs(learner: Learner, prompts: list[list[int]], responses: list[list[int]],
                      name: str | None = None, chunk: int = 512) -> list[float]:
    """Summed log-prob of each ``responses[i]`` after ``prompts[i]``.

    Args:
        learner: The policy's learner (its temperature scales the logits).
        prompts / responses: Token ids, one pair per row (responses non-empty).
        name: The learner's policy (None) or one of its frozen snapshots ("pid@tag").
        chunk: Rows per batch (bounds the padding of one pass).

    Returns:
        One float per row: sum over the response tokens of log p(token | earlier tokens).
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    out: list[float] = []
    for part in chunks(len(prompts), chunk):
        trajs = [Trajectory([Turn(list(p), list(r), [0.0] * len(r))])
                 for p, r in zip(prompts[part], responses[part])]
        batch = collate(trajs, learner.pad_id)
        logps = learner.passes.logprobs(batch, name or learner.policy_id, scaled=True)
        out.extend((logps * batch.loss_mask).sum(-1).tolist())
    return out
