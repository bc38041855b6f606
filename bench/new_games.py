"""One recipe, five games: the default league recipe (``examples/game_league.yaml``) trained on
each game with nothing changed but the env id, against the perfect player's figures.

Games: Hexapawn, Connect-Three and Notakto (new, ``agentrt.envs.games``), tic-tac-toe (compact
board, its only setting beside the id) and Nim (the plugin example, 15 stones). Each (game, seed) is its own
``agentrt tournament run`` subprocess with one torch thread, ``--jobs`` at once. The last
evaluation (greedy, 400 games against each opponent, half in each seat) gives, per seat: the
win rate against random, the score (win + draw/2) against the game's simple heuristic player
(``one_ply`` for tic-tac-toe, Nim and Notakto: win now, else neither lose at once nor let the
opponent win at once;
``hexapawn`` and ``connect3``: rules of thumb) and the exact best-response value and blunders.
The perfect player (``kind: perfect``) plays the same opponents in the same seats here, 2,000
games each, for the reference.

The issue's bar (38, must-show 4): in each seat, the learner's win rate against random at least
0.9 of the perfect player's, and its score against the heuristic at least 0.5 seat-averaged.

Run: ``.venv/bin/python bench/new_games.py [--steps 300] [--seeds 0 1 2] [--out F.json]
[--set policies.0.optim.lr=3.0e-4]`` (``--set``: a change to the recipe for every game; with
``--set eval.every=100`` it also prints each run's evaluations, a learning curve).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentrt.config.load import apply_overrides, read_config
from agentrt.controller.run_dir import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exploitability import interval, last_eval  # noqa: E402  (a sibling bench script)

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "plugin_pkg"
# env id -> (env kwargs, the heuristic player's kind)
GAMES: dict[str, tuple[dict, str]] = {
    "Hexapawn-v0": ({}, "hexapawn"),
    "ConnectThree-v0": ({}, "connect3"),
    "TicTacToe-v0": ({"compact": True}, "one_ply"),
    "Nim-v0": ({}, "one_ply"),
    "Notakto-v0": ({}, "one_ply"),
}


def run_config(game: str, seed: int, steps: int, run_dir: Path, sets: list[str]) -> dict:
    cfg = read_config(ROOT / "examples" / "game_league.yaml")
    kwargs, heuristic = GAMES[game]
    cfg |= {"seed": seed, "run_dir": str(run_dir), "progress": False, "threads": 1}
    cfg["envs"][0] |= {"id": game, "kwargs": kwargs}
    if game == "Nim-v0":
        cfg["imports"] = ["nim_plugin"]
    cfg["baselines"].append({"id": "heuristic", "kind": heuristic, "seed": 3, "eval_only": True})
    cfg["eval"] |= {"every": steps, "opponents": ["random", "heuristic", "perfect"]}
    cfg["train"]["steps"] = steps
    cfg["checkpoint"] = {"every": steps}
    return apply_overrides(cfg, sets)


def learner_row(game: str, seed: int, steps: int, tmp: Path, sets: list[str]) -> dict:
    cfg = run_config(game, seed, steps, tmp / f"{game}_{seed}", sets)
    last, seconds = last_eval(cfg, f"{game}_{seed}", tmp)
    row = {"game": game, "seed": seed, "step": last["step"], "seconds": seconds}
    for s in (0, 1):
        row[f"win_vs_random/seat{s}"] = last[f"eval/win_rate_seat{s}_vs_random"]
        row[f"score_vs_heuristic/seat{s}"] = score_vs_heuristic(last, s)
        row[f"br_value/seat{s}"] = last.get(f"eval/br_value/{game}/seat{s}/greedy")
        row[f"blunders/seat{s}"] = last.get(f"eval/blunders/{game}/seat{s}")
    row["invalid_rate"] = last["eval/invalid_rate_vs_random"]
    row["curve"] = eval_curve(Path(cfg["run_dir"]) / "metrics.jsonl", game)
    return row


def score_vs_heuristic(evaluation: dict, seat: int) -> float:
    """Win + draw / 2 against the heuristic player, in ``seat``."""
    return (evaluation[f"eval/win_rate_seat{seat}_vs_heuristic"]
            + evaluation[f"eval/draw_rate_seat{seat}_vs_heuristic"] / 2)


def eval_curve(metrics: Path, game: str) -> list[dict]:
    """Every evaluation of a run, seat-averaged: (step, win vs random, score vs heuristic,
    blunders of both seats)."""
    out = []
    for m in read_jsonl(metrics):
        if "eval/win_rate_seat0_vs_random" not in m:
            continue
        win = sum(m[f"eval/win_rate_seat{s}_vs_random"] for s in (0, 1)) / 2
        score = sum(score_vs_heuristic(m, s) for s in (0, 1)) / 2
        blunders = [m.get(f"eval/blunders/{game}/seat{s}") for s in (0, 1)]
        out.append({"step": m["step"], "win_vs_random": win, "score_vs_heuristic": score,
                    "blunders": None if None in blunders else sum(blunders)})
    return out


def perfect_row(game: str, games: int) -> dict:
    """The perfect player's win rate against random and score against the heuristic, per seat."""
    from agentrt.envs.registration import make_multi
    from agentrt.policies.base import ActRequest
    from agentrt.policies.scripted import scripted_factory

    kwargs, heuristic = GAMES[game]
    if game == "Nim-v0":
        import nim_plugin  # noqa: F401  (registers Nim-v0; the plugin example's folder on the path)
    row: dict = {"game": game}
    for opponent, name in (("random", "win_vs_random"), (heuristic, "score_vs_heuristic")):
        for seat in (0, 1):
            points = 0.0
            players = [scripted_factory("perfect")(seed=seat),
                       scripted_factory(opponent)(seed=10**6 + seat)]
            for g in range(games):
                env = make_multi(game, **kwargs)
                env.reset(seed=g)
                by_agent = {env.possible_agents[seat]: players[0],
                            env.possible_agents[1 - seat]: players[1]}
                while not env.done:
                    agent = env.agent_selection
                    request = ActRequest(env, str(g), game, agent,
                                         env.possible_agents.index(agent))
                    env.step(by_agent[agent].choose(request))
                reward = env.rewards[env.possible_agents[seat]]
                points += 1.0 if reward > 0 else 0.5 if reward == 0 and name != "win_vs_random" \
                    else 0.0
            row[f"{name}/seat{seat}"] = points / games
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", default=",".join(GAMES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reference-games", type=int, default=2000)
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="a change to the recipe for every game, a.b.0.c=value")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(PLUGIN))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PLUGIN), os.environ.get("PYTHONPATH")) if p)
    games = args.games.split(",")
    arms = [(g, s) for g in games for s in args.seeds]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda a: learner_row(*a, args.steps, Path(tmp), args.sets),
                             arms))
    perfect = {g: perfect_row(g, args.reference_games) for g in games}
    recipe = " ".join(["examples/game_league.yaml", *args.sets])
    print(f"{recipe}, {args.steps} steps x 128 games, seeds {args.seeds}; "
          "the learner's greedy policy at the last evaluation (400 games per opponent), mean ± "
          f"95% interval (t over seeds); perfect: kind perfect, {args.reference_games} games a "
          "seat")
    print(f"\n{'game':16s} {'seat':4s} {'win vs random':>22s} {'perfect':>8s} {'ratio':>6s} "
          f"{'score vs heuristic':>22s} {'perfect':>8s} {'br value':>9s} {'blunders':>9s}")
    for g in games:
        mine = [r for r in rows if r["game"] == g]
        for s in (0, 1):
            win, win_h = interval([r[f"win_vs_random/seat{s}"] for r in mine])
            score, score_h = interval([r[f"score_vs_heuristic/seat{s}"] for r in mine])
            ref = perfect[g]
            ratio = win / ref[f"win_vs_random/seat{s}"]
            br = [r[f"br_value/seat{s}"] for r in mine if r[f"br_value/seat{s}"] is not None]
            bl = [r[f"blunders/seat{s}"] for r in mine if r[f"blunders/seat{s}"] is not None]
            print(f"{g:16s} {s:4d} {win:13.3f} ± {win_h:6.3f} "
                  f"{ref[f'win_vs_random/seat{s}']:8.3f} {ratio:6.2f} {score:13.3f} ± "
                  f"{score_h:6.3f} {ref[f'score_vs_heuristic/seat{s}']:8.3f} "
                  f"{sum(br) / len(br) if br else float('nan'):9.2f} "
                  f"{sum(bl) / len(bl) if bl else float('nan'):9.1f}")
        avg = [sum(r[f"score_vs_heuristic/seat{s}"] for s in (0, 1)) / 2 for r in mine]
        mean, half = interval(avg)
        invalid = sum(r["invalid_rate"] for r in mine) / len(mine)
        seconds = sum(r["seconds"] for r in mine) / len(mine)
        print(f"{g:16s} seat-averaged score vs heuristic {mean:.3f} ± {half:.3f}; invalid "
              f"moves vs random {invalid:.3f}; {seconds:.0f} s a run")
    curves = [r for r in rows if len(r["curve"]) > 1]
    if curves:
        print("\nevery evaluation (seat-averaged): step win-vs-random score-vs-heuristic blunders")
    for r in curves:
        points = "  ".join(f"{c['step']}: {c['win_vs_random']:.3f} {c['score_vs_heuristic']:.3f} "
                           f"{c['blunders']}" for c in r["curve"])
        print(f"{r['game']:16s} seed {r['seed']}  {points}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "perfect": perfect}, indent=1))


if __name__ == "__main__":
    main()
