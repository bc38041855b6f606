"""``agentrt play RUN_DIR``: a person plays a trained policy of a tournament run in the terminal.

The run's resolved config (``config.yaml``) gives the envs, prompt templates and policies; the
policy plays with the weights in ``final_models/<id>`` through the same runner, prompts and
parsing as in training, greedy by default. The person sees each observation with its legal
moves and types a move; a move that is not legal is asked again.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any, Sequence

from agentrt.core.errors import AgentrtError, ConfigError
from agentrt.policies.base import Action, ActRequest

HUMAN = "you"


class HumanPlayer:
    """A policy that asks a person (a text stream) for every move."""

    trainable = False
    version = 0

    def __init__(self, stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> None:
        self.stdin, self.stdout = stdin, stdout

    def act(self, requests: list[ActRequest]) -> list[Action]:
        return [Action(self._ask(r)) for r in requests]

    def _ask(self, request: ActRequest) -> str:
        legal = request.legal_actions
        self._say(f"\n{request.observation}")
        prompt = f"your move ({' '.join(legal)}): " if legal else "your move: "
        while True:
            self._say(prompt, end="")
            line = self.stdin.readline()
            if not line:
                raise AgentrtError("input ended before the game did")
            move = line.strip()
            if not legal or move in legal:
                return move
            self._say(f"{move!r} is not a legal move here")

    def _say(self, text: str, end: str = "\n") -> None:
        print(text, end=end, file=self.stdout, flush=True)


class ShownPolicy:
    """A policy whose every move is printed for the person playing it (``policy plays: 3``):
    the next observation shows the board, not which move made it."""

    trainable = False

    def __init__(self, policy: Any, name: str, stdout: IO[str]) -> None:
        self.policy, self.name, self.stdout = policy, name, stdout

    @property
    def version(self) -> int:
        return int(getattr(self.policy, "version", 0))

    def act(self, requests: list[ActRequest]) -> list[Action]:
        actions = self.policy.act(requests)
        for action in actions:
            if not getattr(action, "truncate", False):
                print(f"{self.name} plays: {action.text}", file=self.stdout, flush=True)
        return actions


def play(run_dir: Path, policy: str | None = None, env: str | None = None, seat: int = 0,
         games: int = 1, sample: bool = False, imports: Sequence[str] = (),
         stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> list[str]:
    """Plays ``games`` games of a person (seat ``seat``) against a trained policy.

    Returns:
        The person's result in each game: "win", "draw" or "loss".

    Raises:
        ConfigError: not a finished tournament run, unknown policy, env or seat.
    """
    cfg = _run_config(run_dir, imports)
    pcfg = _policy(cfg, run_dir, policy)
    env_entry = _env(cfg, env)
    agents = cfg.env_seats()[env_entry.id]
    if not 0 <= seat < len(agents):
        raise ConfigError(f"--seat {seat}: {env_entry.id} has seats 0-{len(agents) - 1}")
    from agentrt.runtime.learner import Learner
    from agentrt.policies.lm import LMPolicy
    from agentrt.runner.core import EpisodeRunner, EpisodeSpec

    engine = Learner(pcfg, seed=cfg.seed)
    template = env_entry.template.prompt()
    sampling = None if sample else pcfg.rollout.sampling.model_copy(update={"temperature": 0.0})
    lm = LMPolicy(engine, template, trainable=False, sampling=sampling)
    runner = EpisodeRunner({pcfg.id: ShownPolicy(lm, pcfg.id, stdout),
                            HUMAN: HumanPlayer(stdin, stdout)},
                           cfg.runner.model_copy(update={"random_seats": False}))
    players = tuple(HUMAN if i == seat else pcfg.id for i in range(len(agents)))
    results = []
    for game in range(games):
        spec = EpisodeSpec(env_entry.id, players, seed=cfg.seed + game,
                           env_kwargs=dict(env_entry.kwargs))
        record = runner.run([spec]).episodes[0]
        result = record.results[agents[seat]]
        results.append(result)
        how = {"win": "won", "loss": "lost", "draw": "drew"}.get(result, result)
        print(f"\ngame {game + 1}: you {how} (return {record.returns[agents[seat]]:+g}; "
              f"ended by {record.ended_by})", file=stdout, flush=True)
    return results


def _run_config(run_dir: Path, imports: Sequence[str]) -> Any:
    from agentrt.tools.checks import load_checked

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml; give the folder of a tournament run")
    kind, cfg = load_checked(path, imports=imports)
    if kind != "tournament":
        raise ConfigError(f"{run_dir} is a {kind} run; agentrt play needs a tournament run "
                          "(a policy trained to play an env)")
    return cfg


def _policy(cfg: Any, run_dir: Path, policy: str | None) -> Any:
    ids = [p.id for p in cfg.policies]
    pid = policy or next((p.id for p in cfg.policies if p.trainable), ids[0])
    if pid not in ids:
        raise ConfigError(f"--policy {pid!r} is not a policy of this run; valid: {', '.join(ids)}")
    folder = run_dir / "final_models" / pid
    if not (folder / "config.json").is_file():
        adapter = (folder / "adapter_config.json").is_file()
        raise ConfigError(f"{folder} holds a LoRA adapter, which agentrt play cannot load yet"
                          if adapter else f"{folder} has no final model; let the run finish")
    pcfg = next(p for p in cfg.policies if p.id == pid)
    model = pcfg.model.model_copy(update={"path": str(folder), "preset": None})
    return pcfg.model_copy(update={"model": model, "trainable": False})


def _env(cfg: Any, env: str | None) -> Any:
    ids = [e.id for e in cfg.envs]
    if env is None:
        return cfg.envs[0]
    if env not in ids:
        raise ConfigError(f"--env {env!r} is not an env of this run; valid: {', '.join(ids)}")
    return cfg.envs[ids.index(env)]
