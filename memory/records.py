"""Memory records, query hits and metadata filters.

A record is one remembered item: its text, the policy that wrote it, the episode and env it came
from, free-form tags, a visibility (``private``: only its writer may read it; ``shared``: every
policy may) and a wall-clock time in Unix seconds. Its embedding lives beside it in the bank.
"""

from __future__ import annotations

import math
import time as _time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from agentrt.memory.errors import FilterError, InvalidRecordError

Visibility = Literal["private", "shared"]
VISIBILITIES = ("private", "shared")

# Filter field -> what it matches. Equality fields take a value or a list of values (any of them).
EQUALITY_FIELDS = ("id", "policy_id", "episode_id", "env", "visibility")
FILTER_FIELDS = (*EQUALITY_FIELDS, "tags", "since", "until")


@dataclass(frozen=True)
class Record:
    """One stored memory.

    Attributes:
        id: Unique id (hex string); writing the same id twice is refused.
        text: The remembered text, non-empty.
        policy_id: Policy that wrote it; it alone may read it when ``visibility`` is private.
        episode_id: Episode it came from ("" when none).
        env: Environment name ("" when none).
        tags: Free-form labels, e.g. ("outcome",), ("fact", "opponent:bob").
        visibility: "private" or "shared".
        time: Unix time in seconds when it was written.
    """

    id: str
    text: str
    policy_id: str
    episode_id: str = ""
    env: str = ""
    tags: tuple[str, ...] = ()
    visibility: Visibility = "shared"
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tags"] = list(self.tags)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        return cls(**{**data, "tags": tuple(data.get("tags", ()))})


@dataclass(frozen=True)
class Hit:
    """A query result: the record and its cosine similarity to the query (in [-1, 1])."""

    record: Record
    score: float

    @property
    def id(self) -> str:
        return self.record.id


def make_record(
    text: str,
    *,
    policy_id: str,
    episode_id: str = "",
    env: str = "",
    tags: tuple[str, ...] | list[str] = (),
    visibility: str = "shared",
    time: float | None = None,
    id: str | None = None,
) -> Record:
    """Validates the fields and builds a :class:`Record` (new uuid id, current time by default).

    Raises:
        InvalidRecordError: empty text or policy id, unknown visibility, non-string tags.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidRecordError("memory record text is empty; write a non-empty string")
    if not isinstance(policy_id, str) or not policy_id:
        raise InvalidRecordError("memory record needs a non-empty policy_id naming its writer")
    if visibility not in VISIBILITIES:
        raise InvalidRecordError(
            f"memory record visibility {visibility!r} is unknown; use 'private' or 'shared'"
        )
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise InvalidRecordError("memory record tags must be a list of strings")
    when = _time.time() if time is None else float(time)
    if not math.isfinite(when):
        raise InvalidRecordError(f"memory record time must be a finite Unix time (got {time!r})")
    return Record(
        id=id or uuid.uuid4().hex, text=text, policy_id=policy_id, episode_id=str(episode_id),
        env=str(env), tags=tuple(tags), visibility=visibility, time=when,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Filter:
    """A validated metadata filter: all given conditions must hold.

    Equality fields (``id``, ``policy_id``, ``episode_id``, ``env``, ``visibility``) take one value
    or a list (any of them); ``tags`` takes a list the record must all carry; ``since``/``until``
    bound ``time`` (inclusive, Unix seconds); ``reader`` hides other policies' private records.
    """

    equals: dict[str, frozenset[str]] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    since: float | None = None
    until: float | None = None
    reader: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.equals or self.tags or self.reader is not None
                    or self.since is not None or self.until is not None)

    def matches(self, rec: Record) -> bool:
        for name, allowed in self.equals.items():
            if getattr(rec, name) not in allowed:
                return False
        if self.tags and not self.tags.issubset(rec.tags):
            return False
        if self.since is not None and rec.time < self.since:
            return False
        if self.until is not None and rec.time > self.until:
            return False
        if self.reader is not None and rec.visibility == "private" and rec.policy_id != self.reader:
            return False
        return True


def parse_filter(filters: Mapping[str, Any] | None, reader: str | None = None) -> Filter:
    """Checks a user filter dict and returns a :class:`Filter`.

    Raises:
        FilterError: an unknown field, or a value of the wrong type.
    """
    filters = dict(filters or {})
    unknown = sorted(set(filters) - set(FILTER_FIELDS))
    if unknown:
        raise FilterError(
            f"unknown memory filter field {unknown[0]!r}; valid fields: {', '.join(FILTER_FIELDS)}"
        )
    equals: dict[str, frozenset[str]] = {}
    for name in EQUALITY_FIELDS:
        if name in filters:
            value = filters[name]
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, (list, tuple, set, frozenset)) or not all(
                isinstance(v, str) for v in values
            ):
                raise FilterError(f"memory filter {name!r} takes a string or a list of strings")
            equals[name] = frozenset(values)
    tags = filters.get("tags", ())
    if isinstance(tags, str):
        tags = (tags,)
    if not all(isinstance(t, str) for t in tags):
        raise FilterError("memory filter 'tags' takes a string or a list of strings")
    bounds = {}
    for name in ("since", "until"):
        value = filters.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise FilterError(f"memory filter {name!r} takes a Unix time in seconds")
        bounds[name] = None if value is None else float(value)
    return Filter(equals=equals, tags=frozenset(tags), reader=reader, **bounds)
