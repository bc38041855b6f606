"""LM policy: renders observations into token ids, batches generation, records token-exact turns.

Prompts, per (episode, agent):

- first turn:  ``[bos] + memory context ids + encode(template.first.format(...))``
- later turns: ``previous.prompt_ids + previous.response_ids + memory context ids +
  encode(template.turn.format(...))``

so each prompt extends the previous turn's prompt and response and generated tokens are never
re-tokenized (``Trajectory.to_sequence`` gives one training sequence per agent and episode).

With a chat template (the policy config's ``template:``, :mod:`agentrt.policies.chat`), the
template text is a user message, the earlier responses assistant messages, after the config's
``system:`` message: the first prompt is ``apply_chat_template([system, user],
add_generation_prompt=True)``, a later one ``previous.prompt_ids + previous.response_ids`` + the
ids the template puts between that and the next generation prompt (the whole conversation
rendered afresh where a template does not extend it). Memory context is put, as text, before the
observation in the user message.

Memory hook: ``memory(requests) -> [(context_ids, record_ids), ...]`` (one pair per request), for
example a wrapper around ``agentrt.memory.augment.retrieve_context``. Context ids are part of the
prompt, so they never carry loss; ``record_ids`` go to ``Turn.memory_ids``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

from agentrt.policies.base import Action, ActRequest
from agentrt.policies.chat import Chat, Messages, policy_chat
from agentrt.envs.tasks import decode_texts, encode_texts
from agentrt.core.types import Turn

MemoryHook = Callable[[list[ActRequest]], list[tuple[list[int], list[str]]]]


@dataclass(frozen=True)
class PromptTemplate:
    """How an observation becomes prompt text. Fields may use ``{observation}``, ``{agent}``,
    ``{env}`` and ``{legal}`` (legal actions joined by ", ", or "any text").

    Attributes:
        first: Text of an agent's first turn in an episode.
        turn: Text appended for each later turn (after the previous response).
        add_bos: Start the first prompt with the tokenizer's bos token.
        history: Later prompts extend the previous prompt + response (False: every prompt is
            bos + ``first`` with the current observation, for games whose observation is the
            whole state; each turn then trains as its own sequence).
    """

    first: str = "{observation}\nAction: "
    turn: str = "\n{observation}\nAction: "
    add_bos: bool = True
    history: bool = True

    def render(self, request: ActRequest) -> str:
        legal = request.legal_actions
        fields = {"observation": request.observation, "agent": request.agent,
                  "env": request.env_name, "legal": ", ".join(legal) if legal else "any text"}
        return (self.turn if self.continues(request) else self.first).format(**fields)

    def continues(self, request: ActRequest) -> bool:
        """Whether this prompt extends the agent's previous turn (False: a fresh prompt)."""
        return self.history and request.previous is not None


DEFAULT_TEMPLATE = PromptTemplate()


