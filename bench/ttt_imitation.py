"""The imitation ceiling of tic-tac-toe: how many steps a model needs to play perfectly when it is
*shown* perfect play in every position, the most any self-play recipe could give it.

A fresh model (``--preset``, the demo's compact board and prompt) is trained by supervised
fine-tuning on every one of the 4,520 reachable positions, each labelled with a move drawn
uniformly from the minimax-optimal ones (redrawn per visit), positions drawn uniformly, ``--batch``
per step at ``--lr``. Every ``--every`` steps it prints the exact measures of the greedy policy:
the mean training loss since the last print, the share of all positions where its move is a
perfect one, blunders per seat (states it can be led to where its move gives game value away;
0 is unexploitable) and the best-response value per seat, with the seconds spent training.

This is no recipe (the labels come from a perfect player); it separates what the model and the
time budget allow from what a league's credit assignment does with them.

Run: ``.venv/bin/python bench/ttt_imitation.py [--steps 3000] [--preset llama-tiny]``
"""

from __future__ import annotations

import argparse
import copy
import random
import tempfile
import time

from agentrt.config.sections import PolicyConfig, SFTConfig
from agentrt.controller.loop import PolicyHandle
from agentrt.core.types import Trajectory, Turn
from agentrt.envs.registration import make_multi
from agentrt.policies.base import ActRequest
from agentrt.policies.lm import LMPolicy, PromptTemplate
from agentrt.policies.scripted import ttt_best_moves
from agentrt.runtime.pool import LocalPool
from agentrt.tournaments.exploit_games import tree_best_response
from agentrt.tournaments.exploitability import distributions

ENV, KWARGS = "TicTacToe-v0", {"compact": True}


def positions() -> list[ActRequest]:
    """A request at every reachable non-terminal position (depth-first, once per state)."""
    env = make_multi(ENV, **KWARGS)
    env.reset(seed=0)
    seen, out, stack = set(), [], [env]
    while stack:
        env = stack.pop()
        if env.done or env.state_key() in seen:
            continue
        seen.add(env.state_key())
        agent = env.agent_selection
        out.append(ActRequest(env, "imitation", ENV, agent, env.possible_agents.index(agent)))
        for text in env.legal_actions(agent):
            child = copy.deepcopy(env)
            child.step(text)
            stack.append(child)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-tiny")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cfg = PolicyConfig(id="lm", model={"preset": args.preset},
                       rollout={"sampling": {"temperature": 0.7, "max_new_tokens": 3}})
    sft = SFTConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, warmup_steps=0)
    with tempfile.TemporaryDirectory() as tmp:
        pool = LocalPool(cfg, seed=args.seed, workdir=tmp)
        lm = LMPolicy(PolicyHandle(pool, "lm", cfg),
                      PromptTemplate(first="{observation}\nAction: ", history=False))
        reqs = positions()
        prompts = lm.render(reqs)[0]
        best = [[str(m) for m in ttt_best_moves(tuple(r.state["board"]), r.state["mark"])]
                for r in reqs]
        eos = lm.tokenizer.eos_token_id
        print(f"{args.preset}: {len(reqs)} positions, batch {args.batch}, lr {args.lr}")
        trained, losses = 0.0, []
        for step in range(args.steps + 1):
            if step % args.every == 0:
                got = tree_best_response(ENV, KWARGS, lm)
                dists = distributions(lm, reqs)
                right = sum(r.legal_actions[d.greedy()] in b
                            for r, d, b in zip(reqs, dists, best)) / len(reqs)
                loss = sum(losses) / max(1, len(losses))
                losses = []
                print(f"step {step:5d}  train {trained:6.1f} s  loss {loss:.3f}  perfect moves "
                      f"{right:.3f} of positions  blunders X {got['blunders/seat0']:4.0f} O "
                      f"{got['blunders/seat1']:4.0f}  br_value X "
                      f"{got['br_value/seat0/greedy']:.2f} O {got['br_value/seat1/greedy']:.2f}",
                      flush=True)
            if step == args.steps:
                break
            rows = []
            for i in rng.choices(range(len(reqs)), k=args.batch):
                move = lm.encode(rng.choice(best[i])) + [eos]
                rows.append(Trajectory([Turn(prompts[i], move, [0.0] * len(move))],
                                       policy_id="lm"))
            start = time.perf_counter()
            losses.append(pool.sft_step(rows, sft, adapter="lm")["sft/loss"])
            trained += time.perf_counter() - start


if __name__ == "__main__":
    main()
