"""Two-player board games with perfect information: tic-tac-toe and connect-four.

Both follow the turn-based API of :class:`~agentrt.envs.core.MultiAgentEnv`: "player_0" moves first,
the winner gets +1 and the loser -1 at the end, a draw gives 0 to both. Actions are the cell (0-8)
or column (0-6) number as text; "[4]" and " 4 " are accepted too.
"""

from __future__ import annotations

from typing import Any

from agentrt.envs.core import MultiAgentEnv
from agentrt.envs.vector import TTT_LINES, TicTacToeVector

# Lines through each cell, so a move only checks the lines it can complete.
_TTT_LINES_AT = tuple(tuple(line for line in TTT_LINES if cell in line) for cell in range(9))
_MARKS = ".XO"


def parse_index(text: str, size: int) -> int | None:
    """'4', ' [4] ', '4.' -> 4 when 0 <= 4 < size; anything else -> None."""
    core = text.strip().strip("[]().'\"").strip()
    if not core.isdecimal() or len(core) > 3:
        return None
    value = int(core)
    return value if value < size else None


def ttt_winner(board: tuple[int, ...] | list[int]) -> int:
    """1 or 2 when that mark has three in a row, else 0."""
    for a, b, c in TTT_LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return 0


class TicTacToe(MultiAgentEnv):
    """Tic-tac-toe: player_0 is X and moves first; cells are numbered 0-8 row by row.

    Args:
        compact: Observe the board as one short line, ``"X|X1O3X5678"`` (own mark, then the nine
            cells row by row, a digit for each empty cell), instead of the sentence-and-grid
            text. Small models trained from scratch learn much faster from 11 characters than
            from ~110; pretrained LMs read the default text better.

    ``observe_struct(agent)`` gives ``{"board": tuple of 9 ints (0 empty, 1 X, 2 O), "mark": 1|2}``.
    """

    metadata = {"render_modes": ["ansi"], "name": "tic_tac_toe"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True

    def __init__(self, compact: bool = False, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.compact = compact

    @staticmethod
    def vector_game() -> Any:
        """The numpy twin used by the runner's fast path (``agentrt.envs.vector``)."""
        return TicTacToeVector()

    def _reset(self, options: dict[str, Any]) -> None:
        self.board = [0] * 9
        self.moves: list[int] = []
        self.agent_selection = "player_0"

    def _mark(self, agent: str) -> int:
        return 1 if agent == "player_0" else 2

    def _legal(self, agent: str) -> list[str] | None:
        return [str(i) for i, v in enumerate(self.board) if v == 0]

    def _parse(self, agent: str, text: str) -> int | None:
        cell = parse_index(text, 9)
        return cell if cell is not None and self.board[cell] == 0 else None

    def _apply(self, agent: str, move: int) -> None:
        mark = self._mark(agent)
        board = self.board
        board[move] = mark
        self.moves.append(move)
        won = any(board[a] == board[b] == board[c] == mark for a, b, c in _TTT_LINES_AT[move])
        other = "player_1" if agent == "player_0" else "player_0"
        if won:
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self._finish()
        elif len(self.moves) == 9:
            self._finish()
        else:
            self.agent_selection = other

    def _grid(self) -> str:
        b = self.board
        return "\n".join(" ".join(_MARKS[b[r * 3 + c]] if b[r * 3 + c] else str(r * 3 + c)
                                  for c in range(3)) for r in range(3))

    def _observe(self, agent: str) -> str:
        mark = _MARKS[self._mark(agent)]
        if self.compact:
            cells = "".join(_MARKS[v] if v else str(i) for i, v in enumerate(self.board))
            return f"{mark}|{cells}"
        return (f"Tic-tac-toe. You play {mark}. Board (digits are empty cells):\n{self._grid()}\n"
                "Reply with the number of an empty cell.")

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"board": tuple(self.board), "mark": self._mark(agent)}

    def state_key(self) -> tuple[Any, ...]:
        """The whole game state, hashable: exact best responses
        (agentrt.tournaments.exploit_games) enumerate the game tree memoised on it."""
        return (tuple(self.board), self.agent_selection)

    def _render(self) -> str:
        return self._grid()


class ConnectFour(MultiAgentEnv):
    """Connect-four on a 6x7 grid: player_0 drops X and moves first; actions are columns 0-6.

    ``observe_struct(agent)`` gives ``{"grid": tuple of rows (top first) of 0/1/2, "mark": 1|2}``.
    """

    metadata = {"render_modes": ["ansi"], "name": "connect_four"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True
    rows, cols = 6, 7

    def _reset(self, options: dict[str, Any]) -> None:
        self.grid = [[0] * self.cols for _ in range(self.rows)]  # row 0 is the top
        self.heights = [0] * self.cols
        self.num_moves = 0
        self.agent_selection = "player_0"

    def _mark(self, agent: str) -> int:
        return 1 if agent == "player_0" else 2

    def _legal(self, agent: str) -> list[str] | None:
        return [str(c) for c in range(self.cols) if self.heights[c] < self.rows]

    def _parse(self, agent: str, text: str) -> int | None:
        col = parse_index(text, self.cols)
        return col if col is not None and self.heights[col] < self.rows else None

    def _apply(self, agent: str, move: int) -> None:
        mark = self._mark(agent)
        row = self.rows - 1 - self.heights[move]
        self.grid[row][move] = mark
        self.heights[move] += 1
        self.num_moves += 1
        other = "player_1" if agent == "player_0" else "player_0"
        if connects_four(self.grid, row, move):
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self._finish()
        elif self.num_moves == self.rows * self.cols:
            self._finish()
        else:
            self.agent_selection = other

    def _picture(self) -> str:
        lines = [" ".join(_MARKS[v] for v in row) for row in self.grid]
        return "\n".join(lines + [" ".join(str(c) for c in range(self.cols))])

    def _observe(self, agent: str) -> str:
        mark = _MARKS[self._mark(agent)]
        return (f"Connect four. You play {mark}; four in a row wins. Grid (top row first):\n"
                f"{self._picture()}\nReply with the number of a column that is not full.")

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"grid": tuple(tuple(r) for r in self.grid), "mark": self._mark(agent)}

    def _render(self) -> str:
        return self._picture()


def connects_four(grid: list[list[int]] | tuple[tuple[int, ...], ...], row: int, col: int) -> bool:
    """Whether the disc at (row, col) is part of four in a row."""
    mark = grid[row][col]
    rows, cols = len(grid), len(grid[0])
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < rows and 0 <= c < cols and grid[r][c] == mark:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False
