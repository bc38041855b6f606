"""Memory-augmented policies: wires a policy's ``memory:`` config to a bank, its prompts and the
ends of its episodes.

    memory = wire_memories(policies, {"lm": MemoryConfig(bank="notes", write=["facts"])},
                           banks={}, run_dir="runs/demo")
    runner.run(specs, on_episode_end=memory.on_episode_end)   # writes between episodes
    memory.state_dict() / memory.load_state_dict(state)        # checkpoint and resume
    memory.close()

Each policy with a memory config reads its bank through ``LMPolicy.memory`` (best ``k`` records
it may read, within ``token_budget`` tokens, as prompt tokens: they never carry loss; the record
ids go to ``Turn.memory_ids``) and, when one of its episodes ends, writes what ``write`` asks:
``outcome`` (score and result, tagged with the opponents), ``facts`` (what the env revealed in
``info["revealed"]``, each fact stored once per writer) and ``reflection`` (texts from a
``reflect`` function the caller passes). Records are written with the config's ``visibility``;
``private`` ones are readable by their writer only, so opponents never read them.

Writes are idempotent and keyed by step: a record's id derives from the run, the step, the
policy, the episode, the seat, its kind and index (:func:`~agentrt.memory.augment.record_id`),
and it is tagged ``run:<run>`` and ``step:<n>``. A resumed run replays its episodes under the
same ids (a league's episode id is its match id) after :meth:`RunMemory.forget_after` deleted
what the run wrote in shared (Redis) banks after the checkpoint's step; FAISS banks are restored
from the checkpoint itself. So a killed and resumed run ends with the records of one that never
stopped, none missing, none twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pydantic import Field, model_validator

from agentrt.core.errors import ConfigError
from agentrt.memory.augment import MemoryConfig, write_episode_memories
from agentrt.memory.bank import MemoryBank
from agentrt.memory.config import BankConfig
from agentrt.core.schema import ConfigModel

if TYPE_CHECKING:
    from agentrt.runner.record import EpisodeRecord

Reflect = Callable[["EpisodeRecord", str], Sequence[str]]
"""``reflect(record, agent) -> texts``: reflections of the policy that played ``agent``."""

_SCORE = {"win": 1.0, "draw": 0.5, "loss": 0.0}


class MemoryBanksConfig(ConfigModel):
    """The ``memory:`` section of a run: banks that policies name in ``policies[].memory.bank``.

    A bank no policy declares here is a default FAISS bank in ``<run_dir>/memory/<name>``.
    """

    banks: dict[str, BankConfig] = Field(
        default_factory=dict, description="Bank name -> bank config (docs/memory.md).")

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("banks"), dict):
            banks = {}
            for name, bank in data["banks"].items():
                if isinstance(bank, dict):
                    if bank.get("name", name) != name:
                        raise ValueError(f"bank {name!r} has name {bank['name']!r}; drop name "
                                         "(the key names the bank)")
                    bank = {**bank, "name": name}
                banks[name] = bank
            data = {**data, "banks": banks}
        return data


def check_policy_memory(policy_id: str, cfg: MemoryConfig, banks: Mapping[str, BankConfig]
                        ) -> None:
    """Raises ValueError (one line) when ``cfg`` does not fit the declared ``banks``."""
    declared = banks.get(cfg.bank)
    where = f"policy {policy_id!r} memory"
    if declared is None and cfg.backend == "redis":
        raise ValueError(f"{where}: bank {cfg.bank!r} uses redis; declare it under "
                         "memory.banks with a redis url")
    if declared is not None and "backend" in cfg.model_fields_set \
            and declared.backend != cfg.backend:
        raise ValueError(f"{where}: backend {cfg.backend!r} but memory.banks.{cfg.bank} is "
                         f"{declared.backend!r}; make them agree or drop memory.backend")


def revealed_facts(revealed: Any) -> list[str]:
    """Texts of what an env revealed (``info["revealed"]``), one per fact.

    A string is one fact; ``{"key": k, "value": v}`` becomes ``"k: v"``; another mapping
    ``"a: 1; b: 2"``; a list or tuple gives one fact per item; None gives none.
    """
    if revealed is None:
        return []
    if isinstance(revealed, str):
        return [revealed] if revealed.strip() else []
    if isinstance(revealed, (list, tuple)):
        return [text for item in revealed for text in revealed_facts(item)]
    if isinstance(revealed, Mapping):
        if set(revealed) == {"key", "value"}:
            return [f"{revealed['key']}: {revealed['value']}"]
        return ["; ".join(f"{k}: {v}" for k, v in revealed.items())] if revealed else []
    return [str(revealed)]


class PolicyMemory:
    """One policy's memory: the hook its prompts read through and the writer of its episodes.

    Args:
        policy_id: The policy (reader and writer of its records).
        cfg: Its memory config.
        bank: The bank ``cfg.bank`` names.
        tokenizer: The policy's tokenizer (retrieved memories become its prompt tokens).
        reflect: Source of reflection texts; required when ``cfg.write`` has "reflection".
    """

    def __init__(self, policy_id: str, cfg: MemoryConfig, bank: MemoryBank, tokenizer: Any,
                 reflect: Reflect | None = None) -> None:
        if "reflection" in cfg.write and reflect is None:
            raise ConfigError(f"policy {policy_id!r} memory.write has 'reflection' but no reflect "
                              "function was given; pass reflect= or drop 'reflection'")
        self.policy_id, self.cfg, self.bank = policy_id, cfg, bank
        self.tokenizer, self.reflect = tokenizer, reflect

    def hook(self) -> Callable[[list[Any]], list[tuple[list[int], list[str]]]]:
        """The ``LMPolicy.memory`` hook: each observation is the query, read as this policy."""
        from agentrt.policies.lm import bank_memory

        return bank_memory(self.bank, self.tokenizer, self.policy_id, self.cfg.k,
                           self.cfg.token_budget)

    def attach(self, policy: Any) -> Any:
        """Gives ``policy`` this memory's :meth:`hook`; returns the policy."""
        policy.set_memory(self.hook())
        return policy

    def write(self, record: EpisodeRecord, run: str = "", step: int = 0) -> list[str]:
        """Writes what the config asks for every seat this policy played; returns the ids.

        ``run`` and ``step`` key the writes (see the module docstring): writing the same
        episode again at the same step of the same run writes nothing new.
        """
        ids: list[str] = []
        for agent, pid in record.seats.items():
            if pid != self.policy_id:
                continue
            opponents = [p for a, p in record.seats.items() if a != agent]
            result = record.results[agent]
            outcome = record.returns[agent] if not opponents else _SCORE.get(result, 0.0)
            summary = f"As {agent} vs {', '.join(opponents)}: {result}." if opponents \
                else f"Result: {result}."
            facts = [f for f in revealed_facts(record.final_infos.get(agent, {}).get("revealed"))
                     if "facts" in self.cfg.write and not self._known(f)]
            reflections = list(self.reflect(record, agent)) if self.reflect else []
            ids += write_episode_memories(
                self.bank, self.cfg, policy_id=pid, episode_id=record.episode_id, env=record.env,
                outcome=outcome, summary=summary, reflections=reflections, facts=facts,
                tags=[f"opponent:{p}" for p in opponents] + [f"run:{run}", f"step:{step}"],
                key=f"{run}|{step}|{pid}|{record.episode_id}|{agent}")
        return ids

    def _known(self, fact: str) -> bool:
        """Whether this policy already stored ``fact`` (same text, same visibility)."""
        text = fact.strip()
        if not text:
            return True
        hits = self.bank.query(text, k=1, reader=self.policy_id, filters={
            "policy_id": self.policy_id, "tags": ["fact"], "visibility": self.cfg.visibility})
        return bool(hits) and hits[0].record.text == text


