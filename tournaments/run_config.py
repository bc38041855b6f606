"""Config of ``agentrt tournament run``: policies, envs, format, schedule, training, evaluation.

Example (examples/ttt_league.yaml)::

    envs: [{id: TicTacToe-v0}]
    policies:
      - {id: lm, model: {preset: llama-tiny}, algorithm: {advantage: rae}}
    baselines: [{id: random, kind: random}, {id: minimax, kind: minimax}]
    schedule: {format: pfsp}
    train: {steps: 200, games_per_step: 128}

Roles pin a policy or baseline to some seats (agent names of the envs), e.g. an asymmetric game
where each side has its own policy::

    envs: [{id: Bargain-v0}]
    policies:
      - {id: buyer, model: {preset: llama-tiny}, roles: [player_0]}
      - {id: seller, model: {preset: llama-tiny}, roles: [player_1]}
    baselines: [{id: haggler, kind: bargain, roles: [player_1]}]
"""

from __future__ import annotations

from typing import Any, Literal

from agentrt.memory.policy import MemoryBanksConfig, check_policy_memory
from agentrt.policies.lm import PromptTemplate
from agentrt.tournaments.config import ScheduleConfig, build_scheduler
from agentrt.tournaments.types import Entrant, TournamentError
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from agentrt.config.run import LoopConfig, RunConfig
from agentrt.config.sections import PolicyConfig, Section
from agentrt.core.errors import ConfigError
from agentrt.core.registry import import_callable
from agentrt.runner.core import RunnerConfig
from agentrt.core.schema import MAX_PER_STEP, MAX_SEED

_KIND_HELP = ("Scripted policy: a name in agentrt.policies.scripted.SCRIPTED (random, minimax, "
              "connect4, kuhn, bargain, ...) or 'package.module:Class'.")


def _scripted_kind(kind: str) -> str:
    """Checks that a scripted policy ``kind`` resolves (a ValueError for pydantic if not)."""
    from agentrt.policies.scripted import scripted_factory

    try:
        scripted_factory(kind)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return kind


def _check_tree_envs(field: str, envs: Any) -> None:
    """A ValueError unless every env has an exact game tree (a best response is computed)."""
    from agentrt.tournaments.exploit_games import exact_method

    for i, env in enumerate(envs):
        if exact_method(env.id, dict(env.kwargs)) != "tree":
            raise ValueError(f"{field}: kind best_response needs a two-player game with a "
                             f"searchable tree (state_key()); {env.id} has none")
        if env.template.history:
            raise ValueError(f"{field}: kind best_response searches {env.id}'s tree, which "
                             f"needs envs.{i}.template.history: false (each prompt depending "
                             "on the move order is past exact search)")


def _flag(value: Any) -> bool:
    """A raw config boolean as pydantic reads it (True, "true", "yes", 1); False if it is none."""
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


def _zero_sum(entry: Any) -> bool:
    """Whether an ``envs`` entry (raw config) names a registered zero-sum game."""
    import agentrt.envs  # noqa: F401 - registers the built-in envs
    from agentrt.envs.registration import ENVS

    env_id = entry.get("id") if isinstance(entry, dict) else None
    point = (ENVS.get(env_id).entry_point if env_id in ENVS
             else env_id if isinstance(env_id, str) and ":" in env_id else None)
    if isinstance(point, str):  # "module:Class", loaded to read its zero_sum flag
        try:
            point = import_callable(point, "env")
        except ConfigError:
            return False  # the entry's own validation reports it
    return bool(getattr(point, "zero_sum", False))


def _play_one_game(env: EnvEntry, agents: tuple[str, ...], kind: str, seed: int,
                   roles: tuple[str, ...] | None, max_turns: int) -> str | None:
    """Plays one game of ``env`` with the scripted ``kind`` in every seat its ``roles`` allow
    (random in the others); returns the error it raised, or None."""
    from agentrt.policies.scripted import RandomPolicy, scripted_factory

    from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunnerConfig

    players = tuple("it" if roles is None or a in roles else "random" for a in agents)
    if "it" not in players:
        return None
    try:
        runner = EpisodeRunner(
            {"it": scripted_factory(kind)(seed=seed), "random": RandomPolicy(seed)},
            RunnerConfig(random_seats=False, vectorize=False, max_turns=max_turns))
        runner.run([EpisodeSpec(env.id, players, seed=seed, env_kwargs=dict(env.kwargs))])
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; reported as config
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"
    return None


