"""The first prompt of a run's policies, rendered as the run will render it.

``agentrt check-config`` prints it after the resolved config, so the chat template (the policy's
``template:`` and ``system:``, :mod:`agentrt.policies.chat`) and the env's template text can be
read before a run starts: for ``train``, the policy's prompt of the task's first training
example (a Redis stream's prompts arrive at run time: none); for ``tournament``, each LM policy's
prompt at the first turn of the first env (its memory context left out: the bank is empty before
the run); for ``decompose``, the LM planner's prompt of the first training task (a rule or single
planner has none; the specialists' prompts follow from the plan). The prompts are the ones :class:`agentrt.policies.lm.LMPolicy` builds, over a
tokenizer and no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FirstPrompt:
    """A policy's first prompt: where it is asked, its token ids and their text (special tokens
    written out)."""

    policy: str
    where: str
    ids: list[int]
    text: str

    def show(self) -> str:
        """As YAML comment lines (the resolved config printed before it stays valid YAML):
        each line of the text after ``# | ``."""
        body = "".join(f"# | {line}\n" for line in self.text.split("\n"))
        return f"# first prompt of {self.policy} ({self.where}), {len(self.ids)} tokens:\n{body}"


class TokenizerEngine:
    """What :class:`~agentrt.policies.lm.LMPolicy` reads of an engine to render prompts (the
    policy id, tokenizer and config), with no model: it renders, it never generates."""

    version = 0

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        self.policy_id, self.cfg, self.tokenizer = cfg.id, cfg, tokenizer

    def generate(self, prompts: list[list[int]], sampling: Any = None) -> list[Any]:
        raise RuntimeError("a TokenizerEngine renders prompts; it has no model to generate with")


def policy_tokenizer(cfg: Any) -> Any:
    """The tokenizer a policy config's model has (a preset's: the byte-level one)."""
    if cfg.model.path is None:
        from agentrt.policies.models import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.path)


def first_prompts(kind: str, cfg: Any) -> list[FirstPrompt]:
    """The first prompts of a checked config of ``kind`` (none for a kind without one)."""
    if kind == "train":
        return _train(cfg)
    if kind == "tournament":
        return _tournament(cfg)
    return _decompose(cfg)


def _shown(policy: str, where: str, ids: list[int], tokenizer: Any) -> FirstPrompt:
    return FirstPrompt(policy, where, ids, tokenizer.decode(ids, skip_special_tokens=False))


def _first_request(env_id: str, kwargs: dict[str, Any], seed: int, options: Any = None) -> Any:
    from agentrt.envs.registration import make_multi
    from agentrt.policies.base import ActRequest

    env = make_multi(env_id, **kwargs)
    env.reset(seed=seed, options=options)
    agent = env.agent_selection
    return ActRequest(env, "first", env_id, agent, list(env.possible_agents).index(agent))


def _train(cfg: Any) -> list[FirstPrompt]:
    from agentrt.policies.chat import policy_chat
    from agentrt.workloads.prompts.data import open_source
    from agentrt.workloads.prompts.workload import task_policy

    if cfg.task.name == "redis":
        return []
    tokenizer = policy_tokenizer(cfg.policy)
    chat = policy_chat(cfg.policy, tokenizer)
    source = open_source(cfg.task, cfg.seed)
    try:
        source.start(tokenizer, chat)
        ex = source.next(1)[0]
    finally:
        source.close()
    policy = task_policy(TokenizerEngine(cfg.policy, tokenizer), chat)
    request = _first_request("Task-v0", {"task": cfg.task.name, "reward": None}, cfg.seed,
                             {"example": {"prompt": ex.prompt, "answer": ex.answer,
                                          "info": ex.info}})
    return [_shown(cfg.policy.id, f"task {cfg.task.name}", policy.prompt_ids(request),
                   tokenizer)]


def _tournament(cfg: Any) -> list[FirstPrompt]:
    from agentrt.policies.lm import LMPolicy

    env = cfg.envs[0]
    request = _first_request(env.id, dict(env.kwargs), cfg.seed)
    tokenizers: dict[str | None, Any] = {}
    out = []
    for p in cfg.policies:
        tokenizer = tokenizers.get(p.model.path) or policy_tokenizer(p)
        tokenizers[p.model.path] = tokenizer
        policy = LMPolicy(TokenizerEngine(p, tokenizer), {env.id: env.template.prompt()})
        out.append(_shown(p.id, f"{env.id} as {request.agent}", policy.prompt_ids(request),
                          tokenizer))
    return out


def _decompose(cfg: Any) -> list[FirstPrompt]:
    from agentrt.decomposer.workload import CHAIN_TEMPLATE, ENV, DecomposeWorkload
    from agentrt.policies.lm import LMPolicy

    if cfg.planner.kind != "lm":
        return []
    workload = DecomposeWorkload(cfg)
    request = _first_request(ENV, workload.env_kwargs("train"), 0, {"index": 0})
    pcfg = next(p for p in cfg.policies if p.id == cfg.planner.policy)
    tokenizer = policy_tokenizer(pcfg)
    policy = LMPolicy(TokenizerEngine(pcfg, tokenizer), CHAIN_TEMPLATE)
    return [_shown(pcfg.id, f"planner of the first {cfg.family.name} task",
                   policy.prompt_ids(request), tokenizer)]
