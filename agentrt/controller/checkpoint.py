"""One checkpoint folder: ``state.pt`` and its ``manifest.json``, written and verified.

Layout of ``<run_dir>/checkpoints/step_N/``::

    state.pt        torch.save of tensors and plain data only (lists, dicts, str, numbers)
    models/<id>/    with ``checkpoint.models``: each learning policy in Hugging Face format
                    (what ``agentrt serve --follow`` serves; not read by a resume)
    manifest.json   {"format": 1, "step": N, "agentrt": version,
                     "files": {"state.pt": {"bytes": ..., "sha256": ...}}}

The manifest is written last, into the temporary folder that is then renamed to ``step_N``, so
a folder with a manifest whose checksums match was written whole. :func:`load_checkpoint`
verifies the format version and every checksum, then loads with ``torch.load(weights_only=True)``:
a checkpoint can hold no pickled object, so loading one cannot run code. Anything that does not
check out raises :class:`CheckpointError` with the reason, and the run folder falls back to the
previous checkpoint (:meth:`agentrt.controller.run_dir.RunDir.load_latest`).

Checkpoints written before format 1 (no manifest, numpy arrays and pickled baselines inside)
are refused: they cannot be loaded without unpickling arbitrary objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from agentrt import __version__
from agentrt.core.errors import AgentrtError

FORMAT = 1
MANIFEST = "manifest.json"
MODELS = "models"
STATE = "state.pt"


class CheckpointError(AgentrtError):
    """A checkpoint folder is damaged, incomplete or of another format."""


def write_checkpoint(folder: Path, step: int, state: dict[str, Any]) -> None:
    """Writes ``state.pt`` then, last, ``manifest.json`` into ``folder`` (a fresh temporary
    folder the caller renames into place), each flushed to disk."""
    torch.save(state, folder / STATE)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
             for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"format": FORMAT, "step": step, "agentrt": __version__, "files": files}
    with open(folder / MANIFEST, "w") as f:
        f.write(json.dumps(manifest, indent=1))
    for name in [*files, MANIFEST]:
        _fsync(folder / name)
    _fsync(folder)


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """The state of checkpoint ``folder`` after verifying its manifest and checksums.

    Raises:
        CheckpointError: the reason in a few words (no manifest, a checksum mismatch, a file
            torch cannot load as plain data, another step than the folder's name).
    """
    folder = Path(folder)
    manifest = _manifest(folder)
    for name, meta in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{name} is missing")
        if path.stat().st_size != meta.get("bytes") or sha256_of(path) != meta.get("sha256"):
            raise CheckpointError(f"{name} does not match its checksum in {MANIFEST} (truncated "
                                  "or overwritten)")
    if STATE not in manifest["files"]:
        raise CheckpointError(f"{MANIFEST} lists no {STATE}")
    try:
        state = torch.load(folder / STATE, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a damaged checkpoint
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{STATE} cannot be loaded as tensors and plain data ("
                              f"{type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or state.get("step") != manifest["step"]:
        raise CheckpointError(f"{STATE} does not hold the state of step {manifest['step']}")
    return state


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"no {MANIFEST} (cut short, or written by an agentrt before "
                              f"checkpoint format {FORMAT}, which this version does not load)")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{MANIFEST} has no file list")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint format {manifest.get('format')!r}; this agentrt "
                              f"reads format {FORMAT}")
    return manifest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
