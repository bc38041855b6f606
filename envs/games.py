"""Three small two-player games with perfect information, small enough to solve exactly: Hexapawn
(Gardner, 1962: pawns on a 3x3 board), Connect-Three (three in a row on a 4x4 grid with
gravity) and Notakto (Plambeck, 2010: misère tic-tac-toe in which both players place X).

All follow the turn-based API of :class:`~agentrt.envs.core.MultiAgentEnv` like tic-tac-toe:
"player_0" moves first, the winner gets +1 and the loser -1, a draw 0 to both; both give
``state_key()``, so a perfect player (``kind: perfect``) and the exact best-response measures
(agentrt.tournaments.exploit_games) search their whole trees. Observations are one short line
(own mark, ``|``, the cells row by row with a digit for each empty one), as tic-tac-toe's compact
form: small models trained from scratch read them fastest.
"""

from __future__ import annotations

from typing import Any

from agentrt.envs.board import parse_index
from agentrt.envs.vector import TTT_LINES
from agentrt.envs.core import MultiAgentEnv

_OTHER = {"player_0": "player_1", "player_1": "player_0"}


def _cells(board: list[int], marks: str) -> str:
    return "".join(marks[v] if v else str(i) for i, v in enumerate(board))


def _grid(board: list[int], marks: str, cols: int) -> str:
    """The board drawn row by row, ``cols`` cells a row (the ansi render)."""
    return "\n".join("".join(marks[v] for v in board[r:r + cols])
                     for r in range(0, len(board), cols))


class Hexapawn(MultiAgentEnv):
    """Hexapawn: three pawns a side on a 3x3 board, cells 0-8 row by row. White (player_0, ``W``)
    starts on row 2 (cells 6-8) and moves up, Black (``B``) on row 0 moves down. A pawn steps
    one cell forward onto an empty cell or one cell diagonally forward onto an enemy pawn,
    capturing it. A player wins by reaching the far row, by capturing every enemy pawn, or when
    the opponent cannot move. No draws; with perfect play Black wins.

    An action is the pawn's cell and its target cell as two digits, ``"63"`` (6 to 3); ``"6-3"``
    and ``"6 3"`` are read too. Observation: ``"W|BBB345WWW"``.
    ``observe_struct(agent)`` gives ``{"board": tuple of 9 ints (0 empty, 1 W, 2 B), "mark": 1|2}``.
    """

    metadata = {"render_modes": ["ansi"], "name": "hexapawn"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True
    _MARKS = ".WB"

    def _reset(self, options: dict[str, Any]) -> None:
        self.board = [2, 2, 2, 0, 0, 0, 1, 1, 1]
        self.agent_selection = "player_0"

    @staticmethod
    def moves(board: list[int] | tuple[int, ...], mark: int) -> list[tuple[int, int]]:
        """Every (from, to) move of ``mark`` (1 White moving up, 2 Black moving down)."""
        step = -3 if mark == 1 else 3
        out = []
        for cell, v in enumerate(board):
            if v != mark:
                continue
            to = cell + step
            if not 0 <= to < 9:
                continue
            if board[to] == 0:
                out.append((cell, to))
            col = cell % 3
            for dc in (-1, 1):
                if 0 <= col + dc < 3 and board[to + dc] == 3 - mark:
                    out.append((cell, to + dc))
        return sorted(out)

    def _mark(self, agent: str) -> int:
        return 1 if agent == "player_0" else 2

    def _legal(self, agent: str) -> list[str] | None:
        return [f"{a}{b}" for a, b in self.moves(self.board, self._mark(agent))]

    def _parse(self, agent: str, text: str) -> tuple[int, int] | None:
        core = "".join(text.strip().strip("[]().'\"").replace("-", "").split())
        if len(core) != 2 or not core.isdecimal():
            return None
        move = (int(core[0]), int(core[1]))
        return move if move in self.moves(self.board, self._mark(agent)) else None

    def _apply(self, agent: str, move: tuple[int, int]) -> None:
        mark, other = self._mark(agent), _OTHER[agent]
        src, dst = move
        self.board[src], self.board[dst] = 0, mark
        far_row = dst < 3 if mark == 1 else dst >= 6
        if far_row or 3 - mark not in self.board or not self.moves(self.board, 3 - mark):
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self._finish()
        else:
            self.agent_selection = other

    def _observe(self, agent: str) -> str:
        return f"{self._MARKS[self._mark(agent)]}|{_cells(self.board, self._MARKS)}"

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"board": tuple(self.board), "mark": self._mark(agent)}

    def state_key(self) -> tuple[Any, ...]:
        return (tuple(self.board), self.agent_selection)

    def _render(self) -> str:
        return _grid(self.board, self._MARKS, 3)


