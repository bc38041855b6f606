"""Scripted policies: baselines and opponents that never produce training data.

- :class:`RandomPolicy`: a uniformly random legal action (random digits in free-text envs);
- :class:`MinimaxTicTacToe`: perfect tic-tac-toe (never loses), random among equally good moves;
- :class:`ConnectFourHeuristic`: win now, else block, else avoid handing a win, prefer the centre;
- :class:`KuhnPolicy`: a behaviour strategy table over OpenSpiel-style information states (works
  on the built-in Kuhn poker and on OpenSpiel's ``kuhn_poker``); :func:`kuhn_nash` builds the
  equilibrium family;
- :class:`BargainHeuristic`: asks for what it values, accepts a good enough offer;
- :class:`CalculatorAgent`: solves ``ToolUse-v0`` by calling the calculator, then answering;
- :class:`PerfectPlayer`: perfect play in any small game whose env gives ``state_key()``;
  :class:`OnePlyPlayer`: win now, else do not let the opponent win at once (any copyable game);
  :class:`HexapawnHeuristic`, :class:`ConnectHeuristic`: rules of thumb for Hexapawn and
  Connect-Three (the "simple heuristic player" baselines);
- :class:`BestResponsePolicy`: a table of best-response moves the league computes and refreshes
  (``kind: best_response``).

Every policy takes a ``seed`` and is deterministic for a given sequence of requests. Configs name
them by their key in :data:`SCRIPTED` (``kind: minimax``) or as ``package.module:Class``.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from typing import Any, Callable

import numpy as np

from agentrt.envs.board import connects_four, ttt_winner
from agentrt.envs.games import Hexapawn, line_through
from agentrt.envs.solve import GameSolver
from agentrt.core.errors import ConfigError
from agentrt.policies.base import Action, ActRequest
from agentrt.core.registry import Registry, import_callable
from agentrt.core.seeding import random_state, set_random_state


class ScriptedPolicy:
    """Base: ``act`` calls ``choose(request) -> str`` for each request."""

    trainable = False
    version = 0

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, requests: list[ActRequest]) -> list[Action]:
        return [Action(self.choose(r)) for r in requests]

    def choose(self, request: ActRequest) -> str:
        raise NotImplementedError

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        """The probability of each action text ``choose`` may return here, or None where the
        player does not say (exact exploitability, agentrt.tournaments.exploitability, needs it)."""
        del request
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, as plain data: the RNG stream (the rest comes from the
        config). A subclass with more changing state adds it here and in load_state_dict."""
        return {"rng": random_state(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_random_state(state["rng"], self.rng)


def scripted_state(policy: Any) -> dict[str, Any] | None:
    """``policy.state_dict()`` for a checkpoint; None for a user's scripted player without one
    (it restarts from its seed on resume)."""
    return policy.state_dict() if hasattr(policy, "state_dict") else None


def load_scripted_state(policy: Any, state: dict[str, Any] | None) -> None:
    if state is not None and hasattr(policy, "load_state_dict"):
        policy.load_state_dict(state)


class RandomPolicy(ScriptedPolicy):
    """Uniformly random legal action; in free-text envs a random 1-4 digit number.

    ``act_vector`` serves the runner's vectorized fast path (uniform over the legal mask).
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.np_rng = np.random.default_rng(seed)

    def act_vector(self, game: Any, idx: np.ndarray, legal: np.ndarray) -> np.ndarray:
        """One uniformly random legal action index per game in ``idx`` (legal: [n, A] bool)."""
        noise = self.np_rng.random(legal.shape)
        noise[~legal] = -1.0
        return noise.argmax(axis=1)

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        legal = request.legal_actions
        return {a: 1.0 / len(legal) for a in legal} if legal else None

    def choose(self, request: ActRequest) -> str:
        legal = request.legal_actions
        if legal:
            return legal[self.rng.randrange(len(legal))]
        return str(self.rng.randrange(10 ** self.rng.randint(1, 4)))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "np_rng": self.np_rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.np_rng.bit_generator.state = state["np_rng"]


# ----------------------------------------------------------------------------- tic-tac-toe
@functools.cache
def _ttt_value(board: tuple[int, ...], mark: int) -> int:
    """Game value for the player ``mark`` to move: +1 win, 0 draw, -1 loss (negamax)."""
    if ttt_winner(board):
        return -1  # the previous mover won
    if all(board):
        return 0
    other = 3 - mark
    return max(-_ttt_value(board[:i] + (mark,) + board[i + 1:], other)
               for i, v in enumerate(board) if v == 0)


def ttt_best_moves(board: tuple[int, ...], mark: int) -> list[int]:
    """All cells that keep the best game value for ``mark`` to move."""
    other = 3 - mark
    scored = [(-_ttt_value(board[:i] + (mark,) + board[i + 1:], other), i)
              for i, v in enumerate(board) if v == 0]
    best = max(s for s, _ in scored)
    return [i for s, i in scored if s == best]


class MinimaxTicTacToe(ScriptedPolicy):
    """Perfect play at tic-tac-toe (needs ``TicTacToe-v0``'s structured state)."""

    def choose(self, request: ActRequest) -> str:
        state = request.state
        moves = ttt_best_moves(tuple(state["board"]), state["mark"])
        return str(moves[self.rng.randrange(len(moves))])

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        state = request.state
        moves = ttt_best_moves(tuple(state["board"]), state["mark"])
        return {str(m): 1.0 / len(moves) for m in moves}



# ----------------------------------------------------------------------------- connect four
def _drop(grid: list[list[int]], col: int, mark: int) -> int | None:
    for row in range(len(grid) - 1, -1, -1):
        if grid[row][col] == 0:
            grid[row][col] = mark
            return row
    return None


class ConnectFourHeuristic(ScriptedPolicy):
    """Win now; else block the opponent's win; else a move that does not hand over a win,
    preferring central columns."""

    def choose(self, request: ActRequest) -> str:
        state = request.state
        grid = [list(r) for r in state["grid"]]
        mark, other = state["mark"], 3 - state["mark"]
        cols = [int(c) for c in request.legal_actions or []]
        for who in (mark, other):
            for c in cols:
                row = _drop(grid, c, who)
                wins = row is not None and connects_four(grid, row, c)
                grid[row][c] = 0  # type: ignore[index]
                if wins:
                    return str(c)
        safe = [c for c in cols if not self._hands_win(grid, c, mark, other)] or cols
        centre = (len(grid[0]) - 1) / 2
        best = min(abs(c - centre) for c in safe)
        choices = [c for c in safe if abs(c - centre) == best]
        return str(choices[self.rng.randrange(len(choices))])

    @staticmethod
    def _hands_win(grid: list[list[int]], col: int, mark: int, other: int) -> bool:
        row = _drop(grid, col, mark)
        above = _drop(grid, col, other) if row is not None and row > 0 else None
        loses = above is not None and connects_four(grid, above, col)
        if above is not None:
            grid[above][col] = 0
        if row is not None:
            grid[row][col] = 0
        return loses


# ----------------------------------------------------------------------------- kuhn poker
def kuhn_nash(alpha: float = 0.0) -> dict[str, float]:
    """Bet probabilities of Kuhn's equilibrium family (alpha in [0, 1/3]); value -1/18 for
    player_0. Keys are OpenSpiel information states: card (0=J, 1=Q, 2=K) + history."""
    if not 0.0 <= alpha <= 1 / 3:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    return {"0": alpha, "1": 0.0, "2": 3 * alpha, "0pb": 0.0, "1pb": alpha + 1 / 3, "2pb": 1.0,
            "0p": 1 / 3, "1p": 0.0, "2p": 1.0, "0b": 0.0, "1b": 1 / 3, "2b": 1.0}


def kuhn_info_state(state: dict[str, Any]) -> str:
    """OpenSpiel-style information state from the built-in env's or the OpenSpiel adapter's
    structured view."""
    if state.get("info_state") is not None:
        return str(state["info_state"])
    return f"{state['card']}{state['history']}"


class KuhnPolicy(ScriptedPolicy):
    """Bets with probability ``table[info_state]`` (default: Kuhn equilibrium, alpha 0)."""

    def __init__(self, table: dict[str, float] | None = None, seed: int = 0) -> None:
        super().__init__(seed)
        self.table = table if table is not None else kuhn_nash(0.0)

    def choose(self, request: ActRequest) -> str:
        p_bet = self.table[kuhn_info_state(request.state)]
        return "bet" if self.rng.random() < p_bet else "pass"

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        p_bet = self.table[kuhn_info_state(request.state)]
        return {"pass": 1.0 - p_bet, "bet": p_bet}


# ----------------------------------------------------------------------------- bargaining
class BargainHeuristic(ScriptedPolicy):
    """Accepts an offer worth at least ``accept_at`` (lowered as messages run out); otherwise
    proposes to take the items it values most until it holds ``ask`` of the pool's value.

    Its messages are the bare moves (``[accept]``, ``[propose 2 1 0]``), short enough for a small
    LM to imitate in a warm start."""

    def __init__(self, ask: float = 0.7, accept_at: float = 0.5, seed: int = 0) -> None:
        super().__init__(seed)
        self.ask, self.accept_at = ask, accept_at

    def choose(self, request: ActRequest) -> str:
        s = request.state
        counts, values = s["counts"], s["values"]
        total = sum(c * v for c, v in zip(counts, values))
        threshold = self.accept_at if s["turns_left"] > 2 else self.accept_at / 2
        if s["offer"] is not None:
            got = sum(c * v for c, v in zip(s["offer"], values))
            if got >= threshold * total:
                return "[accept]"
        share = [0] * len(counts)
        held = 0
        for i in sorted(range(len(counts)), key=lambda k: -values[k]):
            while share[i] < counts[i] and held < self.ask * total:
                share[i] += 1
                held += values[i]
        return "[propose " + " ".join(str(n) for n in share) + "]"


# ----------------------------------------------------------------------------- best response
class BestResponsePolicy(ScriptedPolicy):
    """Plays a table of best-response moves (observation text -> the moves that reach the best
    value, one drawn uniformly), random legal moves where the table has none. The league fills
    the table with the exact best response to a learner's greedy play and refreshes it as the
    learner changes (``kind: best_response``, ``target:``, ``every:``): AlphaStar's main
    exploiter, computed instead of trained, for games whose tree is small enough to search."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.moves: dict[str, list[str]] = {}

    def set_moves(self, moves: dict[str, list[str]]) -> None:
        self.moves = {k: list(v) for k, v in moves.items()}

    def _choices(self, request: ActRequest) -> list[str]:
        legal = request.legal_actions or []
        known = self.moves.get(request.observation)
        return [m for m in known if m in legal] if known else legal

    def choose(self, request: ActRequest) -> str:
        choices = self._choices(request)
        if not choices:
            return str(self.rng.randrange(10))
        return choices[self.rng.randrange(len(choices))]

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        choices = self._choices(request)
        return {m: 1.0 / len(choices) for m in choices} if choices else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "moves": self.moves}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.set_moves(state.get("moves", {}))


# ----------------------------------------------------------------------------- tool use
class CalculatorAgent(ScriptedPolicy):
    """Solves ``ToolUse-v0``: calls the calculator on the question, then answers its result."""

    def choose(self, request: ActRequest) -> str:
        state = request.state
        last = state.get("last_result")
        if last and (m := re.search(r"calc result: (-?\d+)", last)):
            return f"answer: {m.group(1)}"
        return f"calc: {state['expression']}"


# ----------------------------------------------------------------------------- any small game
class PerfectPlayer(ScriptedPolicy):
    """Perfect play in any small two-player game whose env gives ``state_key()`` (tic-tac-toe,
    Hexapawn, Connect-Three, Nim, a user's game): the whole tree below each position searched once
    (:class:`agentrt.envs.solve.GameSolver`), then a move of the best value, the fastest win or
    the slowest loss among equal ones, drawn uniformly among ties."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.solvers: dict[str, GameSolver] = {}

    def _best(self, request: ActRequest) -> list[str]:
        env = request.game
        if not callable(getattr(env, "state_key", None)):
            raise ConfigError(f"kind: perfect needs an env that gives state_key() to search "
                              f"its tree; {request.env_name} does not")
        return self.solvers.setdefault(request.env_name, GameSolver()).best_moves(env)

    def choose(self, request: ActRequest) -> str:
        moves = self._best(request)
        return moves[self.rng.randrange(len(moves))] if moves else "0"

    def action_probs(self, request: ActRequest) -> dict[str, float] | None:
        moves = self._best(request)
        return {m: 1.0 / len(moves) for m in moves} if moves else None


class OnePlyPlayer(ScriptedPolicy):
    """The simplest heuristic for any game whose env can be copied: a move that wins at once;
    else one that neither loses at once (misère games: Notakto's line of three) nor lets the
    opponent win at once (which blocks a threat); else any (ties drawn uniformly). Tic-tac-toe's
    "win if you can, block if you must" without the centre rule; in Nim it takes the last
    stones when it can."""

    def choose(self, request: ActRequest) -> str:
        env, agent = request.game, request.agent
        moves = list(request.legal_actions or [])
        if not moves:
            return "0"
        def child(state: Any, move: str) -> Any:
            out = copy.deepcopy(state)
            out.step(move)
            return out
        def wins(move: str) -> bool:
            c = child(env, move)
            return c.done and c.rewards.get(agent, 0.0) > 0
        def safe(move: str) -> bool:
            c = child(env, move)
            if c.done:  # a move that ends the game is safe unless it loses (misère games)
                return c.rewards.get(agent, 0.0) >= 0
            if c.agent_selection == agent:
                return True
            other = c.agent_selection
            return not any((g := child(c, m)).done and g.rewards.get(other, 0.0) > 0
                           for m in c.legal_actions(other) or [])
        for rule in (wins, safe):
            if chosen := [m for m in moves if rule(m)]:
                moves = chosen
                break
        return moves[self.rng.randrange(len(moves))]


class HexapawnHeuristic(ScriptedPolicy):
    """Hexapawn by three rules: a move that wins now (far row reached, last pawn taken, the
    opponent left without a move); else a capture; else a move after which no enemy pawn can
    capture the moved pawn; else any move (ties drawn uniformly)."""

    def choose(self, request: ActRequest) -> str:
        board, mark = list(request.state["board"]), request.state["mark"]
        moves = Hexapawn.moves(board, mark)
        if not moves:
            return "00"
        def after(move: tuple[int, int]) -> list[int]:
            out = list(board)
            out[move[0]], out[move[1]] = 0, mark
            return out
        def wins(move: tuple[int, int]) -> bool:
            b = after(move)
            far = move[1] < 3 if mark == 1 else move[1] >= 6
            return far or 3 - mark not in b or not Hexapawn.moves(b, 3 - mark)
        def safe(move: tuple[int, int]) -> bool:
            return all(dst != move[1] for _, dst in Hexapawn.moves(after(move), 3 - mark))
        for rule in (wins, lambda m: board[m[1]] == 3 - mark, safe):
            if chosen := [m for m in moves if rule(m)]:
                moves = chosen
                break
        src, dst = moves[self.rng.randrange(len(moves))]
        return f"{src}{dst}"


class ConnectHeuristic(ScriptedPolicy):
    """Connect-Three (any gravity grid with ``board``/``cols``/``rows`` in its state) by
    connect-four's rules of thumb: win now; else block the opponent's win; else a column that
    does not hand the opponent a win on top; preferring central columns."""

    def choose(self, request: ActRequest) -> str:
        state = request.state
        board, mark, cols = list(state["board"]), state["mark"], state["cols"]
        need, rows = getattr(request.game, "need", 3), state["rows"]
        open_cols = [c for c in range(cols) if board[c] == 0]
        def land(b: list[int], col: int) -> int | None:
            return next((r * cols + col for r in range(rows - 1, -1, -1)
                         if b[r * cols + col] == 0), None)
        def makes_line(b: list[int], col: int, who: int) -> bool:
            cell = land(b, col)
            if cell is None:
                return False
            b2 = list(b)
            b2[cell] = who
            return line_through(b2, cols, rows, cell, need)
        for who in (mark, 3 - mark):
            if hits := [c for c in open_cols if makes_line(board, c, who)]:
                return str(hits[self.rng.randrange(len(hits))])
        def hands_win(col: int) -> bool:
            b2 = list(board)
            b2[land(b2, col)] = mark  # type: ignore[index]
            return makes_line(b2, col, 3 - mark)
        safe = [c for c in open_cols if not hands_win(c)] or open_cols
        centre = (cols - 1) / 2
        best = min(abs(c - centre) for c in safe)
        choices = [c for c in safe if abs(c - centre) == best]
        return str(choices[self.rng.randrange(len(choices))])


# ----------------------------------------------------------------------------- registry
ScriptedFactory = Callable[..., ScriptedPolicy]
SCRIPTED: Registry[ScriptedFactory] = Registry("scripted policy")
SCRIPTED.add("random", RandomPolicy)
SCRIPTED.add("minimax", MinimaxTicTacToe)
SCRIPTED.add("connect4", ConnectFourHeuristic)
SCRIPTED.add("kuhn", KuhnPolicy)
SCRIPTED.add("bargain", BargainHeuristic)
SCRIPTED.add("calculator", CalculatorAgent)
SCRIPTED.add("best_response", BestResponsePolicy)
SCRIPTED.add("perfect", PerfectPlayer)
SCRIPTED.add("one_ply", OnePlyPlayer)
SCRIPTED.add("hexapawn", HexapawnHeuristic)
SCRIPTED.add("connect3", ConnectHeuristic)


def scripted_factory(kind: str) -> ScriptedFactory:
    """The class (or factory taking ``seed=``) a ``kind`` names: a name registered in
    :data:`SCRIPTED`, or ``'package.module:Class'`` for a user's own scripted player.

    Raises:
        ConfigError: unknown name, or a module/attribute that cannot be imported.
    """
    if ":" in kind:
        return import_callable(kind, f"scripted policy {kind!r}")
    try:
        return SCRIPTED.get(kind)
    except KeyError as exc:
        raise ConfigError(f"{exc.args[0]}; or give 'package.module:Class'") from None
