"""Prompt sources: where the examples of ``agentrt train`` come from.

A source hands the train workload :class:`~agentrt.envs.tasks.Example` objects (prompt, answer,
info) and checkpoints its position; the episode spec carries each example to the ``Task-v0`` env,
which never reads a file. Sources are picked by ``task.name``:

- a built-in task (``arithmetic``, ``sort``: :data:`agentrt.envs.tasks.TASKS`): :class:`TaskSource`,
  generated in memory from ``task.seed``;
- ``dataset``: :class:`FileSource`, a JSONL, Parquet or ``datasets`` file streamed in bounded
  memory with a column mapping (:class:`~agentrt.workloads.prompts.data.config.DatasetOptions`);
- ``redis``: :class:`agentrt.workloads.prompts.data.redis_stream.RedisSource`, prompts pushed to a Redis stream.

Extra columns reach the reward in ``info`` under their own names (``info["answer"]`` is the
answer column); :func:`keyword_reward` adapts a reward written as ``fn(prompt, response,
**columns)``.
"""

from __future__ import annotations

import copy
import functools
import itertools
import random
from pathlib import Path
from typing import Any, Callable, Protocol

from agentrt.workloads.prompts.data.config import DatasetOptions, resolved_format
from agentrt.workloads.prompts.data.readers import JsonlReader, open_reader
from agentrt.workloads.prompts.data.stream import Row, ShuffledRows, SkipCounter, hashed_out, row_key, scan
from agentrt.core.errors import AgentrtError, ConfigError
from agentrt.envs.tasks import Example, make_splits
from agentrt.policies.chat import Chat

HEAD_LINES = 1000  # JSONL lines a column check looks at


class PromptDataError(AgentrtError):
    """The prompt data cannot be used at all (rows that are merely malformed are skipped)."""


class PromptSource(Protocol):
    """What the train workload draws its examples from."""

    def start(self, tokenizer: Any, chat: Chat | None = None) -> None:
        """Called once the policy's tokenizer exists: with ``chat`` (the policy's chat
        template, :mod:`agentrt.policies.chat`) every prompt is rendered through it."""

    def next(self, n: int) -> list[Example]:
        """The next ``n`` training examples."""

    def eval_examples(self) -> list[Example]:
        """The held-out examples (never among the training ones)."""

    def demonstrations(self, seed: int) -> Any:
        """An object whose ``next(n)`` draws SFT demonstrations (examples with answers)."""

    def metrics(self) -> dict[str, float]:
        """``data/...`` metrics of the rows read so far."""

    def finished(self, trajectories: list[Any], step: int) -> None:
        """This step's played episodes (a stream source sends them on)."""

    def checkpointed(self, step: int, oldest: int) -> None:
        """The checkpoint of ``step`` is written and the run folder keeps none older than
        ``oldest`` (what that one holds need not be delivered again)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class PromptSampler:
    """Epoch-wise shuffled pass over a list (prompts or data rows); its position is
    checkpointed."""

    def __init__(self, items: list[Any], seed: int) -> None:
        self.items = items
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.items)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.items[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


class SourceBase:
    """Defaults of a source: prompts as they come (until :meth:`start` gives a chat template),
    nothing to send on, acknowledge or close."""

    chat: Chat | None = None
    owner = ""  # the run folder reading it (a stream records its acknowledgements under it)

    def start(self, tokenizer: Any, chat: Chat | None = None) -> None:
        self.chat = chat

    def prompt(self, row: Row) -> str:
        """The prompt text of a data row (:func:`row_prompt`)."""
        return row_prompt(self.chat, row)

    def finished(self, trajectories: list[Any], step: int) -> None:
        return None

    def checkpointed(self, step: int, oldest: int) -> None:
        return None

    def close(self) -> None:
        return None


class TaskSource(SourceBase):
    """A built-in task's generated prompts (``agentrt.envs.tasks``), held in memory."""

    def __init__(self, task: Any, seed: int) -> None:
        self.train, self.eval = make_splits(task.name, task.options, task.train_size,
                                            task.eval_size, task.seed)
        self.sampler = PromptSampler(self.train, seed)

    def start(self, tokenizer: Any, chat: Chat | None = None) -> None:
        """With a chat template, each prompt becomes a user message rendered through it."""
        if chat is not None and self.chat is None:
            for examples in (self.train, self.eval):
                examples[:] = [Example(chat_prompt(chat, ex.prompt), ex.answer, ex.info)
                               for ex in examples]
        self.chat = chat

    def next(self, n: int) -> list[Example]:
        return self.sampler.next(n)

    def eval_examples(self) -> list[Example]:
        return self.eval

    def demonstrations(self, seed: int) -> PromptSampler:
        return PromptSampler(self.train, seed)

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def render_messages(chat: Chat | None, messages: list[dict[str, str]]) -> str:
    """A chat as prompt text: the policy's chat template with the generation prompt (its
    ``system:`` first when the chat has no system message), or, without a template (the
    project's small models), one ``"{role}: {content}"`` line per message, then
    ``"assistant:"``."""
    if chat is not None:
        return chat.text(messages)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def chat_prompt(chat: Chat | None, prompt: str) -> str:
    """A plain prompt as prompt text: one user message through the chat template, or as it is
    without one."""
    return prompt if chat is None else chat.text([{"role": "user", "content": prompt}])


