"""Vectorized games: N independent games of one env advanced together with numpy.

The episode runner uses them as its fast path when every policy of a run is scripted and has
``act_vector`` (e.g. 100k random-vs-random games in seconds); the rules are the same as the text
env's (``TicTacToe.vector_game``), which a test checks game by game.

Interface (``VectorGame``): ``reset(n)``; ``to_move`` [n] seat index of the agent to move;
``legal_mask(idx)`` [len(idx), num_actions] bool; ``step(idx, actions)`` ->
``(rewards [len(idx), num_agents], done [len(idx)], invalid [len(idx)])``. An invalid action
(out of range or illegal) leaves that game unchanged. ``action_names[i]`` is the text of action i.
"""

from __future__ import annotations

import numpy as np

# The eight lines of three cells of tic-tac-toe (the text env, agentrt.envs.board, reads them too).
TTT_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
             (2, 4, 6))


class TicTacToeVector:
    """Tic-tac-toe for N games at once (same rules and seats as :class:`TicTacToe`)."""

    possible_agents = ["player_0", "player_1"]
    action_names = [str(i) for i in range(9)]
    num_actions = 9
    _lines = np.array(TTT_LINES)

    def reset(self, n: int) -> None:
        self.boards = np.zeros((n, 9), dtype=np.int8)
        self.to_move = np.zeros(n, dtype=np.int64)
        self.moves = np.zeros(n, dtype=np.int64)

    def legal_mask(self, idx: np.ndarray) -> np.ndarray:
        return self.boards[idx] == 0

    def step(self, idx: np.ndarray, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        actions = np.asarray(actions, dtype=np.int64)
        in_range = (actions >= 0) & (actions < 9)
        safe = np.where(in_range, actions, 0)
        invalid = ~in_range | (self.boards[idx, safe] != 0)
        ok = idx[~invalid]
        seat = self.to_move[ok]
        mark = (seat + 1).astype(np.int8)
        self.boards[ok, safe[~invalid]] = mark
        self.moves[ok] += 1
        lines = self.boards[ok][:, self._lines]  # [k, 8, 3]
        won = (lines == mark[:, None, None]).all(axis=2).any(axis=1)
        full = self.moves[ok] == 9
        rewards = np.zeros((len(idx), 2))
        done = np.zeros(len(idx), dtype=bool)
        pos = np.flatnonzero(~invalid)
        win_pos, win_seat = pos[won], seat[won]
        rewards[win_pos, win_seat] = 1.0
        rewards[win_pos, 1 - win_seat] = -1.0
        done[pos] = won | full
        cont = ok[~(won | full)]
        self.to_move[cont] = 1 - self.to_move[cont]
        return rewards, done, invalid
