"""Reward sources as they appear in a config, and the checks they need before a run starts.

``reward:`` in a train config is one of:

- a name or ``'module:function'`` (the Python reward of :mod:`agentrt.rewards`), as always;
- one source mapping, e.g. ``{model: runs/rm}``;
- a list of sources whose values add up with their weights, e.g.
  ``[{python: exact_match, weight: 0.7}, {http: "http://127.0.0.1:8000/score", weight: 0.3}]``.

A source mapping has exactly one *kind key* (``python``, ``http``, ``model``: the registry
:data:`REWARD_SOURCES`, whose entries are the settings models below) plus that kind's settings,
``weight`` and ``name`` (the metrics prefix ``reward/<name>/``). Nothing here imports torch.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_serializer, field_validator

from agentrt.core.errors import ConfigError
from agentrt.core.registry import Registry
from agentrt.core.schema import ConfigModel
from agentrt.core.urls import redact
from agentrt.rewards.classifier import classifier_labels

if TYPE_CHECKING:
    from agentrt.rewards.executors import RewardExecutor


class RewardSource(ConfigModel):
    """Settings every source has; a kind adds its own key (the reference) and settings."""

    kind: ClassVar[str] = ""
    weight: float = Field(1.0, description="Weight of this source in the weighted sum of sources.")
    name: str | None = Field(
        None, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
        description="Name in metrics (reward/<name>/latency_s ...); default: the function's "
        "name, 'http' or 'model'.")

    @property
    def ref(self) -> str:
        """The kind key's value: a function reference, a URL or a folder."""
        return str(getattr(self, self.kind))

    @property
    def metric_name(self) -> str:
        return self.name or self.kind

    def check(self, field: str) -> None:
        """Checks what the model alone cannot (imports, folders, reachability).

        Raises:
            ConfigError: "<field>.<key>: <what is wrong>; <how to fix it>".
        """

    def build(self, device: str = "cpu", namespace: str = "") -> RewardExecutor:
        """The executor of this source (loads what it needs: a pool, a model)."""
        raise NotImplementedError


REWARD_SOURCES: Registry[type[RewardSource]] = Registry("reward source kind")


def source_kind(kind: str) -> Callable[[type[RewardSource]], type[RewardSource]]:
    """Class decorator registering a :class:`RewardSource` model under its kind key."""
    def wrap(cls: type[RewardSource]) -> type[RewardSource]:
        cls.kind = kind
        REWARD_SOURCES.add(kind, cls)
        return cls

    return wrap


@source_kind("python")
class PythonSource(RewardSource):
    """A Python reward function, optionally called from a pool with a per-call timeout."""

    python: str = Field(..., min_length=1,
                        description="Reward name in agentrt.rewards or 'module:function'.")
    workers: int = Field(1, gt=0, description="Calls at once; above 1 a pool of this many "
                         "threads or processes scores a step's samples.")
    pool: Literal["thread", "process"] = Field(
        "thread", description="'thread' for functions that wait (I/O, sleep, a subprocess); "
        "'process' for CPU-bound Python (the function must be importable by name).")
    timeout_s: float | None = Field(
        None, gt=0.0, description="A call running longer is a failed sample; a stuck process "
        "is killed and replaced, a stuck thread is abandoned. None: no limit.")

    @property
    def metric_name(self) -> str:
        return self.name or self.python.rpartition(":")[2]

    def check(self, field: str) -> None:
        from agentrt.rewards import resolve_reward

        resolve_reward(self.python, f"{field}.python")

    def build(self, device: str = "cpu", namespace: str = "") -> RewardExecutor:
        from agentrt.rewards.executors import PythonExecutor

        return PythonExecutor(self)


