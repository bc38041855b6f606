"""The workload: what a run kind plugs into the controller loop (:mod:`agentrt.controller.loop`).

A workload is the *scheduler* of a command (``agentrt train``: prompts of a task or data set;
``agentrt tournament run``: matches; ``agentrt decompose run``: subtask chains). The loop calls
its hooks in this order every step::

    specs   = work.next_episodes(step)            # 1. what to play
    played  = runner.run(specs)                   # 2-3. with work.players, seat_router, on_episode_end
    metrics = work.record(played, step)           # 4. ratings, league, memory, chains
    data    = work.training_data(played, step)    # 5. each learner's data for its objective
    metrics |= work.after_step(ctl, step)         # snapshots, resets
    work.evaluate(ctl) every ``eval_every`` steps; checkpoints hold work.state_dict()

Subclasses set :attr:`label` and :attr:`outputs` and implement the five hooks with no default
(:meth:`next_episodes`, :meth:`players`, :meth:`record`, :meth:`training_data`,
:meth:`evaluate`); every other hook has a default that does nothing.

Online control (:mod:`agentrt.controller.control`): a kind names its own live fields in
:attr:`live` (:meth:`live_fields` adds every LM policy's sampling and learning rate and the shared
ones), takes them in :meth:`reconfigure`, and names the commands it cannot take in :attr:`refused`.
"""

from __future__ import annotations

from typing import Any, Callable

from agentrt.config.load import dump_config
from agentrt.config.run import RunConfig
from agentrt.controller.control.config import POLICY_LIVE, SHARED_LIVE
from agentrt.runner.core import EpisodeSpec, RunnerConfig, RunResult


class Workload:
    """The scheduler of a run kind, with do-nothing defaults for the optional hooks.

    Args:
        cfg: The run's config; the loop's schedule (steps, evaluation and checkpoint periods,
            progress) is read from its shared fields.
    """

    label = "run"
    #: Files and folders of the run folder this workload writes (``--new-run`` removes them).
    outputs: tuple[str, ...] = ()
    #: Pairs a preference objective draws from a ranked list ("all", "best_worst").
    preference_pairs = "all"
    #: Fields of the kind's own sections a running run takes (see :meth:`live_fields`).
    live: tuple[str, ...] = ()
    #: Control commands (``feedback``, ``inject``) this kind cannot take, and why in one line.
    refused: dict[str, str] = {}
    runner: RunnerConfig

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.steps, self.progress = cfg.train.steps, cfg.progress
        self.eval_every, self.checkpoint_every = cfg.eval.every, cfg.checkpoint.every
        self.checkpoint_keep = cfg.checkpoint.keep
        self.checkpoint_models = cfg.checkpoint.models

    @property
    def policies(self) -> list[Any]:
        """Every LM policy config of the run (the controller hosts each in a pool)."""
        return list(self.cfg.policies)

    def config_text(self) -> str:
        return dump_config(self.cfg)

    # ------------------------------------------------------------------ online control
    def policy_sections(self) -> list[tuple[str, Any]]:
        """``(dotted key, config)`` of every LM policy's section: ``policies.<index>``."""
        return [(f"policies.{i}", p) for i, p in enumerate(self.cfg.policies)]

    def live_fields(self) -> tuple[str, ...]:
        """The config fields a running run takes (``agentrt ctl set``): :attr:`live`, every LM
        policy's sampling and (a learner's) learning rate, then the fields every kind shares."""
        policies = [f"{key}.{name}" for key, p in self.policy_sections() for name in POLICY_LIVE
                    if p.trainable or not name.startswith("optim.")]
        return (*self.live, *policies, *SHARED_LIVE)

    def refusal(self, command: str) -> str | None:
        """Why this run cannot take control command ``command``; None: it can."""
        return self.refused.get(command)

    def reconfigure(self, ctl: Any, cfg: RunConfig) -> None:
        """Live values: ``cfg`` differs from the run's config in :meth:`live_fields` only. A
        changed policy goes to its pool (sampling, learning rate); the next step reads the rest.
        Then the batch size and the players follow the new values."""
        before = dict(self.policy_sections())
        self.cfg = cfg
        for key, policy in self.policy_sections():
            if policy != before[key]:
                ctl.reconfigure(policy)
        self.eval_every, self.checkpoint_every = cfg.eval.every, cfg.checkpoint.every
        per_step = self.episodes_per_step(cfg)
        if per_step is not None:
            self.runner = self.runner.model_copy(update={"concurrency": per_step})
        self.make_players(ctl)

    def episodes_per_step(self, cfg: Any) -> int | None:
        """Episodes a step plays at once (the runner's concurrency) under ``cfg``; None: the
        runner config's own."""
        return None

    def make_players(self, ctl: Any) -> None:
        """Rebuilds the players from the config's policies after a live change
        (:meth:`reconfigure`); a workload may build them with it at start too."""

    # ------------------------------------------------------------------ required
    def next_episodes(self, step: int) -> list[EpisodeSpec]:
        raise NotImplementedError

    def players(self, specs: list[EpisodeSpec]) -> dict[str, Any]:
        raise NotImplementedError

    def record(self, played: RunResult, step: int) -> dict[str, float]:
        raise NotImplementedError

    def training_data(self, played: RunResult, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def evaluate(self, ctl: Any) -> dict[str, float]:
        raise NotImplementedError

    # ------------------------------------------------------------------ optional
    def start(self, ctl: Any) -> None:
        """Before the warm start or resume: the pools exist."""

    def warm_start(self, ctl: Any) -> dict[str, float]:
        """A fresh run's warm start (SFT, behaviour cloning); its last metrics."""
        return {}

    def on_episode_end(self) -> Callable[[Any], None] | None:
        return None

    def seat_router(self) -> Callable[[Any, str], str] | None:
        return None

    def after_step(self, ctl: Any, step: int) -> dict[str, float]:
        return {}

    def done(self) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` on resume."""

    def stored_rows(self, step: int) -> dict[str, int]:
        """Rows of steps <= ``step`` in each store of its own in the run folder (file name ->
        count), read without changing anything: a checkpoint records them and a resume checks
        them (e.g. a league's ``matches.sqlite``)."""
        return {}

    def checkpointed(self, step: int, oldest: int) -> None:
        """The checkpoint of ``step`` is written and the run folder keeps none older than
        ``oldest`` (e.g. a stream acknowledges what that one holds)."""

    def finish(self, ctl: Any) -> None:
        """After the last step (final models, reports)."""

    def close(self) -> None:
        """Releases what the workload holds (reward pools, stores), whatever happened."""
