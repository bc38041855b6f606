"""The episode log: one row per trained turn of every run kind, under a stable id.

The controller loop writes it for every kind (:func:`log_step`, after the workload's
``record``): ``agentrt train``'s one-turn prompt episodes, a league's matches (a row per move of
each learner's seat), a decompose run's chains (a row per plan and subtask attempt).
``<run_dir>/episodes.sqlite`` holds table ``episodes``, one row per turn a step trained on:

- ``id``: ``s<step>-<index>`` (:func:`episode_id`; ``index`` is the episode's position in the
  step's episode list) for a one-turn episode of a one-agent env, else
  ``s<step>-<index>-<agent>-<turn>`` (:func:`step_episodes`), so a resumed run that replays a
  step writes the same ids;
- ``step``, ``idx``, ``policy_id``, ``policy_version`` (the weights that sampled it);
- ``prompt``, ``response`` (decoded texts), ``prompt_ids``, ``response_ids`` (JSON lists);
- ``logprobs``: the rollout's log-probs of the response tokens, as sampled, a BLOB of float64
  little-endian values (``array("d")``; exact, where JSON's decimal text of floats took half the
  time of writing a step's rows); a list that is not all numbers, and rows of logs written
  before, hold JSON text; :meth:`Episode.from_row` reads both;
- ``reward``, ``info`` (the example's info the reward saw, e.g. its answer), ``sampling`` (the
  sampling settings), ``finished`` (stopped on eos), ``group_id`` (the trajectory's group key
  as ``str``; ``GroupKey.parse`` reads it back).

Writes: :meth:`EpisodeLog.append_step` writes a step's rows in one SQLite transaction and drops
the rows of that step and of every later one first. Steps run in order, so the first step a
resumed process writes removes what the killed process wrote after its checkpoint, and a kill
-9 at any moment leaves whole steps (SQLite's journal rolls back a cut transaction). Reads open
the file read-only. Other records (late feedback of the online issue) key on ``id``; a replayed
step replaces its episodes (same ids, new responses), so such a record belongs to the episode
only if it was written after the step's checkpoint.

Size: no bound (``checkpoint.keep`` bounds weights, not this): about 0.6 KB per episode of 8
prompt and 30 response tokens (1.06 KB with the log-probs as JSON text), so 100 steps of 256
episodes take about 16 MB.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from agentrt.core.errors import AgentrtError
from agentrt.envs.registration import is_multi_agent

EPISODES = "episodes.sqlite"
_LISTS = ("prompt_ids", "response_ids")
_DICTS = ("info", "sampling")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY, step INTEGER NOT NULL, idx INTEGER NOT NULL, policy_id TEXT NOT NULL,
    policy_version INTEGER NOT NULL, prompt TEXT NOT NULL, response TEXT NOT NULL,
    prompt_ids TEXT NOT NULL, response_ids TEXT NOT NULL, logprobs BLOB NOT NULL,
    reward REAL NOT NULL, info TEXT NOT NULL, sampling TEXT NOT NULL, finished INTEGER NOT NULL,
    group_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS episodes_step ON episodes (step);
"""


def episode_id(step: int, index: int) -> str:
    """The stable id of the ``index``-th episode of ``step``: ``s<step>-<index>``."""
    return f"s{step}-{index}"


@dataclass
class Episode:
    """One logged episode (see the module docstring for the fields)."""

    id: str
    step: int
    idx: int
    policy_id: str
    policy_version: int
    prompt: str
    response: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float
    info: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    finished: bool = True
    group_id: str = ""

    def row(self, memo: dict[Any, str] | None = None) -> dict[str, Any]:
        """The row's columns as written (lists and dicts as JSON text, log-probs as bytes).
        ``memo``: the JSON of values already written in this batch of rows, filled as it goes
        (a step's groups share their prompt and answer, and its rows one sampling dict)."""
        return dict(zip(_COLUMNS, self.values({} if memo is None else memo)))

    def values(self, memo: dict[Any, str]) -> tuple[Any, ...]:
        """:meth:`row`'s values in column order (without the dict: 256 rows a step)."""
        # shallow: asdict deep-copies every token list, 50 ms of a 256-episode step
        return (self.id, self.step, self.idx, self.policy_id, self.policy_version, self.prompt,
                self.response, _ids_json(self.prompt_ids, memo), _ids_json(self.response_ids),
                _floats_blob(self.logprobs), self.reward, _dict_json(self.info, memo),
                _dict_json(self.sampling, memo), int(self.finished), self.group_id)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Episode:
        data = dict(row)
        for key in (*_LISTS, *_DICTS):
            data[key] = json.loads(data[key])
        lps = data["logprobs"]
        data["logprobs"] = _floats(lps) if isinstance(lps, bytes) else json.loads(lps)
        data["finished"] = bool(data["finished"])
        return cls(**data)