@source_kind("http")
class HttpSource(RewardSource):
    """A reward service: batches of samples POSTed as JSON (docs/rewards.md, the contract)."""

    http: str = Field(..., description="URL the batches are POSTed to (http:// or https://).")
    batch_size: int = Field(64, gt=0, description="Samples per request.")
    timeout_s: float = Field(30.0, gt=0.0, description="Timeout of one request.")
    retries: int = Field(8, ge=0, description="Retries of a request that failed to connect, "
                         "timed out or got 429/5xx, with exponential backoff and jitter; then "
                         "its samples are failed (and the run stops per guards).")
    backoff_s: float = Field(0.25, gt=0.0, description="First retry delay; doubles per retry.")
    max_backoff_s: float = Field(8.0, gt=0.0, description="Cap of one retry delay.")
    max_concurrency: int = Field(4, gt=0, description="Requests in flight at once.")
    token_env: str | None = Field(
        None, description="Environment variable holding a bearer token sent as "
        "'Authorization: Bearer ...' (the token itself never goes into a config).")

    @field_serializer("http", when_used="json")
    def _redacted_url(self, url: str) -> str:
        """config.yaml, versions.json and messages show the URL without its credentials."""
        return redact(url)

    @field_validator("http")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("is not an http:// or https:// URL with a host")
        return value

    def check(self, field: str) -> None:
        reachable(self.http, f"{field}.http", min(self.timeout_s, 5.0))

    def build(self, device: str = "cpu", namespace: str = "") -> RewardExecutor:
        from agentrt.rewards.http import HttpExecutor

        return HttpExecutor(self, namespace)


@source_kind("model")
class ModelSource(RewardSource):
    """A learned reward model: a local Hugging Face sequence-classification folder."""

    model: str = Field(..., min_length=1, description="Local folder of an "
                       "AutoModelForSequenceClassification (1 label: its logit is the reward; "
                       "2 labels: the probability of label 1).")
    batch_size: int = Field(64, gt=0, description="Samples per forward pass.")
    max_length: int = Field(512, gt=0, description="Tokens of prompt + response kept (the end).")

    def check(self, field: str) -> None:
        classifier_labels(self.model, f"{field}.model")

    def build(self, device: str = "cpu", namespace: str = "") -> RewardExecutor:
        from agentrt.rewards.model import ModelExecutor

        return ModelExecutor(self, device)


# ----------------------------------------------------------------------------- config values
def parse_reward(value: Any) -> Any:
    """The ``reward:`` config value: a name string as it is, or a list of source models.

    Raises:
        ValueError: naming ``reward.<i>.<key>`` and the fix (pydantic reports it as one line).
    """
    if isinstance(value, str):
        return value
    items = [value] if isinstance(value, (dict, RewardSource)) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError("give a reward name, 'module:function', a source mapping "
                         f"({', '.join(REWARD_SOURCES.names())}) or a non-empty list of them")
    out = [_source(i, item) for i, item in enumerate(items)]
    seen: dict[str, int] = {}
    for i, src in enumerate(out):
        if src.metric_name in seen:
            raise ValueError(f"reward.{i}.name: {src.metric_name!r} is also the name of reward."
                             f"{seen[src.metric_name]}; give each source a distinct name")
        seen[src.metric_name] = i
    return out


def _source(i: int, item: Any) -> RewardSource:
    if isinstance(item, RewardSource):
        return item
    if isinstance(item, str):
        item = {"python": item}
    kinds = ", ".join(REWARD_SOURCES.names())
    if not isinstance(item, dict):
        raise ValueError(f"reward.{i}: a source is a mapping with one of the keys {kinds}")
    found = [k for k in item if k in REWARD_SOURCES]
    if len(found) != 1:
        keys = ", ".join(map(str, item)) or "none"
        what = "unknown reward source kind" if not found else "several source kinds"
        raise ValueError(f"reward.{i}: {what} (keys: {keys}); give exactly one of: {kinds}")
    try:
        return REWARD_SOURCES.get(found[0]).model_validate(item)
    except ValidationError as exc:
        from agentrt.core.schema import format_validation_error

        raise ValueError(format_validation_error(exc, prefix=f"reward.{i}.")) from None


def sources_of(value: str | list[RewardSource]) -> list[RewardSource]:
    """Every ``reward:`` value as a list of sources (a name is one Python source)."""
    return [PythonSource(python=value)] if isinstance(value, str) else list(value)


def check_reward(value: str | list[RewardSource]) -> None:
    """Checks each source before any work: the function imports, the model folder is a
    classifier, the service's host answers. Raises ConfigError naming the field."""
    if isinstance(value, str):
        from agentrt.rewards import resolve_reward

        resolve_reward(value)
        return
    for i, src in enumerate(value):
        src.check(f"reward.{i}")


def reachable(url: str, field: str, timeout_s: float) -> None:
    """A TCP connection to the URL's host and port opens, else ConfigError.

    A service that is down when the run starts is refused at once (one line), rather than
    retried for minutes at the first step; one that goes down later is retried (docs/rewards.md).
    """
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigError(f"{field}: cannot reach {redact(url)} ({why.lower()}); start the reward "
                          "service or fix the URL") from None
