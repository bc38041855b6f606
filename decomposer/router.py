"""The router: which specialist policy does each subtask of a chain.

A policy is a *candidate* for a subtask type when it has any of the skills the type needs. Among
candidates the router decides with three pieces of evidence:

- **per-type ratings**: the tournament's :class:`OpenSkillRatings`, one rating "env" per subtask
  type; every finished subtask is one match between the policy and the type's pseudo-player
  ``subtask:<type>`` (the policy wins when the subtask's verifier accepted its output). A
  candidate's *success estimate* is OpenSkill's probability that it beats the pseudo-player;
  its *interval* is ``mu -/+ z * sigma``. A type's ratings **separate** when the best candidate's
  lower bound is above every other candidate's upper bound; until then the candidates whose upper
  bound reaches the best lower bound are *plausible*: the ratings cannot tell them apart yet.
- **memory of past outcomes** (``memory: true``): every outcome is written to a FAISS bank (text =
  the observation; ``env`` = the type, ``policy_id`` = the policy, tag ``ok``/``fail``); a
  decision reads the ``memory_k`` most similar past subtasks of the type and each candidate's
  similarity-weighted success among them (shrunk to its rating estimate by one pseudo-outcome),
  mixed into the estimate with ``memory_weight``. This is what tells apart two specialists whose
  skill depends on the content when their per-type ratings are equal.
- **exploration**, so routing does not collapse onto one policy before the evidence says so:

  - ``ucb``: plausible candidates share the best plausible estimate (they are tied at level z),
    then the pick maximises ``value + c * sqrt(ln(N + 1) / (n + 1))`` (Auer et al. 2002, UCB1),
    ``n`` counting the candidate's finished *and in-flight* subtasks of the type and ``N`` their
    sum. A whole step's chains are routed in one tick before any outcome is known; counting the
    in-flight ones (as batched bandits do) spreads that batch instead of sending it all to one
    policy. Before separation traffic is balanced among the plausible candidates; after it the
    bonus only revisits a worse candidate whose estimate is close to the best's (a far worse
    one waits ~exp(gap^2 n / c^2) subtasks; use ``epsilon`` to keep probing it).
  - ``epsilon``: with probability epsilon a uniformly random candidate, else uniformly one of the
    plausible candidates with the best value (without memory every plausible one: ratings alone
    cannot rank them; with memory the one memory prefers).
  - ``none``: pure greedy on the estimate, ties in the order ``specialists`` lists them; this can
    collapse (a whole first batch goes to the first candidate).

  ``route(..., explore=False)`` is that greedy pick whatever the mode (evaluation): it is not
  counted in flight and draws nothing from the rng, so it leaves the router as it was.

Decisions are deterministic given ``seed`` and the order of calls; :meth:`Router.state_dict`
holds everything (ratings, counts, in-flight counts, rng, history, the memory bank's records) so
a resumed router makes the same next decision as one that never stopped.

Metrics (:meth:`Router.metrics`): ``routing/entropy/<type>`` (bits, traffic of the latest
recorded step), ``routing/load/<policy>`` (share of all recorded subtasks, cumulative),
``routing/success/<type>/<policy>`` (cumulative), ``routing/separated/<type>`` (0/1).
"""

from __future__ import annotations

import math
import random
from collections import deque
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, field_validator

from agentrt.core.errors import AgentrtError, ConfigError
from agentrt.memory import open_bank
from agentrt.memory.bank import MemoryBank
from agentrt.memory.config import BankConfig
from agentrt.memory.embedders import EMBEDDERS
from agentrt.core.schema import ConfigModel
from agentrt.tournaments.ratings import OpenSkillRatings
from agentrt.tournaments.types import Match, MatchResult, Player

PSEUDO = "subtask:"  # prefix of a type's pseudo-player in the ratings


class RoutingError(AgentrtError):
    """A subtask no specialist can take, or an outcome of a policy the router does not know."""