def row_prompt(chat: Chat | None, row: Row) -> str:
    """The prompt text of a data row: its ``messages`` or its ``prompt`` through the chat
    template (the plain prompt, or the messages as lines, without one)."""
    if "messages" in row:
        return render_messages(chat, row["messages"])
    return chat_prompt(chat, row["prompt"])


class FileSource(SourceBase):
    """``task: {name: dataset}``: examples streamed from a JSONL, Parquet or datasets file.

    Memory is bounded by ``shuffle_buffer`` rows and one block of the file, whatever its size;
    the eval split (``task.eval_size`` rows) is read once, at construction. Rows with a missing
    value or a wrong type are skipped and counted (``data/skipped_rows``), one warning line.
    """

    options_model = DatasetOptions

    @staticmethod
    def check(opts: DatasetOptions) -> None:
        """Every mapped column is in the file (raises ConfigError naming the field)."""
        check_columns(opts)

    def __init__(self, task: Any, seed: int) -> None:
        self.opts = opts = DatasetOptions(**task.options)
        check_columns(opts)
        self.seed, self.eval_size = seed, task.eval_size
        self._eval_rows, self.held_out = self._eval_split()
        self.stream = self._stream(seed)

    def _reader(self, path: str) -> Any:
        o = self.opts
        fmt = resolved_format(path, o.format if path == o.path else "auto")
        return open_reader(path, fmt, o.split, list(o.columns.names().values()))

    def _stream(self, seed: int, warn: bool = True) -> ShuffledRows:
        return ShuffledRows(self._reader(self.opts.path), self.opts.columns, seed,
                            self.opts.shuffle_buffer, self.held_out, self.opts.path, warn)

    def _eval_split(self) -> tuple[list[Row], Callable[[Row], bool]]:
        """(held-out rows, the test that keeps a training row out of the eval split)."""
        split, cols, n = self.opts.eval, self.opts.columns, self.eval_size
        where = split.path or self.opts.path
        # the training stream warns about the file's bad rows; an eval file's are said here
        rows = scan(self._reader(where), cols, SkipCounter(where, warn=split.path is not None))
        if split.fraction is not None:
            fraction = split.fraction
            picked = list(itertools.islice((r for r in rows if hashed_out(row_key(r), fraction)),
                                           n))
            return picked, lambda row: hashed_out(row_key(row), fraction)
        picked = list(itertools.islice(rows, n))
        keys = {row_key(r) for r in picked}
        return picked, lambda row: row_key(row) in keys

    def example(self, row: Row) -> Example:
        """A row as an example (a chat rendered to prompt text)."""
        return Example(self.prompt(row), row["answer"] or "", dict(row["info"]))

    def next(self, n: int) -> list[Example]:
        try:
            return [self.example(self.stream.next()) for _ in range(n)]
        except LookupError:
            s = self.stream
            raise PromptDataError(
                f"task.options.path {self.opts.path!r} has no usable training rows (read "
                f"{s.read}, skipped {s.skipped.total}, the rest held out for eval)") from None

    def eval_examples(self) -> list[Example]:
        return [self.example(r) for r in self._eval_rows]

    def demonstrations(self, seed: int) -> FileSource:
        """Another pass over the file (its own order) for SFT, leaving this one's position."""
        other = copy.copy(self)
        other.stream = self._stream(seed, warn=False)
        return other

    def metrics(self) -> dict[str, float]:
        s = self.stream
        return {"data/skipped_rows": float(s.skipped.total), "data/rows_read": float(s.read),
                "data/epoch": float(s.epoch)}

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


def check_columns(opts: DatasetOptions) -> None:
    """Every mapped column is in the file (and in the eval file).

    Raises:
        ConfigError: ``task.options.columns.<field>: column 'x' is not in <file>; its columns:
            ...`` (a JSONL file: in none of its first 1000 lines' objects).
    """
    files = [opts.path] + ([opts.eval.path] if opts.eval.path else [])
    for path in files:
        fmt = resolved_format(path, opts.format if path == opts.path else "auto")
        reader = open_reader(path, fmt, opts.split)
        names = reader.columns()
        if names is None:
            found: dict[str, None] = {}  # in the order they appear
            for raw in JsonlReader(Path(path)).head(HEAD_LINES):
                found |= dict.fromkeys(raw) if isinstance(raw, dict) else {}
            names, where = list(found), f"any JSON object of the first {HEAD_LINES} lines"
        else:
            where = "its columns"
        for field, column in opts.columns.names().items():
            if column not in names:
                shown = ", ".join(map(repr, names[:20])) or "none"
                raise ConfigError(f"task.options.columns.{field}: column {column!r} is not in "
                                  f"{path!r} ({where}: {shown})")


def keyword_reward(fn: Callable[..., float]) -> Callable[[str, str, dict[str, Any]], float]:
    """Adapts ``fn(prompt, response, **columns)`` to the reward contract ``(prompt, response,
    info)``: the example's info (its answer and extra columns) become keyword arguments."""

    @functools.wraps(fn)
    def reward(prompt: str, response: str, info: dict[str, Any]) -> float:
        return fn(prompt, response, **info)

    return reward