class LMPolicy:
    """A :class:`~agentrt.policies.base.Policy` over a rollout engine (``agentrt.runtime.learner``).

    Args:
        engine: Has ``policy_id``, ``version``, ``tokenizer``, ``cfg`` and
            ``generate(prompts, sampling) -> [Completion]``.
        templates: One template for every env, or ``{env_id: template}`` with optional "*".
        trainable: Whether its turns become training data (default: ``engine.cfg.trainable``).
        sampling: Overrides the engine's rollout sampling config.
        max_context: Prompt + ``max_new_tokens`` must fit; otherwise the action asks the runner to
            end the episode as truncated.
        memory: Optional memory hook (see module docstring).
        chat: The chat template prompts are rendered with (:class:`agentrt.policies.chat.Chat`);
            "config" (the default): the engine's config (``template``, ``system``) on its
            tokenizer; None: plain text templates.
    """

    def __init__(self, engine: Any, templates: PromptTemplate | dict[str, PromptTemplate] | None
                 = None, trainable: bool | None = None, sampling: Any = None,
                 max_context: int = 2048, memory: MemoryHook | None = None,
                 chat: Chat | None | str = "config") -> None:
        self.engine = engine
        self.policy_id = engine.policy_id
        self.tokenizer = engine.tokenizer
        cfg = getattr(engine, "cfg", None)
        self.trainable = bool(getattr(cfg, "trainable", True)) if trainable is None else trainable
        self.sampling = sampling
        self.max_context = max_context
        self.memory = memory
        self.chat = policy_chat(cfg, self.tokenizer) if chat == "config" else chat
        if isinstance(templates, PromptTemplate) or templates is None:
            templates = {"*": templates or DEFAULT_TEMPLATE}
        self.templates = dict(templates)

    @property
    def version(self) -> int:
        return int(self.engine.version)

    def on(self, engine: Any) -> LMPolicy:
        """This policy acting through another engine (an async rollout's copy of the weights)."""
        other = copy.copy(self)
        other.engine = engine
        return other

    def set_memory(self, memory: MemoryHook | None) -> None:
        """Attaches (or with None, removes) the memory hook that adds context to prompts."""
        self.memory = memory

    @property
    def max_new_tokens(self) -> int:
        sampling = self.sampling or self.engine.cfg.rollout.sampling
        return int(sampling.max_new_tokens)

    def template(self, env_name: str) -> PromptTemplate:
        """The template of ``env_name``, else the "*" one, else the default."""
        return self.templates.get(env_name) or self.templates.get("*") or DEFAULT_TEMPLATE

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text, in one batched call (:func:`agentrt.envs.tasks.encode_texts`)."""
        return encode_texts(self.tokenizer, texts)

    def prompt_ids(self, request: ActRequest, context_ids: list[int] | None = None) -> list[int]:
        """Token ids of the prompt for ``request`` (see module docstring)."""
        return self.prompts_ids([request], [context_ids])[0]

    def prompts_ids(self, requests: list[ActRequest],
                    contexts: list[list[int] | None] | None = None) -> list[list[int]]:
        """:meth:`prompt_ids` of each request (with its context ids), the rendered templates
        encoded in one call."""
        return self.render(requests, contexts)[0]

    def render(self, requests: list[ActRequest], contexts: list[list[int] | None] | None = None
               ) -> tuple[list[list[int]], list[Messages | None]]:
        """(prompt ids, chat messages: None without a chat template) of each request; a turn
        answering the prompt keeps its messages in ``info["chat"]`` (and its text in
        ``info["action"]``) for the next prompt to extend."""
        contexts = contexts or [None] * len(requests)
        if self.chat is not None:
            return self._chat_prompts(self.chat, requests, contexts)
        templates = [self.template(r.env_name) for r in requests]
        encoded = self.encode_many([t.render(r) for t, r in zip(templates, requests)])
        bos = self.tokenizer.bos_token_id
        out = []
        for tpl, req, ctx, ids in zip(templates, requests, contexts, encoded):
            if tpl.continues(req):
                head = req.previous.prompt_ids + req.previous.response_ids
            else:
                head = [bos] if tpl.add_bos and bos is not None else []
            out.append(head + list(ctx or []) + ids)
        return out, [None] * len(out)

    def _chat_prompts(self, chat: Chat, requests: list[ActRequest],
                      contexts: list[list[int] | None]) -> tuple[list[list[int]], list[Messages]]:
        """Prompts through the chat template (module docstring): a first turn renders the
        conversation, a later one extends the previous prompt and response ids."""
        memories = decode_texts(self.tokenizer, [list(c or []) for c in contexts])
        heads, texts, chats = [], [], []
        for req, memory in zip(requests, memories):
            tpl = self.template(req.env_name)
            user = (memory + tpl.render(req)).strip()
            prev, head, text = req.previous, [], None
            if tpl.continues(req) and prev is not None and "chat" in prev.info:
                messages, text = chat.extend(prev.info["chat"], prev.response_ids,
                                             str(prev.info.get("action", "")), user)
                head = [] if text is None else prev.prompt_ids + prev.response_ids
            else:
                messages = [{"role": "user", "content": user}]
            heads.append(head)
            texts.append(chat.text(messages) if text is None else text)
            chats.append(messages)
        return [h + ids for h, ids in zip(heads, self.encode_many(texts))], chats

    @property
    def joint_key(self) -> Any:
        """Policies with the same key (not None) may act in one call (:meth:`act_joint`): LM
        policies whose engines are handles on one pool. A subclass with its own ``act`` acts on
        its own (the joint call would pass it by)."""
        pool = getattr(self.engine, "pool", None)
        if type(self).act is not LMPolicy.act or not hasattr(pool, "generate_many"):
            return None
        return ("pool", id(pool))

    def act(self, requests: list[ActRequest]) -> list[Action]:
        """One ``engine.generate`` call for all requests that fit the context."""
        tick = self._prompts(requests)
        return self._actions(requests, tick, self._generate(tick.prompts, tick.budgets))

    @staticmethod
    def act_joint(items: list[tuple[LMPolicy, list[ActRequest]]]) -> list[list[Action]]:
        """:meth:`act` of several policies with one ``joint_key``: their prompts go to the pool
        in one ``generate_many`` call, which decodes the pool's policies and snapshots as one
        batch. Token budgets set by the env fall back to one call per policy."""
        ticks = [policy._prompts(requests) for policy, requests in items]
        if any(b is not None and int(b) < policy.max_new_tokens
               for (policy, _), tick in zip(items, ticks) for b in tick.budgets):
            outs = [policy._generate(tick.prompts, tick.budgets)
                    for (policy, _), tick in zip(items, ticks)]
        else:
            asked = [i for i, tick in enumerate(ticks) if tick.prompts]
            got = items[0][0].engine.pool.generate_many([
                (ticks[i].prompts, items[i][0].sampling, items[i][0].engine.policy_id)
                for i in asked])
            outs = [[] for _ in ticks]
            for i, out in zip(asked, got):
                outs[i] = out
        return [policy._actions(requests, tick, out)
                for (policy, requests), tick, out in zip(items, ticks, outs)]

    def _prompts(self, requests: list[ActRequest]) -> _Tick:
        """The prompts of the requests that fit the context (the others end as truncated)."""
        contexts = self.memory(requests) if self.memory else [([], [])] * len(requests)
        tick = _Tick(contexts, [None] * len(requests), [], [], [], [])
        limit = self.max_context - self.max_new_tokens
        all_ids, tick.chats = self.render(requests, [ctx_ids for ctx_ids, _ in contexts])
        for i, ids in enumerate(all_ids):
            if len(ids) > limit:
                tick.actions[i] = Action("", truncate=True)
                continue
            tick.prompts.append(ids)
            tick.index.append(i)
            tick.budgets.append(requests[i].max_new_tokens)
        return tick

    def _actions(self, requests: list[ActRequest], tick: _Tick, completions: list[Any]
                 ) -> list[Action]:
        """The actions (and their turns) of the completions of ``tick``'s prompts."""
        version = self.version
        actions = tick.actions
        texts = decode_texts(self.tokenizer, [c.response_ids for c in completions])
        for i, ids, comp, text in zip(tick.index, tick.prompts, completions, texts):
            req = requests[i]
            turn = Turn(prompt_ids=ids, response_ids=list(comp.response_ids),
                        logprobs=list(comp.logprobs), role=req.agent, policy_id=self.policy_id,
                        policy_version=version, finished=bool(comp.finished),
                        memory_ids=list(tick.contexts[i][1]), info={"action": text})
            if tick.chats[i] is not None:
                turn.info["chat"] = tick.chats[i]
            actions[i] = Action(text, turn)
        return actions  # type: ignore[return-value]


    def _generate(self, prompts: list[list[int]], budgets: list[int | None]) -> list[Any]:
        """One generate call per distinct token budget (one call when the env sets none)."""
        if not prompts:
            return []
        limit = self.max_new_tokens
        caps = [limit if b is None else max(1, min(limit, int(b))) for b in budgets]
        if all(c == limit for c in caps):
            return self.engine.generate(prompts, self.sampling)
        sampling = self.sampling or self.engine.cfg.rollout.sampling
        out: list[Any] = [None] * len(prompts)
        for cap in sorted(set(caps)):
            idx = [i for i, c in enumerate(caps) if c == cap]
            capped = sampling.model_copy(update={"max_new_tokens": cap})
            for i, comp in zip(idx, self.engine.generate([prompts[i] for i in idx], capped)):
                out[i] = comp
        return out


@dataclass
class _Tick:
    """One call's prompts: per request its memory context and its action when it has one
    already (truncated); per prompt that runs, its request's index and token budget; per
    request its chat messages (None without a chat template)."""

    contexts: list[tuple[list[int], list[str]]]
    actions: list[Action | None]
    prompts: list[list[int]]
    index: list[int]
    budgets: list[int | None]
    chats: list[Messages | None]


def bank_memory(bank: Any, tokenizer: Any, policy_id: str, k: int = 4, token_budget: int = 128,
                filters: dict[str, Any] | None = None) -> MemoryHook:
    """A memory hook that retrieves from an ``agentrt.memory`` bank with each observation as the
    query (``agentrt.memory.augment.retrieve_context``), as ``policy_id`` reads it."""
    from agentrt.memory.augment import retrieve_context

    def hook(requests: list[ActRequest]) -> list[tuple[list[int], list[str]]]:
        return [retrieve_context(bank, r.observation, policy_id, k, token_budget, tokenizer,
                                 filters) for r in requests]

    return hook