TEMPLATE_FIELDS = ("observation", "agent", "env", "legal")  # what PromptTemplate.render fills


class TemplateConfig(Section):
    """How an env's observations become prompt text: {observation}, {agent}, {env} and {legal}
    (its legal moves) are filled in."""

    first: str = Field("{observation}\nAction: ", description="Prompt text of the first turn.")
    turn: str = Field("\n{observation}\nAction: ", description="Prompt text of later turns.")
    history: bool = Field(
        True, description="Later prompts extend earlier turns (False: each turn sees only the "
                          "current observation, for games whose observation is the full state).")

    @field_validator("first", "turn")
    @classmethod
    def _placeholders(cls, text: str) -> str:
        """Only the fields a prompt is rendered with, and well-formed braces."""
        import string

        try:
            names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        except ValueError as exc:
            raise ValueError(f"{exc}; write a literal brace as {{{{ or }}}}") from None
        allowed = ", ".join("{%s}" % n for n in TEMPLATE_FIELDS)
        unknown = sorted({"{%s}" % n for n in names if n.split(".")[0].split("[")[0]
                          not in TEMPLATE_FIELDS})
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(unknown)}; a template may use "
                             f"{allowed} (a literal brace: {{{{ or }}}})")
        return text

    def prompt(self) -> PromptTemplate:
        """The policies' prompt template of this env (agentrt.policies.lm)."""
        return PromptTemplate(self.first, self.turn, history=self.history)


class EnvEntry(Section):
    id: str = Field(..., description="Registered env id, e.g. TicTacToe-v0, or "
                                     "'package.module:Class' of a multi-agent env.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Arguments of make().")
    template: TemplateConfig = Field(default_factory=TemplateConfig)

    @model_validator(mode="after")
    def _known_env(self) -> EnvEntry:
        import agentrt.envs  # noqa: F401 - registers the built-in envs
        from agentrt.envs.registration import ENVS

        if self.id not in ENVS and ":" in self.id:  # a user's env class, "package.module:Class"
            from agentrt.envs.registration import register

            try:
                import_callable(self.id, f"env {self.id!r}")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
            register(self.id, self.id, multi_agent=True)
        if self.id not in ENVS:
            raise ValueError(f"unknown env {self.id!r}; valid: {', '.join(ENVS.names())}; or "
                             "give 'package.module:Class', or load a plugin (imports:)")
        return self


_ROLES_HELP = ("Agent names (seats) it may play, e.g. [player_0]; its snapshots keep them "
               "(null: every seat).")


class LeaguePolicyConfig(PolicyConfig):
    league_role: Literal["main", "main_exploiter", "league_exploiter"] = Field(
        "main", description="Role in the league format (ignored by other formats).")
    roles: tuple[str, ...] | None = Field(None, min_length=1, description=_ROLES_HELP)


class BaselineConfig(Section):
    id: str = Field(..., min_length=1, description="Name in ratings and reports.")
    kind: str = Field("random", description=_KIND_HELP)
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of its random choices.")
    roles: tuple[str, ...] | None = Field(None, min_length=1, description=_ROLES_HELP)
    eval_only: bool = Field(
        False, description="Only evaluation plays it (eval.opponents): never scheduled in "
                           "training matches, so never rated; `tournament eval` rates it.")
    target: str | None = Field(
        None, description="kind best_response: the learner it answers (its exact best response "
                          "to that learner's greedy play, over the whole game tree).")
    every: int = Field(10, gt=0, description="kind best_response: recompute it every N steps.")

    _kind = field_validator("kind")(_scripted_kind)

    @model_validator(mode="after")
    def _target_for_best_response(self) -> BaselineConfig:
        if (self.kind == "best_response") != (self.target is not None):
            raise ValueError(f"baseline {self.id!r}: target names the learner a best_response "
                             "answers; it is needed with kind best_response and only there")
        return self


