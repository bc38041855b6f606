"""Match records in SQLite (``<run_dir>/matches.sqlite``): who played, seats, versions, outcome,
length, invalid moves, env, match id, step and time.

Inserts are idempotent: the match id is the primary key and a match already stored is never
stored or counted again, so a resumed run that re-issues the same match ids (schedulers are
deterministic) cannot double-count. Each batch is written in one transaction, so a crash leaves
either the whole batch or none of it. Two ways to resume, depending on the run:

- **training runs** (the matches' trajectories are needed again): on resume call
  :meth:`MatchStore.truncate_after` with the checkpoint's step, so the store agrees with the
  restored ratings and scheduler, then replay;
- **rating-only runs** (``tournament eval``): keep everything and skip matches whose id
  :meth:`MatchStore.get` already returns, feeding the stored results to the ratings instead.

Schema: ``matches`` (one row per match) and ``seats`` (one row per seat); see ``_SCHEMA``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from agentrt.tournaments.types import Match, MatchResult, Player, TournamentError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS matches (
    match_id TEXT PRIMARY KEY,      -- scheduler-issued, deterministic
    env TEXT NOT NULL,
    step INTEGER NOT NULL,          -- training step the match was played at
    round INTEGER NOT NULL,
    time REAL NOT NULL,             -- unix seconds when recorded
    length INTEGER NOT NULL,        -- turns, all seats together
    info TEXT NOT NULL              -- JSON
);
CREATE TABLE IF NOT EXISTS seats (
    match_id TEXT NOT NULL REFERENCES matches(match_id) ON DELETE CASCADE,
    seat INTEGER NOT NULL,
    player_key TEXT NOT NULL,       -- rating identity: 'lm', 'lm@3', 'random'
    policy_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    learning INTEGER NOT NULL,
    snapshot INTEGER NOT NULL,
    score REAL NOT NULL,            -- 1 win, 0.5 draw, 0 loss
    invalid_moves INTEGER NOT NULL,
    PRIMARY KEY (match_id, seat)
);
CREATE INDEX IF NOT EXISTS seats_by_key ON seats(player_key);
CREATE INDEX IF NOT EXISTS matches_by_step ON matches(step);
"""


