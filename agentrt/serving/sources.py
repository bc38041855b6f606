"""What ``agentrt serve TARGET`` serves: the policies of a run folder, or model/adapter folders.

A target is one of

- a run folder (it has ``config.yaml``): every finished policy in ``final_models/<id>/``
  (tournament), ``final_model/`` (train; named by the config's ``policy.id``) or ``final/<id>/``
  (decompose), each a full Hugging Face model or a LoRA adapter;
- a Hugging Face model folder (``config.json``), served under its folder name;
- a LoRA adapter folder (``adapter_config.json``) over the base it names
  (``base_model_name_or_path``) or ``--base``.

``--adapter NAME=PATH`` adds more adapters over the same base. Every served name is one
:class:`Source`; adapters over one base share that base's weights in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from agentrt.core.errors import AgentrtError

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class Source:
    """One served name.

    Attributes:
        name: What a request's ``model`` field says.
        path: The model folder (full weights) or the adapter folder.
        base: The base model folder of an adapter; None for full weights.
    """

    name: str
    path: Path
    base: Path | None


def is_model(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def is_adapter(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file()


def adapter_base(folder: Path) -> Path | None:
    """The base model folder an adapter names (``base_model_name_or_path``), if it exists."""
    try:
        named = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise AgentrtError(f"{folder / ADAPTER_CONFIG} cannot be read ({exc})") from None
    return Path(named) if named and is_model(Path(named)) else None


def source_of(name: str, folder: Path, base: Path | None) -> Source:
    """The Source for ``folder`` (a model or an adapter; an adapter over ``base`` or the base
    it names). Raises AgentrtError naming what is missing."""
    if not folder.is_dir():
        raise AgentrtError(f"{folder} does not exist; give a run folder, a Hugging Face model "
                           "folder or a LoRA adapter folder")
    if is_model(folder):
        from agentrt.policies.models import check_model_folder

        check_model_folder(folder)  # its tokenizer too, before anything loads
        return Source(name, folder, None)
    if not is_adapter(folder):
        raise AgentrtError(f"{folder} holds neither a model (config.json) nor a LoRA adapter "
                           f"({ADAPTER_CONFIG})")
    found = base or adapter_base(folder)
    if found is None:
        raise AgentrtError(f"the base model of adapter {folder} is not found; pass --base "
                           "MODEL_FOLDER")
    if not is_model(found):
        raise AgentrtError(f"--base {found} is not a Hugging Face model folder (no config.json)")
    return Source(name, folder, found)


def _run_policies(run: Path) -> list[tuple[str, Path]]:
    """(policy id, final model folder) of a run folder's finished policies."""
    found = []
    for sub in ("final_models", "final"):  # tournament, decompose: one folder per policy
        if (run / sub).is_dir():
            found += [(p.name, p) for p in sorted((run / sub).iterdir()) if p.is_dir()]
    if (run / "final_model").is_dir():  # train: named by the config's policy id
        import yaml

        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        policy = cfg.get("policy") if isinstance(cfg, dict) else None
        found.append(((policy or {}).get("id", "policy"), run / "final_model"))
    return found


def find_sources(target: Path, adapters: Sequence[str] = (), base: Path | None = None,
                 name: str | None = None) -> list[Source]:
    """Every name to serve from ``target`` and the ``NAME=PATH`` adapter options.

    Raises:
        AgentrtError: a folder is missing or of no known kind, an option is malformed, or two
            sources share a name.
    """
    if base is not None and not is_model(base):  # checked even where no adapter needs it
        raise AgentrtError(f"--base {base} is not a Hugging Face model folder (no config.json)")
    if (target / "config.yaml").is_file() and not is_model(target):
        policies = _run_policies(target)
        if not policies:
            raise AgentrtError(f"run folder {target} has no final model yet (final_model/, "
                               "final_models/<id>/ or final/<id>/); let the run finish")
        sources = [source_of(pid, folder, base) for pid, folder in policies]
    else:
        sources = [source_of(name or target.name, target, base)]
    shared_base = base or (target if is_model(target) else sources[0].base)
    for option in adapters:
        key, sep, path = option.partition("=")
        if not sep or not key or not path:
            raise AgentrtError(f"--adapter {option!r}: write NAME=PATH")
        sources.append(source_of(key, Path(path), shared_base))
    names = [s.name for s in sources]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AgentrtError(f"two served models are named {dup[0]!r}; rename one (--name, "
                           "--adapter NAME=PATH)")
    return sources


def run_device(target: Path) -> str:
    """Where a run folder's policies ran (``model.device`` of its first policy in
    ``config.yaml``), so ``agentrt serve`` honours it; "auto" for a model or adapter folder."""
    if not (target / "config.yaml").is_file() or is_model(target):
        return "auto"
    import yaml

    cfg = yaml.safe_load((target / "config.yaml").read_text()) or {}
    if not isinstance(cfg, dict):
        return "auto"
    for policy in [cfg.get("policy"), *(cfg.get("policies") or [])]:
        model = policy.get("model") if isinstance(policy, dict) else None
        if isinstance(model, dict) and model.get("device"):
            return str(model["device"])
    return "auto"