_COLUMNS = tuple(f.name for f in fields(Episode))


def _floats_blob(values: Any) -> bytes | str:
    """``values`` as float64 little-endian bytes; JSON text where they are not all numbers."""
    try:
        return _little_endian(array("d", values)).tobytes()
    except (TypeError, OverflowError):
        return json.dumps(values)


def _floats(blob: bytes) -> list[float]:
    """The list :func:`_floats_blob` wrote as bytes."""
    return _little_endian(array("d", blob)).tolist()


def _little_endian(packed: array) -> array:
    """``packed`` swapped in place between this machine's byte order and little-endian."""
    if sys.byteorder != "little":
        packed.byteswap()
    return packed


def _ids_json(ids: Any, memo: dict[Any, str] | None = None) -> str:
    """``json.dumps(ids)``: a list of ints as ``str`` writes it, at half the cost; ``memo``:
    the text of lists already written, by their ids."""
    if type(ids) is not list or not set(map(type, ids)) <= {int}:
        return json.dumps(ids)
    if memo is None:
        return str(ids)
    key = tuple(ids)
    text = memo.get(key)
    if text is None:
        text = memo[key] = str(ids)
    return text


def _dict_json(value: dict[str, Any], memo: dict[Any, str]) -> str:
    """``json.dumps(value)``, once per object (a step's rows share the sampling dict) and per
    content of dicts of strings (a group's rows have the same answer; other keys and values
    could be equal but written apart, as ``True`` and ``1``)."""
    key: Any = id(value)
    text = memo.get(key)
    if text is None:
        if set(map(type, value)) | set(map(type, value.values())) <= {str}:
            key = ("dict", *value.items())
            text = memo.get(key)
        if text is None:
            text = memo[key] = json.dumps(value)
        memo[id(value)] = text
    return text