class RunMemory:
    """The memory of one run: its open banks and each memory-augmented policy.

    Use :func:`wire_memories` to build it.
    """

    def __init__(self, banks: dict[str, MemoryBank], policies: dict[str, PolicyMemory],
                 run: str = "") -> None:
        self.banks, self.policies, self.run = banks, policies, run
        self.step = 0

    def begin_step(self, step: int) -> None:
        """Episodes that end from now on are written as step ``step``'s."""
        self.step = step

    def on_episode_end(self, record: EpisodeRecord) -> None:
        """``EpisodeRunner.run(..., on_episode_end=...)``: every policy writes its episode."""
        for memory in self.policies.values():
            memory.write(record, self.run, self.step)

    def forget_after(self, step: int) -> int:
        """Deletes what this run wrote after ``step`` in its shared (non-FAISS) banks, e.g.
        before a resumed run replays the steps after its checkpoint (-1: everything it wrote,
        for a fresh start). Returns how many records were deleted."""
        mine = f"run:{self.run}"
        deleted = 0
        for bank in self.banks.values():
            if bank.cfg.backend == "faiss":
                continue  # restored from the checkpoint (load_state_dict)
            stale = [rec.id for rec in bank.records() if mine in rec.tags
                     and any(t.startswith("step:") and int(t[5:]) > step for t in rec.tags)]
            deleted += bank.delete(stale)
        return deleted

    def state_dict(self) -> dict[str, list[dict[str, Any]]]:
        """Every FAISS bank's records with their vectors as tensors (Redis banks are shared
        services that outlive a run and are left out)."""
        import torch  # here: config checks import this module without torch

        out: dict[str, list[dict[str, Any]]] = {}
        for name, bank in self.banks.items():
            if bank.cfg.backend != "faiss":
                continue
            out[name] = [{**rec.to_dict(),
                          "embedding": torch.from_numpy(bank.store.vector(rec.id).copy())}
                         for rec in bank.records()]
        return out

    def load_state_dict(self, state: Mapping[str, list[dict[str, Any]]]) -> None:
        """Makes each bank in ``state`` hold exactly its records (a resumed run forgets what was
        written after the checkpoint)."""
        for name, rows in state.items():
            bank = self.banks.get(name)
            if bank is None:
                continue
            bank.delete([r.id for r in bank.records()])
            if rows:
                bank.write_many(rows)

    def close(self) -> None:
        for bank in self.banks.values():
            bank.close()