class RouterConfig(ConfigModel):
    """Router settings (frozen; unknown keys rejected)."""

    exploration: Literal["ucb", "epsilon", "none"] = Field(
        "ucb", description="How traffic is spread before the ratings separate (see the module).")
    epsilon: float = Field(0.1, ge=0.0, le=1.0,
                           description="'epsilon': share of subtasks sent to a random candidate.")
    ucb_c: float = Field(1.0, ge=0.0,
                         description="'ucb': weight c of the bonus c*sqrt(ln(N+1)/(n+1)).")
    separation_z: float = Field(
        2.0, gt=0.0, description="Ratings separate when the best mu - z*sigma is above every "
                                 "other candidate's mu + z*sigma.")
    memory: bool = Field(False, description="Read the outcomes of similar past subtasks.")
    memory_k: int = Field(16, gt=0, description="Past subtasks of the type read per decision.")
    memory_weight: float = Field(0.5, ge=0.0, le=1.0,
                                 description="Weight of the memory estimate against the ratings'.")
    memory_size: int = Field(
        20000, gt=0, description="Past outcomes kept; the oldest are forgotten first (bounds the "
                                 "bank and the checkpoints, which hold its records).")
    embedder: str = Field("hashing", description="Embedder of the memory bank (memory.EMBEDDERS).")

    @field_validator("embedder")
    @classmethod
    def _known_embedder(cls, name: str) -> str:
        if name not in EMBEDDERS:
            raise ValueError(f"unknown embedder {name!r}; valid: {', '.join(EMBEDDERS.names())}")
        return name