def _check_header(path: Path) -> None:
    """Raises sqlite3.DatabaseError unless ``path`` starts with an SQLite header and, with no
    write-ahead log to supply pages, holds as many pages as the header says."""
    with open(path, "rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        raise sqlite3.DatabaseError("not an SQLite database (no SQLite header)")
    page = int.from_bytes(head[16:18], "big")
    expected = (65536 if page == 1 else page) * int.from_bytes(head[28:32], "big")
    wal = path.with_name(path.name + "-wal")
    size = path.stat().st_size
    if size < expected and not (wal.is_file() and wal.stat().st_size > 0):
        raise sqlite3.DatabaseError(f"truncated: {size} of {expected} bytes")


class MatchStore:
    """SQLite store of match records.

    Args:
        path: The database file, or a run folder (then ``<folder>/matches.sqlite``).
        readonly: Open an existing database without writing to it (reports).

    Raises:
        TournamentError: an existing file is not an intact match database (one line).
    """

    FILENAME = "matches.sqlite"

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        path = Path(path)
        if path.is_dir() or not path.suffix:
            if not readonly:
                path.mkdir(parents=True, exist_ok=True)
            path = path / self.FILENAME
        self.path = path
        existed = path.is_file() and path.stat().st_size > 0
        try:
            if existed:
                _check_header(path)  # before SQLite opens it (and makes -wal/-shm files)
            if readonly:
                self._conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                             isolation_level=None)
            else:
                self._conn = sqlite3.connect(str(path), isolation_level=None)  # transactions
            if existed:  # another file, or a damaged one: refused before anything is written
                self._check()
            if not readonly:
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA foreign_keys=ON")
                self._conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            if hasattr(self, "_conn"):
                self._conn.close()
            raise TournamentError(f"{path} cannot be read as a match database ({exc}); move "
                                  "it away, or pass --new-run to start the run over") from None

    def _check(self) -> None:
        """The open database passes SQLite's quick check and has the match tables."""
        ok = self._conn.execute("PRAGMA quick_check").fetchone()
        if not ok or ok[0] != "ok":
            raise sqlite3.DatabaseError(f"integrity check: {ok[0] if ok else 'no answer'}")
        tables = {n for (n,) in self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"matches", "seats"} <= tables:
            raise sqlite3.DatabaseError("no matches and seats tables")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MatchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes --------------------------------------------------------------------------
    def add(self, results: Sequence[MatchResult], step: int, now: float | None = None) -> int:
        """Stores results in one transaction; matches already stored are left untouched.

        Args:
            results: Results of played matches.
            step: Training step they belong to.
            now: Record time in unix seconds (default: the current time).

        Returns:
            How many results were new.
        """
        stamp = time.time() if now is None else now
        added = 0
        with self._transaction() as cur:
            for r in results:
                m = r.match
                cur.execute(
                    "INSERT OR IGNORE INTO matches VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (m.match_id, m.env, step, m.round, stamp, r.length, json.dumps(r.info)),
                )
                if cur.rowcount == 0:
                    continue
                added += 1
                cur.executemany(
                    "INSERT INTO seats VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(m.match_id, i, p.key, p.policy_id, p.version, int(p.learning),
                      int(p.snapshot), float(r.scores[i]), int(r.invalid_moves[i]))
                     for i, p in enumerate(m.players)],
                )
        return added

    def truncate_after(self, step: int) -> int:
        """Deletes matches recorded at steps > ``step`` (resume from a checkpoint at ``step``).

        Returns:
            How many matches were deleted.
        """
        with self._transaction() as cur:
            cur.execute("DELETE FROM matches WHERE step > ?", (step,))
            return cur.rowcount

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    # ---- reads ---------------------------------------------------------------------------
    def count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM matches").fetchone()[0])

    @classmethod
    def count_through(cls, run_dir: str | Path, step: int) -> int:
        """Matches recorded at steps <= ``step`` in ``run_dir``'s database (0 when there is
        none), read without writing anything: not even SQLite's side files where no
        write-ahead log holds pages (``immutable``).

        Raises:
            TournamentError: the file cannot be read as a match database.
        """
        path = Path(run_dir) / cls.FILENAME
        if not path.is_file():
            return 0
        wal = path.with_name(path.name + "-wal").is_file()
        uri = f"{path.resolve().as_uri()}?mode=ro{'' if wal else '&immutable=1'}"
        try:
            _check_header(path)
            with closing(sqlite3.connect(uri, uri=True)) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM matches WHERE step <= ?",
                                        (step,)).fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise TournamentError(f"{path} cannot be read as a match database ({exc}); move "
                                  "it away, or pass --new-run to start the run over") from None

    def match_ids(self) -> set[str]:
        return {row[0] for row in self._conn.execute("SELECT match_id FROM matches")}

    def get(self, match_ids: Iterable[str]) -> dict[str, MatchResult]:
        """Stored results among ``match_ids`` (missing ids are absent from the dict)."""
        ids = list(match_ids)
        out: dict[str, MatchResult] = {}
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            where = f"m.match_id IN ({','.join('?' * len(part))})"
            out.update((r.match.match_id, r) for r, _ in self._select(where, part))
        return out

    def steps_of(self, match_ids: Iterable[str]) -> dict[str, int]:
        """Step at which each stored match among ``match_ids`` was recorded."""
        ids = list(match_ids)
        out: dict[str, int] = {}
        for chunk in range(0, len(ids), 500):
            part = ids[chunk:chunk + 500]
            marks = ",".join("?" * len(part))
            out.update(self._conn.execute(
                f"SELECT match_id, step FROM matches WHERE match_id IN ({marks})", part))
        return out

    def results(self, env: str | None = None, since_step: int | None = None,
                until_step: int | None = None) -> list[tuple[MatchResult, int]]:
        """All stored results as ``(result, step)``, ordered by step then match id."""
        clauses, args = [], []
        for sql, value in (("m.env = ?", env), ("m.step >= ?", since_step),
                           ("m.step <= ?", until_step)):
            if value is not None:
                clauses.append(sql)
                args.append(value)
        return list(self._select(" AND ".join(clauses) or "1", args))

    def _select(self, where: str, args: Sequence[Any]) -> Iterator[tuple[MatchResult, int]]:
        rows = self._conn.execute(
            "SELECT m.match_id, m.env, m.step, m.round, m.length, m.info, s.seat, s.policy_id, "
            "s.version, s.learning, s.snapshot, s.score, s.invalid_moves FROM matches m "
            f"JOIN seats s ON s.match_id = m.match_id WHERE {where} "
            "ORDER BY m.step, m.match_id, s.seat", list(args),
        ).fetchall()
        i = 0
        while i < len(rows):
            mid, env, step, rnd, length, info = rows[i][:6]
            seats = []
            while i < len(rows) and rows[i][0] == mid:
                seats.append(rows[i])
                i += 1
            players = tuple(Player(s[7], int(s[8]), bool(s[9]), bool(s[10])) for s in seats)
            yield MatchResult(Match(mid, env, players, int(rnd)), tuple(s[11] for s in seats),
                              int(length), tuple(int(s[12]) for s in seats),
                              json.loads(info)), int(step)

    def opponent_stats(self, player_key: str, env: str | None = None,
                       since_step: int | None = None) -> dict[str, dict[str, float]]:
        """Per opponent key: games, score rate (draws half), win/draw/loss rates, and this
        player's invalid moves per game. Pairwise: in an N-seat match each of this player's
        seats meets each other seat holding a different identity once."""
        sql = (
            "SELECT o.player_key, COUNT(*), SUM(me.score > o.score), SUM(me.score = o.score), "
            "SUM(me.invalid_moves) FROM seats me JOIN seats o ON o.match_id = me.match_id "
            "AND o.seat != me.seat JOIN matches m ON m.match_id = me.match_id "
            "WHERE me.player_key = ? AND o.player_key != me.player_key"
        )
        args: list[Any] = [player_key]
        if env is not None:
            sql, args = sql + " AND m.env = ?", args + [env]
        if since_step is not None:
            sql, args = sql + " AND m.step >= ?", args + [since_step]
        out = {}
        for opp, games, wins, draws, invalid in self._conn.execute(sql + " GROUP BY o.player_key",
                                                                   args):
            out[opp] = {"games": games, "win_rate": wins / games, "draw_rate": draws / games,
                        "loss_rate": (games - wins - draws) / games,
                        "score": (wins + 0.5 * draws) / games, "invalid_per_game": invalid / games}
        return out

    def seat_outcomes(self, env: str | None = None
                      ) -> dict[tuple[str, str, int], dict[str, float]]:
        """Per (player key, opponent key, the player's seat index): games, win/draw/loss rates,
        score rate (draws half) and the player's invalid moves per game, for every ordered pair
        of identities that met. Pairwise as in :meth:`opponent_stats`."""
        sql = ("SELECT me.player_key, o.player_key, me.seat, COUNT(*), SUM(me.score > o.score), "
               "SUM(me.score = o.score), SUM(me.invalid_moves) FROM seats me JOIN seats o ON "
               "o.match_id = me.match_id AND o.seat != me.seat JOIN matches m ON m.match_id = "
               "me.match_id WHERE o.player_key != me.player_key")
        args: list[Any] = []
        if env is not None:
            sql, args = sql + " AND m.env = ?", [env]
        rows = self._conn.execute(sql + " GROUP BY me.player_key, o.player_key, me.seat", args)
        return {(me, opp, int(seat)): {
            "games": n, "win_rate": w / n, "draw_rate": d / n, "loss_rate": (n - w - d) / n,
            "score": (w + 0.5 * d) / n, "invalid_per_game": inv / n}
            for me, opp, seat, n, w, d, inv in rows}

    def seat_stats(self, env: str | None = None) -> dict[int, dict[str, float]]:
        """Per seat index: games and mean score (first-mover advantage at a glance). Seat
        ``i`` is agent ``i`` of each env; pass ``env`` when envs differ in their seats."""
        sql = ("SELECT s.seat, COUNT(*), AVG(s.score) FROM seats s JOIN matches m "
               "ON m.match_id = s.match_id")
        args: list[Any] = []
        if env is not None:
            sql, args = sql + " WHERE m.env = ?", [env]
        rows = self._conn.execute(sql + " GROUP BY s.seat", args)
        return {int(seat): {"games": n, "score": avg} for seat, n, avg in rows}


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception (nothing half-written)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Cursor:
        self._conn.execute("BEGIN IMMEDIATE")
        self._cur = self._conn.cursor()
        return self._cur

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")