def open_banks(names: Sequence[str], declared: Mapping[str, BankConfig],
               run_dir: str | Path | None) -> dict[str, MemoryBank]:
    """Opens each named bank once: as declared, else a default FAISS bank of that name."""
    from agentrt.memory import open_bank
    from agentrt.memory.config import bank_config

    return {name: open_bank(declared.get(name) or bank_config(name=name), run_dir=run_dir)
            for name in dict.fromkeys(names)}


def wire_memories(policies: Mapping[str, Any], configs: Mapping[str, MemoryConfig | None],
                  banks: Mapping[str, BankConfig] | None = None,
                  run_dir: str | Path | None = None,
                  reflect: Mapping[str, Reflect] | None = None, run: str = "") -> RunMemory:
    """Opens the banks the configs name and attaches a memory hook to each such policy.

    Args:
        policies: ``{policy_id: LMPolicy}``.
        configs: ``{policy_id: MemoryConfig or None}``; ids without a config get no memory.
        banks: Declared banks (``memory.banks`` of the run config).
        run_dir: Run folder; FAISS banks live in ``<run_dir>/memory/<name>``.
        reflect: ``{policy_id: reflect function}`` for policies that write reflections.
        run: What tells this run's writes from other runs' in a shared bank (part of every
            record id and the ``run:<run>`` tag); a league passes its run folder's ``run_uid``.

    Returns:
        The :class:`RunMemory` whose ``on_episode_end`` writes the episodes.
    """
    banks = dict(banks or {})
    wanted = {pid: cfg for pid, cfg in configs.items() if cfg is not None}
    for pid, cfg in wanted.items():
        if pid not in policies:
            raise ConfigError(f"memory config for unknown policy {pid!r}; known: "
                              f"{', '.join(sorted(policies))}")
        try:
            check_policy_memory(pid, cfg, banks)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    opened = open_banks([cfg.bank for cfg in wanted.values()], banks, run_dir)
    wired = {}
    for pid, cfg in wanted.items():
        policy = policies[pid]
        memory = PolicyMemory(pid, cfg, opened[cfg.bank], policy.tokenizer,
                              (reflect or {}).get(pid))
        wired[pid] = memory
        memory.attach(policy)
    return RunMemory(opened, wired, run)
