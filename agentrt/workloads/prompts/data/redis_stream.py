"""``task: {name: redis}``: prompts pushed to a Redis stream, each trained on exactly once.

The trainer reads the stream through a consumer group. An entry is one row: its fields
(``XADD prompts * prompt "2+3=" answer 5``) or a ``json`` field holding the row as JSON, mapped
by ``columns`` like a file's rows (bad rows are skipped and counted).

Exactly once, across kills and damaged checkpoints: an entry is acknowledged (``XACK``), in one
MULTI/EXEC transaction with its finished episode (``XADD`` to ``episodes_stream``, when set),
only once every checkpoint the run folder keeps has trained on it, so that whichever of them a
resume falls back to (the newest one that verifies) needs it no more. Each checkpoint lists the
entries it trained on that are not acknowledged yet. A resumed run skips those that are still
pending (that checkpoint trained on them; they are acknowledged later) and reads the other
pending entries again, in the order they were first read: the steps after the checkpoint, which
the resume replays. A group listed by the checkpoint but no longer pending had its transaction
run, episodes included. At the end of a run everything is acknowledged. Each transaction also
records (beside the stream) the last step it acknowledged for this run folder, so a resume from
a checkpoint before it (the final checkpoint damaged after the run ended) refuses in one line
naming the steps whose prompts are gone, where it would wait for prompts that never come.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import Field

from agentrt.workloads.prompts.data.config import Columns
from agentrt.workloads.prompts.data.sources import PromptDataError, SourceBase
from agentrt.workloads.prompts.data.stream import SkipCounter, map_row
from agentrt.core.urls import redact
from agentrt.memory.config import RedisConfig
from agentrt.core.schema import ConfigModel
from agentrt.envs.tasks import Example


class RedisStreamOptions(ConfigModel):
    """Options of ``task: {name: redis}``."""

    redis: RedisConfig = Field(description="The Redis server (url, password_env, TLS, ...).")
    stream: str = Field("agentrt:prompts", min_length=1, description="Stream of prompt rows.")
    group: str = Field("agentrt", min_length=1, description="Consumer group of the trainer.")
    consumer: str = Field("trainer", min_length=1, description="Consumer name in the group.")
    columns: Columns = Field(default_factory=Columns)
    episodes_stream: str | None = Field(
        None, min_length=1, description="Stream the finished episodes are added to (prompt id, "
        "step, prompt, response, reward), once their step is checkpointed; None: none.")
    wait_s: float = Field(
        600.0, gt=0.0, description="Stop with an error when no prompt arrives for this long.")


class RedisSource(SourceBase):
    """Prompts of a Redis stream (see the module docstring). No eval split: eval is skipped."""

    options_model = RedisStreamOptions

    @staticmethod
    def check(opts: RedisStreamOptions) -> None:
        """Redis answers (before any work; raises PromptDataError, one line)."""
        _connect(opts).close()

    def __init__(self, task: Any, seed: int) -> None:
        import redis

        self.opts = o = RedisStreamOptions(**task.options)
        self.where = f"redis stream {o.stream!r} at {redact(o.redis.url)}"
        self._errors = (redis.RedisError, OSError)
        self.client = _connect(o)
        self._call(self._create_group)
        self.skipped = SkipCounter(self.where)
        self.fresh: list[str] = []  # entries read since the last checkpoint
        self.outbox: list[dict[str, Any]] = []  # their finished episodes, for episodes_stream
        # entries and episodes of each checkpoint (its step), not acknowledged yet, oldest first
        self.held: list[dict[str, Any]] = []
        self.skip: set[str] = set()  # pending entries that the loaded checkpoint trained on
        self.drawn: list[tuple[str, Example]] = []  # this step's (entry id, example)
        self.pending_from: str | None = "0"  # read our pending entries after this id first
        self.step = 0  # the last step whose episodes finished
        self.owner = ""  # the run folder (PromptWorkload.start): whose acknowledgements
        self.read = 0

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._errors as exc:
            raise PromptDataError(f"{self.where}: {type(exc).__name__}: {exc}; the last "
                                  "checkpoint is resumable once Redis is back") from None

    def _create_group(self) -> None:
        import redis

        try:
            self.client.xgroup_create(self.opts.stream, self.opts.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ------------------------------------------------------------------ reading
    def _read(self, count: int, block_ms: int | None) -> list[tuple[str, dict]]:
        o = self.opts
        start = self.pending_from if self.pending_from is not None else ">"
        got = self._call(self.client.xreadgroup, o.group, o.consumer, {o.stream: start}, count,
                         block_ms)
        entries = [(i.decode(), f) for i, f in (got[0][1] if got else [])]
        if self.pending_from is not None:
            if entries:
                self.pending_from = entries[-1][0]
            else:
                self.pending_from = None  # the backlog is done: new entries from now on
        return entries

    def next(self, n: int) -> list[Example]:
        self.drawn = []
        waited_since = time.monotonic()
        while len(self.drawn) < n:
            backlog = self.pending_from is not None
            entries = self._read(n - len(self.drawn), None if backlog else 1000)
            if entries:
                waited_since = time.monotonic()
            elif not backlog and time.monotonic() - waited_since > self.opts.wait_s:
                raise PromptDataError(f"{self.where}: no prompt arrived in {self.opts.wait_s:g} "
                                      "s (task.options.wait_s); the last checkpoint is "
                                      "resumable")
            for entry_id, fields in entries:
                if entry_id in self.skip:  # the loaded checkpoint trained on it
                    continue
                self.fresh.append(entry_id)
                self.read += 1
                row = map_row(_row(fields), self.opts.columns)
                if isinstance(row, str):
                    self.skipped(row)
                    continue
                self.drawn.append((entry_id, Example(self.prompt(row), row["answer"] or "",
                                                     dict(row["info"]))))
        return [ex for _, ex in self.drawn]

    def eval_examples(self) -> list[Example]:
        return []

    def demonstrations(self, seed: int) -> Any:
        raise PromptDataError("sft.steps needs demonstrations from a task or a file; a Redis "
                              "stream gives none (set sft.steps: 0)")

    def finished(self, trajectories: list[Any], step: int) -> None:
        """This step's episodes, sent to ``episodes_stream`` when their entries are
        acknowledged."""
        self.step = step
        if self.opts.episodes_stream is None:
            return
        for traj in trajectories:
            index = int(traj.group_id.task.removeprefix("ex"))  # PromptWorkload.specs' "ex<i>"
            entry_id, ex = self.drawn[index]
            self.outbox.append({"prompt_id": entry_id, "step": step, "prompt": ex.prompt,
                                "response": traj.turns[0].info.get("action", ""),
                                "reward": float(traj.reward)})

    def metrics(self) -> dict[str, float]:
        return {"data/stream_prompts": float(len(self.drawn)),
                "data/skipped_rows": float(self.skipped.total), "data/rows_read": float(self.read)}

    # ------------------------------------------------------------------ exactly once
    def checkpointed(self, step: int, oldest: int) -> None:
        """The checkpoint of ``step`` holds what was read since the one before; the run folder
        keeps none older than ``oldest``: what those hold is acknowledged."""
        self.held.append({"step": step, "ids": self.fresh, "episodes": self.outbox})
        self.fresh, self.outbox = [], []
        due = [group for group in self.held if group["step"] <= oldest]
        self._commit([i for g in due for i in g["ids"]], [e for g in due for e in g["episodes"]],
                     max((g["step"] for g in due), default=-1))
        self.held = self.held[len(due):]
        self.skip -= {i for g in due for i in g["ids"]}

    def _commit(self, ids: list[str], episodes: list[dict[str, Any]], through: int) -> None:
        """Episodes added, entries acknowledged and the step they run through recorded, all or
        nothing (MULTI/EXEC)."""
        if not ids:
            return
        o = self.opts
        pipe = self.client.pipeline(transaction=True)
        for ep in episodes:
            pipe.xadd(o.episodes_stream, {"json": json.dumps(ep)})
        pipe.xack(o.stream, o.group, *ids)
        pipe.set(self._marker, json.dumps({"run": self.owner, "step": through}))
        self._call(pipe.execute)

    @property
    def _marker(self) -> str:
        o = self.opts
        return f"{o.stream}:agentrt-acked:{o.group}:{o.consumer}"

    def state_dict(self) -> dict[str, Any]:
        """Taken as the checkpoint of the last finished step is written: every group it
        trained on that is not acknowledged, this step's (read since the last one) included."""
        mine = {"step": self.step, "ids": list(self.fresh), "episodes": list(self.outbox)}
        return {"held": [*self.held, mine], "read": self.read, "step": self.step,
                "skipped": dict(self.skipped.reasons)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keeps the checkpoint's groups still pending (trained on, to be acknowledged; a group
        no longer pending had its transaction run), then reads the other pending entries
        again, from the first."""
        held = state.get("held")
        if held is None:  # a checkpoint of agentrt before held groups: one transaction
            held = [{"step": -1, "ids": state["unacked"], "episodes": state["outbox"]}]
        o = self.opts
        step = int(state.get("step", max((g["step"] for g in held), default=0)))
        marker = self._call(self.client.get, self._marker)
        acked = json.loads(marker) if marker else {}
        if acked.get("run") == self.owner and int(acked.get("step", -1)) > step:
            raise PromptDataError(
                f"{self.where}: the prompts of steps {step + 1}-{acked['step']} were "
                f"acknowledged after a later checkpoint, which is gone; resuming from step "
                f"{step} would not train them again. Restore that checkpoint, or start over "
                "(--new-run) with another task.options.consumer")
        self.held = [group for group in held if group["ids"] and self._call(
            self.client.xpending_range, o.stream, o.group, group["ids"][0], group["ids"][0], 1)]
        self.skip = {i for group in self.held for i in group["ids"]}
        self.read = state["read"]
        self.skipped.reasons.update(state["skipped"])
        self.fresh, self.outbox, self.pending_from = [], [], "0"

    def close(self) -> None:
        self.client.close()


def _connect(opts: RedisStreamOptions) -> Any:
    """A client that has answered PING (the memory banks' connection rules)."""
    from agentrt.memory.errors import BackendUnavailableError
    from agentrt.memory.redis_bank import connect

    try:
        return connect(opts.redis)
    except BackendUnavailableError as exc:
        raise PromptDataError(str(exc).replace("memory.redis.", "task.options.redis.")) from None


def _row(fields: dict[bytes, bytes] | None) -> Any:
    """A stream entry as a row: its ``json`` field parsed, or its fields as text."""
    if not fields:
        return None  # deleted while pending
    row = {k.decode(): v.decode() for k, v in fields.items()}
    if set(row) == {"json"}:
        try:
            return json.loads(row["json"])
        except json.JSONDecodeError:
            return None
    return row