class Router:
    """Routes subtasks to specialists and learns from their outcomes (see the module docstring).

    Args:
        cfg: Router settings.
        specialists: ``{policy_id: skills}``; the order breaks ties.
        skills_of: ``{subtask type: skills it needs}``; a policy with any of them is a candidate.
        seed: Seeds the router's random choices.
        memory_path: Folder of the memory bank (None: in memory only; :meth:`state_dict` holds
            its records either way).
    """

    def __init__(self, cfg: RouterConfig, specialists: Mapping[str, tuple[str, ...]],
                 skills_of: Mapping[str, tuple[str, ...]], seed: int = 0,
                 memory_path: Path | None = None) -> None:
        if not specialists:
            raise ConfigError("the router needs at least one specialist; give specialists as "
                              "{policy_id: (skill, ...)}")
        bad = [p for p in specialists if p.startswith(PSEUDO) or "@" in p or "|" in p]
        if bad:
            raise ConfigError(f"policy id {bad[0]!r} cannot be routed: ids must not start with "
                              f"{PSEUDO!r} nor contain '@' or '|'; rename the policy")
        self.cfg = cfg
        self.specialists = {p: tuple(s) for p, s in specialists.items()}
        self.skills_of = {t: tuple(s) for t, s in skills_of.items()}
        self.seed = seed
        self.rng = random.Random(seed)
        self.ratings = OpenSkillRatings()
        self._counts: dict[str, dict[str, list[int]]] = {}   # type -> policy -> [done, ok]
        self._pending: dict[str, dict[str, int]] = {}        # type -> policy -> in flight
        self._history: dict[int, dict[str, dict[str, list[int]]]] = {}  # step -> same as counts
        self._matches = 0
        self.bank: MemoryBank | None = None
        if cfg.memory:
            path = None if memory_path is None else str(memory_path)
            self.bank = open_bank(BankConfig(name="router", embedder=cfg.embedder, path=path))
        self._kept: deque[str] = deque(r.id for r in self.bank.records()) if self.bank else deque()

    # ------------------------------------------------------------------ decisions
    def candidates(self, subtask: str) -> list[str]:
        """Policies with a skill ``subtask`` needs, in the order of ``specialists``.

        Raises:
            RoutingError: no policy has any of them.
        """
        needs = self.skills_of.get(subtask, (subtask,))
        found = [p for p, skills in self.specialists.items() if set(skills) & set(needs)]
        if not found:
            raise RoutingError(f"no specialist can do subtask type {subtask!r}: it needs one of "
                               f"the skills {', '.join(needs)}; give a policy one of them")
        return found

    def route(self, subtask: str, observation: str, exclude: frozenset[str] = frozenset(),
              explore: bool = True) -> str:
        """The policy to do one subtask; it counts as in flight until :meth:`record`.

        Args:
            subtask: The subtask type.
            observation: What the specialist will read (memory looks up similar ones).
            exclude: Policies not to pick (e.g. the one whose try just failed); ignored when it
                would leave no candidate.
            explore: False: the greedy pick (evaluation), not counted in flight (its outcome is
                not recorded) and drawing nothing from the router's rng.
        """
        cands = [c for c in self.candidates(subtask) if c not in exclude] or \
            self.candidates(subtask)
        estimate = {c: self.estimate(subtask, c) for c in cands}
        if not explore or self.cfg.exploration == "none":
            value = self._with_memory(subtask, observation, estimate)
            pick = max(cands, key=lambda c: value[c])  # max keeps the first of equal values
            if not explore:
                return pick
        else:  # candidates the ratings cannot tell apart yet are tied at the best estimate
            plausible = self._plausible(subtask, cands)
            top = max(estimate[c] for c in plausible)
            estimate.update(dict.fromkeys(plausible, top))
            value = self._with_memory(subtask, observation, estimate)
            pick = self._explore(subtask, cands, plausible, value)
        pending = self._pending.setdefault(subtask, {})
        pending[pick] = pending.get(pick, 0) + 1
        return pick

    def _explore(self, subtask: str, cands: list[str], plausible: list[str],
                 value: dict[str, float]) -> str:
        if self.cfg.exploration == "ucb":
            tried = {c: self._done(subtask, c) + self._pending.get(subtask, {}).get(c, 0)
                     for c in cands}
            log_n = math.log(sum(tried.values()) + 1)
            return max(cands, key=lambda c: value[c] + self.cfg.ucb_c * math.sqrt(
                log_n / (tried[c] + 1)))
        if self.rng.random() < self.cfg.epsilon:
            return self.rng.choice(cands)
        best = max(value[c] for c in plausible)
        return self.rng.choice([c for c in plausible if value[c] >= best - 1e-12])

    def clear_pending(self) -> None:
        """Forgets the subtasks in flight (routed, never recorded: e.g. an episode cut by the
        turn limit); call it between steps if some routed subtasks may have no outcome."""
        self._pending = {}

    def estimate(self, subtask: str, policy: str) -> float:
        """The ratings' probability that ``policy`` succeeds at ``subtask`` (OpenSkill's chance
        that it beats the type's pseudo-player)."""
        model = self.ratings.model
        mu, sigma = self.ratings.rating(policy, subtask)
        t_mu, t_sigma = self.ratings.rating(PSEUDO + subtask, subtask)
        teams = [[model.rating(mu=mu, sigma=sigma)], [model.rating(mu=t_mu, sigma=t_sigma)]]
        return float(model.predict_win(teams)[0])

    def _bounds(self, subtask: str, policy: str) -> tuple[float, float]:
        mu, sigma = self.ratings.rating(policy, subtask)
        z = self.cfg.separation_z
        return mu - z * sigma, mu + z * sigma

    def _plausible(self, subtask: str, cands: list[str]) -> list[str]:
        """Candidates whose upper bound reaches the best lower bound (the best among them)."""
        bounds = {c: self._bounds(subtask, c) for c in cands}
        floor = max(lo for lo, _ in bounds.values())
        return [c for c in cands if bounds[c][1] >= floor]

    def separated(self, subtask: str) -> bool:
        """Whether one candidate's lower bound is above every other's upper bound (a type with
        one candidate is separated)."""
        return len(self._plausible(subtask, self.candidates(subtask))) == 1

    def _with_memory(self, subtask: str, observation: str, estimate: dict[str, float]
                     ) -> dict[str, float]:
        """Mixes each candidate's success among the most similar past subtasks into its
        estimate (unchanged without memory or without past subtasks)."""
        if self.bank is None or not observation.strip():
            return estimate
        hits = self.bank.query(observation, k=self.cfg.memory_k,
                               filters={"env": subtask, "policy_id": list(estimate)})
        weight = dict.fromkeys(estimate, 0.0)
        success = dict.fromkeys(estimate, 0.0)
        for hit in hits:
            w = max(hit.score, 0.0)
            weight[hit.record.policy_id] += w
            success[hit.record.policy_id] += w * ("ok" in hit.record.tags)
        mix = self.cfg.memory_weight
        return {c: (1.0 - mix) * p + mix * (success[c] + p) / (weight[c] + 1.0)
                for c, p in estimate.items()}

    # ------------------------------------------------------------------ outcomes
    def record(self, subtask: str, observation: str, policy_id: str, ok: bool, step: int) -> None:
        """Learns from one finished subtask: ratings, counts, history and memory.

        Args:
            subtask: Its type.
            observation: What the specialist read (the memory's text).
            policy_id: Who did it.
            ok: Whether the subtask's verifier accepted the output.
            step: Training step it belongs to (the history's key).
        """
        if policy_id not in self.specialists:
            raise RoutingError(f"outcome of unknown policy {policy_id!r}; the router knows "
                               f"{', '.join(self.specialists)}")
        self._matches += 1
        match = Match(f"route-{self._matches:09d}", subtask,
                      (Player(policy_id), Player(PSEUDO + subtask)))
        self.ratings.update(MatchResult(match, (1.0, 0.0) if ok else (0.0, 1.0)))
        for table in (self._counts, self._history.setdefault(int(step), {})):
            row = table.setdefault(subtask, {}).setdefault(policy_id, [0, 0])
            row[0], row[1] = row[0] + 1, row[1] + int(ok)
        pending = self._pending.get(subtask, {})
        if pending.get(policy_id, 0) > 0:
            pending[policy_id] -= 1
        if self.bank is not None and observation.strip():
            self._kept.append(self.bank.write(observation, policy_id=policy_id, env=subtask,
                                              tags=("ok",) if ok else ("fail",)))
            if len(self._kept) > self.cfg.memory_size:
                self.bank.delete(self._kept.popleft())

    def _done(self, subtask: str, policy: str) -> int:
        return self._counts.get(subtask, {}).get(policy, [0, 0])[0]

    # ------------------------------------------------------------------ reporting
    def metrics(self) -> dict[str, float]:
        """``routing/entropy/<type>`` (bits, over the latest recorded step's traffic; 0 when the
        type had none then), ``routing/load/<policy>`` (share of all recorded subtasks),
        ``routing/success/<type>/<policy>`` and ``routing/separated/<type>`` (0 or 1)."""
        out: dict[str, float] = {}
        latest = self._history[max(self._history)] if self._history else {}
        total = sum(n for row in self._counts.values() for n, _ in row.values())
        for t, row in sorted(self._counts.items()):
            out[f"routing/entropy/{t}"] = entropy_bits(
                [n for n, _ in latest.get(t, {}).values()])
            out[f"routing/separated/{t}"] = float(self.separated(t))
            for p, (n, ok) in row.items():
                out[f"routing/success/{t}/{p}"] = ok / n
        for p in self.specialists:
            done = sum(row.get(p, [0, 0])[0] for row in self._counts.values())
            out[f"routing/load/{p}"] = done / total if total else 0.0
        return out

    def matrix(self) -> dict[str, dict[str, int]]:
        """Recorded subtasks per type and policy, cumulative: ``{type: {policy: count}}``."""
        return {t: {p: n for p, (n, _) in row.items()} for t, row in self._counts.items()}

    def history(self) -> list[dict[str, Any]]:
        """One row per (step, type, policy) with ``routed`` and ``ok`` counts, by step: the
        routing matrix over time, for a report."""
        return [{"step": s, "type": t, "policy": p, "routed": n, "ok": ok}
                for s in sorted(self._history) for t, row in sorted(self._history[s].items())
                for p, (n, ok) in row.items()]

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed router needs (JSON-serializable), the memory's records included."""
        version, internal, gauss = self.rng.getstate()
        memory = [r.to_dict() for r in self.bank.records()] if self.bank is not None else []
        return {"ratings": self.ratings.state_dict(), "counts": self._counts,
                "pending": self._pending, "matches": self._matches,
                "history": [[r["step"], r["type"], r["policy"], r["routed"], r["ok"]]
                            for r in self.history()],
                "rng": [version, list(internal), gauss], "memory": memory}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`; the memory bank then holds exactly its records (those
        written after it was taken are deleted from a bank folder)."""
        self.ratings.load_state_dict(state["ratings"])
        self._counts = {t: {p: list(v) for p, v in row.items()}
                        for t, row in state["counts"].items()}
        self._pending = {t: dict(row) for t, row in state["pending"].items()}
        self._matches = int(state["matches"])
        self._history = {}
        for step, t, p, n, ok in state["history"]:
            self._history.setdefault(int(step), {}).setdefault(t, {})[p] = [n, ok]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        if self.bank is not None:
            self._restore_memory(state["memory"])

    def _restore_memory(self, records: list[dict[str, Any]]) -> None:
        present = {r.id for r in self.bank.records()}  # type: ignore[union-attr]
        keep = {r["id"] for r in records}
        self.bank.delete([i for i in present if i not in keep])  # type: ignore[union-attr]
        missing = [r for r in records if r["id"] not in present]
        if missing:
            self.bank.write_many(missing)  # type: ignore[union-attr]
        self._kept = deque(r["id"] for r in records)  # oldest first, as records() gives them

    def close(self) -> None:
        """Closes the memory bank (its folder keeps every write)."""
        if self.bank is not None:
            self.bank.close()


def entropy_bits(counts: list[int]) -> float:
    """Shannon entropy in bits of the distribution ``counts`` (0 for none)."""
    total = sum(counts)
    bits = sum(n / total * math.log2(total / n) for n in counts if n)
    return float(bits)