class EpisodeLog:
    """``<run_dir>/episodes.sqlite``: append a step's rows, get one by id, iterate.

    Each call opens and closes its own connection (a step's write is one transaction; nothing
    stays open across the loop, a kill, or a fork)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / EPISODES

    def _connect(self, write: bool) -> sqlite3.Connection:
        if write:
            conn = sqlite3.connect(self.path, timeout=30)
            conn.executescript(_SCHEMA)
        else:
            if not self.path.is_file():
                raise AgentrtError(f"{self.path.parent} has no {EPISODES}: the run has not "
                                   "finished a step, or it plays no episodes (offline data)")
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        return conn

    def append_step(self, step: int, episodes: list[Episode]) -> None:
        """Writes ``step``'s episodes in one transaction, replacing the rows of this step and
        of every later step (a resumed run replays them)."""
        conn = None
        try:
            conn = self._connect(write=True)
            with conn:
                conn.execute("DELETE FROM episodes WHERE step >= ?", (step,))
                memo: dict[Any, str] = {}  # alive while its rows are: ids of dicts stay valid
                conn.executemany(
                    f"INSERT INTO episodes ({', '.join(_COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(_COLUMNS))})",
                    [e.values(memo) for e in episodes])
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            if conn is not None:
                conn.close()

    def _damaged(self, exc: sqlite3.DatabaseError) -> AgentrtError:
        return AgentrtError(f"{self.path} is damaged ({exc}); restore it, or move it away and "
                            "resume with --resume force to start a new log")

    def count_through(self, step: int, verify: bool = False) -> int:
        """Rows of steps <= ``step`` (0 without a log), read-only; ``verify`` runs SQLite's
        quick check first (a resume; a checkpoint counts the log it has just written).

        Raises:
            AgentrtError: the file is not a readable episode log (damaged).
        """
        if not self.path.is_file():
            return 0
        # a journal left by a killed write: opened for writing, so SQLite rolls it back
        hot = self.path.with_name(self.path.name + "-journal").is_file()
        conn = sqlite3.connect(self.path, timeout=30) if hot else self._connect(write=False)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone() if verify else ("ok",)
            if not check or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check[0] if check else '-'}")
            return int(conn.execute("SELECT COUNT(*) FROM episodes WHERE step <= ?",
                                    (step,)).fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None
        finally:
            conn.close()

    def get(self, eid: str) -> Episode | None:
        """The episode with id ``eid`` (None: no such episode)."""
        conn = self._connect(write=False)
        try:
            row = conn.execute("SELECT * FROM episodes WHERE id = ?", (eid,)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise AgentrtError(f"{self.path} cannot be read ({exc})") from None
        finally:
            conn.close()
        return None if row is None else Episode.from_row(row)

    def __iter__(self) -> Iterator[Episode]:
        """Every episode, by step then index."""
        yield from self.rows()

    def rows(self, step: int | None = None) -> Iterator[Episode]:
        """The episodes of ``step`` (None: all), by step then index."""
        conn = self._connect(write=False)
        try:
            where, args = ("WHERE step = ?", (step,)) if step is not None else ("", ())
            for row in conn.execute(f"SELECT * FROM episodes {where} ORDER BY step, idx, rowid",
                                    args):
                yield Episode.from_row(row)
        finally:
            conn.close()


def log_step(run_dir: str | Path, step: int, played: Any, policies: Mapping[str, Any],
             tokenizer: Callable[[str], Any]) -> None:
    """Writes the trajectories of one step's :class:`~agentrt.runner.core.RunResult` (its
    trained players') as the rows of ``step`` (:meth:`EpisodeLog.append_step`); nothing when
    there are none (an offline preference step). ``policies``: policy id -> its config (the
    sampling settings logged); ``tokenizer``: policy id -> its tokenizer."""
    if not played.trajectories:
        return
    pids = {turn.policy_id for traj in played.trajectories for turn in traj.turns}
    sampling = {pid: policies[pid.split("@")[0]].rollout.sampling.model_dump(mode="json")
                for pid in pids}
    EpisodeLog(run_dir).append_step(step, step_episodes(
        played, step, sampling, {pid: tokenizer(pid) for pid in pids}))


def step_episodes(played: Any, step: int, sampling: Mapping[str, dict[str, Any]],
                  tokenizers: Mapping[str, Any]) -> list[Episode]:
    """A row per turn of every trajectory of one step's :class:`~agentrt.runner.core.RunResult`,
    ``idx`` the episode's position in the step's episode list and the id
    :func:`episode_id`'s for a one-turn episode of a one-agent env (``agentrt train``'s
    prompts), else ``s<step>-<idx>-<agent>-<turn>`` (a match's moves, a chain's plan and
    subtask attempts; the turn counts from 0). The prompt text is its ids decoded (special tokens left out), the
    response the text the env saw, the info the example's (a deferred reward's
    ``reward_info``, else the env's final info; in a multi-seat or multi-turn episode its plain
    values with the seat's env, agent, turn, result and outcome). ``sampling`` and
    ``tokenizers`` are per policy id."""
    index = {r.episode_id: i for i, r in enumerate(played.episodes)}
    multi = {env: is_multi_agent(env) for env in {t.env for t in played.trajectories}}
    prompts: dict[str, dict[tuple[int, ...], str]] = {}  # a group's rows share their prompt
    out = []
    for traj in played.trajectories:
        i = index[traj.episode_id]
        single = not multi[traj.env] and len(traj.turns) == 1
        info = _final_info(traj.info.get("final_info", {}))
        for k, turn in enumerate(traj.turns):
            pid = turn.policy_id
            decoded, key = prompts.setdefault(pid, {}), tuple(turn.prompt_ids)
            if key not in decoded:
                decoded[key] = tokenizers[pid].decode(turn.prompt_ids, skip_special_tokens=True)
            out.append(Episode(
                id=episode_id(step, i) if single else f"{episode_id(step, i)}-{traj.role}-{k}",
                step=step, idx=i, policy_id=pid, policy_version=turn.policy_version,
                prompt=decoded[key], response=str(turn.info.get("action", "")),
                prompt_ids=list(turn.prompt_ids), response_ids=list(turn.response_ids),
                logprobs=[float(x) for x in turn.logprobs],
                reward=float(traj.reward if single else turn.reward),
                info=info if single else _seat_info(traj, info, k), sampling=sampling[pid],
                finished=bool(turn.finished), group_id=str(traj.group_id)))
    return sorted(out, key=lambda e: e.idx)  # stable: a trajectory's turns stay in order


def _final_info(final: dict[str, Any]) -> dict[str, Any]:
    """What the reward saw: a deferred reward's ``reward_info`` (with the answer), else the
    env's final info without its error keys."""
    info = dict(final["reward_info"]) if isinstance(final.get("reward_info"), dict) else \
        {k: v for k, v in final.items() if k not in ("reward_errors", "invalid_action")}
    if "answer" in final:  # a deferred reward's info: what the reward saw, and the answer
        info.setdefault("answer", final["answer"])
    return info


def _seat_info(traj: Any, info: dict[str, Any], turn: int) -> dict[str, Any]:
    """A multi-turn or multi-seat episode's row info: the final info's plain values (not a
    whole chain's record) and where the turn was played."""
    plain = {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))}
    return plain | {"env": traj.env, "agent": traj.role, "turn": turn, "turns": len(traj.turns),
                    "episode": traj.episode_id, "result": traj.info.get("result"),
                    "outcome": traj.outcome}