def line_through(board: list[int], cols: int, rows: int, cell: int, need: int) -> bool:
    """Whether the mark at ``cell`` is part of ``need`` in a row (any direction)."""
    mark, r0, c0 = board[cell], cell // cols, cell % cols
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = r0 + sign * dr, c0 + sign * dc
            while 0 <= r < rows and 0 <= c < cols and board[r * cols + c] == mark:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= need:
            return True
    return False


class ConnectThree(MultiAgentEnv):
    """Connect-Three: connect-four's rules on a 4x4 grid, three in a row (across, down or
    diagonal) wins; a full grid is a draw. player_0 drops ``X`` and moves first; an action is a
    column 0-3. Cells are numbered 0-15 row by row, top row first.

    Observation: ``"X|..........X.OXO."``: own mark, then the 16 cells, ``.`` for an empty one
    (an action names a column, not a cell, so cells carry no numbers).
    ``observe_struct(agent)`` gives ``{"board": tuple of 16 ints (0 empty, 1 X, 2 O), "mark": 1|2,
    "cols": 4, "rows": 4}``.
    """

    metadata = {"render_modes": ["ansi"], "name": "connect_three"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True
    cols = rows = 4
    need = 3
    _MARKS = ".XO"

    def _reset(self, options: dict[str, Any]) -> None:
        self.board = [0] * (self.cols * self.rows)
        self.agent_selection = "player_0"

    def _mark(self, agent: str) -> int:
        return 1 if agent == "player_0" else 2

    def _landing(self, col: int) -> int | None:
        """The cell a piece dropped in ``col`` lands on, None when the column is full."""
        for row in range(self.rows - 1, -1, -1):
            if self.board[row * self.cols + col] == 0:
                return row * self.cols + col
        return None

    def _legal(self, agent: str) -> list[str] | None:
        return [str(c) for c in range(self.cols) if self.board[c] == 0]

    def _parse(self, agent: str, text: str) -> int | None:
        col = parse_index(text, self.cols)
        return col if col is not None and self.board[col] == 0 else None

    def _apply(self, agent: str, move: int) -> None:
        cell = self._landing(move)
        assert cell is not None  # _parse admits open columns only
        self.board[cell] = self._mark(agent)
        other = _OTHER[agent]
        if line_through(self.board, self.cols, self.rows, cell, self.need):
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self._finish()
        elif all(self.board):
            self._finish()
        else:
            self.agent_selection = other

    def _observe(self, agent: str) -> str:
        cells = "".join(self._MARKS[v] for v in self.board)
        return f"{self._MARKS[self._mark(agent)]}|{cells}"

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"board": tuple(self.board), "mark": self._mark(agent), "cols": self.cols,
                "rows": self.rows}

    def state_key(self) -> tuple[Any, ...]:
        return (tuple(self.board), self.agent_selection)

    def _render(self) -> str:
        return _grid(self.board, self._MARKS, self.cols)


class Notakto(MultiAgentEnv):
    """Notakto on one 3x3 board: both players place an ``X`` on an empty cell (0-8, row by row);
    whoever completes a line of three X (row, column or diagonal) loses. There are no draws
    (at most six X fit without a line) and the first player wins with perfect play (the
    centre, then a knight's move from the opponent's). An impartial game: the move that is best
    depends on the board alone, not on whose turn it is.

    Observation: ``"X|0X234X678"``: the mark both place, then the cells with a digit for each
    empty one, as tic-tac-toe's compact board. ``observe_struct(agent)`` gives
    ``{"board": tuple of 9 ints (0 empty, 1 X)}``.
    """

    metadata = {"render_modes": ["ansi"], "name": "notakto"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True
    _MARKS = ".X"

    def _reset(self, options: dict[str, Any]) -> None:
        self.board = [0] * 9
        self.agent_selection = "player_0"

    def _legal(self, agent: str) -> list[str] | None:
        return [str(i) for i, v in enumerate(self.board) if not v]

    def _parse(self, agent: str, text: str) -> int | None:
        cell = parse_index(text, 9)
        return cell if cell is not None and not self.board[cell] else None

    def _apply(self, agent: str, cell: int) -> None:
        self.board[cell] = 1
        other = _OTHER[agent]
        if any(all(self.board[i] for i in line) for line in TTT_LINES if cell in line):
            self.rewards[agent], self.rewards[other] = -1.0, 1.0
            self._finish()
        else:
            self.agent_selection = other

    def _observe(self, agent: str) -> str:
        return f"X|{_cells(self.board, self._MARKS)}"

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"board": tuple(self.board)}

    def state_key(self) -> tuple[Any, ...]:
        return (tuple(self.board), self.agent_selection)

    def _render(self) -> str:
        return _grid(self.board, self._MARKS, 3)