class WarmStartConfig(Section):
    steps: int = Field(0, ge=0, description="Behaviour-cloning steps on the teacher's moves; "
                                            "0 starts RL from the fresh model.")
    teacher: str = Field("random", description="Scripted policy whose moves teach the action "
                                                "format; a kind as in baselines.")
    games_per_step: int = Field(32, gt=0, le=MAX_PER_STEP,
                                description="Teacher self-play games per step.")
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Learning rate of the warm start.")

    _teacher = field_validator("teacher")(_scripted_kind)


class LeagueLoopConfig(LoopConfig):
    steps: int = Field(100, ge=0, description="Training steps (one batch of matches each).")
    games_per_step: int = Field(128, gt=0, le=MAX_PER_STEP,
                                description="Matches scheduled per step.")


class ExploiterEvalConfig(Section):
    every: int = Field(..., gt=0, description="Train an exploiter of each learner every N steps "
                       "(a multiple of eval.every; also at step 0 and the end).")
    steps: int = Field(50, gt=0, description="Training steps of each exploiter.")
    games_per_step: int = Field(64, gt=0, le=MAX_PER_STEP, description="Exploiter games per step.")
    games: int = Field(200, gt=0, description="Final games of the exploiter against the frozen "
                                              "policy, spread over the seats.")


