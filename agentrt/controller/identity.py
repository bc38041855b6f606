"""Which run a run folder holds (``run.json``), and the lock that keeps it to one process.

A run's identity is its resolved config (seed included) and the agentrt version, less the
fields that may change between a run and its resume without changing what it computes
(:data:`VOLATILE`: where it writes, how it shows progress, how many threads, how often and how
many checkpoints it keeps, the Ray runtime, the stop guards, drift detection, the metrics
exporters, online control (its live values are in the checkpoint), where its plugins were
found, and how many steps it runs: a finished run may be continued further). Credentials are no part of it:
fields named like a password, token, secret or API key are left out (they may rotate between
resumes) and a URL's user part and password parameter (``redis://:pw@host/0?password=pw``) are
dropped, so nothing in ``run.json``
is derived from a secret. ``run.json`` keeps a hash of the whole and one entry per field: its
value, or a short hash of it when it is long (a prompt template), so a refusal can name every
field that differs. A field that a newer agentrt added is no difference while it holds its
default (:func:`at_default`): the run folder's run ran as the default does.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentrt import __version__
from agentrt.core.errors import AgentrtError

IDENTITY = "run.json"
LOCK = ".lock"
#: Config fields (and sections) left out of a run's identity: changing them between a run and its
#: resume leaves the computation the same.
VOLATILE = ("run_dir", "progress", "threads", "checkpoint.every", "checkpoint.keep", "runtime",
            "guards", "drift", "train.steps", "export", "control", "import_paths")
_CREDENTIAL = re.compile(r"(^|_)(password|passwd|token|secret|api_?key|credentials?)(_env)?$",
                         re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_QUERY_SECRET = re.compile(r"(?<=[?&])(password|passwd|token|secret|api_?key)=[^&#\s]*",
                           re.IGNORECASE)
_HELD: dict[str, int] = {}  # run folder -> file descriptor holding its lock (this process)


class RunFolderError(AgentrtError):
    """The run folder holds another run, or another process is writing it."""


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """``run.json``'s content for a resolved config (``model_dump(mode="json")``)."""
    # Empty lists count as unset: the CLI's config model adds ``imports: []`` to every kind.
    fields = {k: _scrub(v) for k, v in flatten(config).items()
              if not _volatile(k) and v not in ([], {})}
    fields["agentrt"] = __version__
    whole = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    shown = {k: _shown(k, v) for k, v in fields.items()}
    return {"format": 1, "config_sha256": whole, "seed": config.get("seed"),
            "agentrt": __version__, "fields": shown}


def read_identity(folder: Path, strict: bool = False) -> dict[str, Any] | None:
    """The identity ``folder`` records (None: none).

    Raises:
        RunFolderError: ``strict`` and ``run.json`` exists but cannot be read as an identity
            (the folder holds some run, which one is unknown: nothing may be assumed).
    """
    path = folder / IDENTITY
    if not path.exists():
        return None
    why = None
    try:
        found = json.loads(path.read_text())
    except IsADirectoryError:
        why, found = "is a directory", None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why, found = f"is not readable JSON ({type(exc).__name__})", None
    if why is None and not (isinstance(found, dict) and isinstance(found.get("fields"), dict)
                            and isinstance(found.get("config_sha256"), str)):
        why = "does not hold a run identity"
    if why is None:
        return found
    if strict:
        raise RunFolderError(f"{path} {why}, so which run {folder} holds is unknown; pass "
                             "--new-run to start over in it or --resume force to continue it "
                             "with this config")
    return None


def at_default(model: BaseModel, prefix: str = "") -> set[str]:
    """The fields of a config (named as :func:`flatten` names them) that hold their default.

    A run folder made by an agentrt that did not have such a field yet ran as its default does
    (a new field's default keeps the old behaviour), so it is no difference (:func:`added`).
    """
    out: set[str] = set()
    for name, field in type(model).model_fields.items():
        value, key = getattr(model, name), f"{prefix}.{name}" if prefix else name
        if isinstance(value, BaseModel):
            out |= at_default(value, key)
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            for i, item in enumerate(value):
                out |= at_default(item, f"{key}[{i}]")
        elif not field.is_required() and value == field.get_default(call_default_factory=True):
            out.add(key)
    return out


def added(old: dict[str, Any], new: dict[str, Any], defaulted: set[str]) -> set[str]:
    """The fields of ``new`` that ``old`` does not have and that hold their default
    (``defaulted``, from :func:`at_default`; a default dict counts for the keys inside it)."""
    def default(key: str) -> bool:
        return any(key == d or key.startswith((f"{d}.", f"{d}[")) for d in defaulted)
    return {k for k in set(new["fields"]) - set(old["fields"]) if default(k)}


def differences(old: dict[str, Any], new: dict[str, Any], limit: int = 6,
                ignore: set[str] = frozenset()) -> str:
    """The fields where two identities differ, as ``"seed: 0 there, 1 here; memory.url"``
    (with their values unless ``run.json`` keeps only a hash of them); ``ignore``d ones left out.
    Empty when no field but an ignored one differs."""
    a, b = old["fields"], new["fields"]
    out = []
    for key in sorted(set(a) | set(b), key=lambda k: (k != "seed", k)):
        if a.get(key, "<unset>") == b.get(key, "<unset>") or key in ignore:
            continue
        x, y = a.get(key, "unset"), b.get(key, "unset")
        hidden = isinstance(x, str) and x.startswith("sha256:") or (
            isinstance(y, str) and y.startswith("sha256:"))
        out.append(key if hidden else f"{key}: {_brief(x)} there, {_brief(y)} here")
    more = f"; and {len(out) - limit} more" if len(out) > limit else ""
    return "; ".join(out[:limit]) + more if out or ignore else "the config hash"


def lock(folder: Path) -> None:
    """Takes ``folder/.lock`` (flock, exclusive) for this process until :func:`unlock`.

    Raises:
        RunFolderError: another process holds it.
    """
    key = str(folder.resolve())
    if key in _HELD:
        return
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # a folder, a symlink, no permission: not a lock this process can take
        raise RunFolderError(f"{folder / LOCK} cannot be the run folder's lock file "
                             f"({exc.strerror}); remove it if no agentrt process uses "
                             f"{folder}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunFolderError(f"run folder {folder} is in use by another agentrt process (pid "
                             f"{holder}); wait for it to end or give this run another run_dir"
                             ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def unlock(folder: Path) -> None:
    fd = _HELD.pop(str(folder.resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def _brief(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A config dump as ``{"policy.optim.lr": 0.001, "policies[0].id": "lm", ...}`` (lists of
    sections by index, other lists as values)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out |= flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        out = {}
        for i, v in enumerate(node):
            out |= flatten(v, f"{prefix}[{i}]")
        return out
    return {prefix: node}


def _volatile(key: str) -> bool:
    name = key.rsplit(".", 1)[-1]
    return _CREDENTIAL.search(name) is not None or any(
        key == v or key.startswith(f"{v}.") for v in VOLATILE)


def _scrub(value: Any) -> Any:
    """``value`` without the user part (name, password) or a password parameter of any URL."""
    if isinstance(value, str):
        return _QUERY_SECRET.sub(r"\1=", _USERINFO.sub("", value))
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


def _shown(key: str, value: Any) -> Any:
    """``value``, or ``"sha256:<16 hex>"`` when it is long."""
    text = json.dumps(value, sort_keys=True)
    if len(text) <= 120:
        return value
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