class LeagueEvalConfig(Section):
    every: int = Field(10, gt=0, description="Evaluate learners every N steps (and at 0, end).")
    games: int = Field(200, gt=0, description="Games per opponent, half in each seat.")
    opponents: tuple[str, ...] = Field(
        ("random",), description="Baseline ids (or frozen policies, trainable: false) to evaluate "
                                 "vs. (default: random when a baseline has that id, else every "
                                 "baseline; eval_only ones always).")
    greedy: bool = Field(False, description="Greedy decoding in evaluation games.")
    exploitability: Literal["auto", "off"] = Field(
        "off", description="auto: at every evaluation, each learner's exact exploitability in "
                           "every env that has an exact method (NashConv for OpenSpiel games "
                           "and Kuhn poker; best-response values per seat for tic-tac-toe); "
                           "docs/tournaments.md, Exploitability.")
    exploiter: ExploiterEvalConfig | None = Field(
        None, description="Approximate exploitability for any game: a fresh exploiter trained "
                          "against the frozen learner, its final win rate eval/exploiter/win_rate "
                          "(null: off; tournaments/exploiter.py).")

    @field_validator("exploitability", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        """YAML reads an unquoted ``off`` as false (and ``on`` as true)."""
        return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _exploiter_on_eval_steps(self) -> LeagueEvalConfig:
        if self.exploiter is not None and self.exploiter.every % self.every:
            raise ValueError(f"eval.exploiter.every ({self.exploiter.every}) must be a multiple "
                             f"of eval.every ({self.every}): exploiters train at evaluations")
        return self


class TournamentRunConfig(RunConfig):
    """Config of ``agentrt tournament run``."""

    UNSUPPORTED = {
        "train.async_rollout.enabled": "a league's next matches are drawn after this step's "
        "snapshots and ratings (read ahead, they would change who plays whom), and its frozen "
        "opponents generate in the learner's pool, which trains meanwhile",
    }

    run_dir: str = Field("runs/tournament", description="Output folder of this run.")
    envs: tuple[EnvEntry, ...] = Field(..., min_length=1, description="Games played.")
    policies: tuple[LeaguePolicyConfig, ...] = Field(
        ..., min_length=1, description="LM policies (trainable ones learn).")
    baselines: tuple[BaselineConfig, ...] = Field((), description="Scripted opponents.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    train: LeagueLoopConfig = Field(default_factory=LeagueLoopConfig)
    eval: LeagueEvalConfig = Field(default_factory=LeagueEvalConfig)
    memory: MemoryBanksConfig = Field(
        default_factory=MemoryBanksConfig, description="Banks policies name in memory.bank.")

    @model_validator(mode="before")
    @classmethod
    def _default_eval_opponents(cls, data: Any) -> Any:
        """Without eval.opponents, a run with no baseline named random evaluates against every
        baseline (rather than asking for a random baseline it would not otherwise use), one with
        a random baseline against it and the eval_only baselines."""
        if not isinstance(data, dict) or not isinstance(data.get("eval", {}), dict):
            return data
        entries = [b for b in data.get("baselines") or [] if isinstance(b, dict)]
        ids = [b.get("id") for b in entries]
        if "opponents" in data.get("eval", {}):
            return data
        if "random" in ids:
            ids = ["random"] + [b.get("id") for b in entries
                                if _flag(b.get("eval_only")) and b.get("id") != "random"]
        return {**data, "eval": {**data.get("eval", {}), "opponents": ids}}

    @model_validator(mode="before")
    @classmethod
    def _online_preferences(cls, data: Any) -> Any:
        """Preference policies in a league learn from the run's own matches (no data set)."""
        if not isinstance(data, dict):
            return data
        policies = []
        for p in data.get("policies") or []:
            algo = p.get("algorithm") if isinstance(p, dict) else None
            if isinstance(algo, str):
                algo = {"name": algo}
            if isinstance(algo, dict) and algo.get("name") in ("dpo", "ipo", "kto", "listwise"):
                p = {**p, "algorithm": {**algo, "online": True}}
            policies.append(p)
        return {**data, "policies": policies} if policies else data

    @model_validator(mode="before")
    @classmethod
    def _rae_for_zero_sum(cls, data: Any) -> Any:
        """Policies that name no algorithm get RAE advantages when every env is zero-sum."""
        if not isinstance(data, dict) or not all(_zero_sum(e) for e in data.get("envs") or [None]):
            return data
        policies = []
        for p in data.get("policies") or []:
            algo = p.get("algorithm", {}) if isinstance(p, dict) else None
            if isinstance(algo, dict) and not {"name", "advantage"} & set(algo):
                p = {**p, "algorithm": {**algo, "advantage": "rae"}}
            policies.append(p)
        return {**data, "policies": policies} if "policies" in data else data

    @model_validator(mode="after")
    def _memory(self) -> TournamentRunConfig:
        for p in self.policies:
            if p.memory is None:
                continue
            check_policy_memory(p.id, p.memory, self.memory.banks)
            if "reflection" in p.memory.write:
                raise ValueError(f"policy {p.id!r} memory.write 'reflection' needs a reflect "
                                 "function, which tournament runs do not take yet; drop it")
        return self

    @model_validator(mode="after")
    def _exploiter_needs_full_weights(self) -> TournamentRunConfig:
        if self.eval.exploiter is None:
            return self
        for i, p in enumerate(self.policies):
            if p.trainable and p.lora.enabled:
                raise ValueError(f"eval.exploiter: policies.{i} ({p.id}) trains a LoRA adapter; "
                                 "its exploiter plays against an exported full model, so set "
                                 f"policies.{i}.lora.enabled: false or eval.exploiter: null")
        return self

    @model_validator(mode="after")
    def _exploitability(self) -> TournamentRunConfig:
        """A game tree whose prompts depend on the move order is past exact search."""
        if self.eval.exploitability == "off":
            return self
        from agentrt.tournaments.exploit_games import exact_method

        for i, env in enumerate(self.envs):
            if env.template.history and exact_method(env.id, dict(env.kwargs)) == "tree":
                raise ValueError(f"eval.exploitability: auto cannot search {env.id}'s tree with "
                                 f"envs.{i}.template.history true (each prompt depends on the "
                                 f"move order); set envs.{i}.template.history: false or "
                                 "eval.exploitability: off")
        return self

    def entrants(self) -> list[Entrant]:
        """Policies (trainable ones learn) and baselines as tournament entrants, with roles."""
        return [Entrant(p.id, learning=p.trainable, league_role=p.league_role, roles=p.roles)
                for p in self.policies] + [Entrant(b.id, roles=b.roles) for b in self.baselines
                                           if not b.eval_only]

    def env_seats(self) -> dict[str, tuple[str, ...]]:
        """Agent names in seat order per env id, read from the envs built with their kwargs."""
        from agentrt.envs.registration import make_multi

        out = {}
        for e in self.envs:
            try:
                out[e.id] = tuple(make_multi(e.id, **e.kwargs).possible_agents)
            except Exception as exc:  # noqa: BLE001 - reported as a config error
                raise ValueError(f"envs: {e.id} with kwargs {e.kwargs} cannot be built to "
                                 f"read its agents ({exc})") from None
        return out

    @model_validator(mode="after")
    def _roles(self) -> TournamentRunConfig:
        """Roles name agents of the envs, every seat has someone to play it, and the format
        can seat everyone (checked by building the scheduler)."""
        entries = [(f"policies.{i}.roles", p) for i, p in enumerate(self.policies)] + [
            (f"baselines.{i}.roles", b) for i, b in enumerate(self.baselines)]
        if all(entry.roles is None for _, entry in entries):
            return self
        seats = self.env_seats()
        agents = sorted({a for names in seats.values() for a in names})
        for field, entry in entries:
            unknown = [r for r in entry.roles or () if r not in agents]
            if unknown:
                raise ValueError(f"{field}: {entry.id!r} names roles {unknown} that no env has; "
                                 f"valid agent names: {', '.join(agents)}")
        for env, names in seats.items():
            for agent in names:
                if all(entry.roles is not None and agent not in entry.roles
                       for _, entry in entries if not getattr(entry, "eval_only", False)):
                    raise ValueError(f"roles: nobody may play {agent!r} of {env} (every policy "
                                     f"and scheduled baseline has roles without it; eval_only "
                                     f"ones never play matches); add {agent!r} to "
                                     f"some roles, or leave roles unset")
        try:
            build_scheduler(self.schedule, self.entrants(), list(seats), self.seed, seats)
        except TournamentError as exc:
            raise ValueError(f"roles: {exc}") from None
        return self

    @model_validator(mode="after")
    def _ids(self) -> TournamentRunConfig:
        envs = [e.id for e in self.envs]
        twice = sorted({e for e in envs if envs.count(e) > 1})
        if twice:  # matches, seats and templates are keyed by env id
            raise ValueError(f"envs: {twice[0]!r} appears more than once (e.g. two OpenSpiel "
                             "games); one tournament holds each env id once, so run the games "
                             "as separate tournaments")
        ids = [p.id for p in self.policies] + [b.id for b in self.baselines]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"policy and baseline ids must be unique; repeated: {dup}")
        bad = [i for i in ids if "@" in i or "|" in i]
        if bad:
            raise ValueError(f"ids must not contain '@' or '|': {bad}")
        valid = [b.id for b in self.baselines] + [p.id for p in self.policies if not p.trainable]
        missing = [o for o in self.eval.opponents if o not in valid]
        if missing:
            raise ValueError(f"eval.opponents {missing} are not baselines or frozen policies "
                             "(trainable: false); valid: "
                             f"{', '.join(valid) or 'none (add baselines)'}")
        learners = [p.id for p in self.policies if p.trainable]
        for i, b in enumerate(self.baselines):
            if b.target is not None and b.target not in learners:
                raise ValueError(f"baselines.{i}.target: {b.target!r} is not a trainable "
                                 f"policy; learners: {', '.join(learners) or 'none'}")
            if b.target is not None:
                _check_tree_envs(f"baselines.{i}", self.envs)
        unused = [(i, b.id) for i, b in enumerate(self.baselines)
                  if b.eval_only and b.id not in self.eval.opponents]
        if unused:
            raise ValueError(f"baselines.{unused[0][0]}.eval_only: {unused[0][1]!r} is "
                             "evaluation-only but not in eval.opponents, so nothing would play "
                             "it; add it there or drop eval_only")
        return self

    @model_validator(mode="after")
    def _scripted_fit_envs(self) -> TournamentRunConfig:
        """Every baseline (and the warm-start teacher) plays one game of each env, so a kind
        made for another game fails here rather than in the middle of a run."""
        players = [(f"baselines.{i}.kind", b.kind, b.seed, b.roles)
                   for i, b in enumerate(self.baselines)]
        if self.warm_start.steps:
            players.append(("warm_start.teacher", self.warm_start.teacher, self.seed, None))
        seats = self.env_seats() if players else {}
        for field, kind, seed, roles in players:
            for env in self.envs:
                error = _play_one_game(env, seats[env.id], kind, seed, roles,
                                       self.runner.max_turns)
                if error:
                    raise ValueError(f"{field}: {kind!r} cannot play {env.id} ({error}); pick a "
                                     f"scripted policy made for {env.id}, e.g. random")
        return self
