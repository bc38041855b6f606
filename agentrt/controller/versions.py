"""Policy versions: a record for every checkpointed policy version and league snapshot.

``<run_dir>/versions.json`` maps ``"<policy>@v<version>"`` (a league snapshot: its own key,
``"<policy>@<tag>"``) to its record, written atomically at
every checkpoint (a replayed step rewrites its record, never adds a second one):

- ``policy``, ``version``, ``parent`` (the record this one was trained from: the policy's
  previous checkpointed version, or for a snapshot the live version it froze), ``kind``
  (``policy`` or ``snapshot``), ``run`` (the run folder), ``step``;
- provenance: ``code`` (git commit of the checkout, ``+dirty`` with local changes),
  ``config_sha256`` (the run's identity, ``run.json``), ``data`` (what the policy trained on: a
  prompt or preference data file's sha256, a Redis stream's url, stream, group and consumer, or
  the generated task, env or family and its seed), ``reward`` (sha256 of the reward function's
  source, of a reward model folder's config and weights, a reward service's redacted URL, or
  the sha256 of the env's / family's class source, whose verifiers pay);
- ``metrics``: the metrics row logged at that step.

``agentrt policies ls|show|diff`` reads them (:mod:`agentrt.cli`); ``diff`` across two run
folders names the differing config fields (from each ``run.json``) too.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from agentrt.controller.checkpoint import sha256_of
from agentrt.core.errors import ConfigError
from agentrt.controller.identity import differences, read_identity
from agentrt.core.registry import REGISTRIES, import_callable

VERSIONS = "versions.json"
#: Metrics ``ls`` and ``diff`` show: a version's held-out figures and its training reward.
KEY_FIGURES = ("eval/win_rate_vs_", "eval/accuracy", "eval/success", "eval/reward",
               "reward/mean")


def source_sha(obj: Any) -> str | None:
    """sha256 of a function's or class's source (None: no source, e.g. a builtin)."""
    try:
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def provenance(config: dict[str, Any], base: Path) -> dict[str, Any]:
    """``data`` and ``reward`` of a run of ``config`` (resolved, as saved in config.yaml)."""
    data: dict[str, Any] = {}
    reward: dict[str, Any] = {}
    if config.get("task"):  # agentrt train
        t = config["task"]
        data["task"] = {k: t.get(k) for k in ("name", "options", "seed", "train_size")}
        from agentrt.rewards import REWARDS

        given = config.get("reward")  # a name, or sources: a function's source is hashed
        for src in [{"python": given}] if isinstance(given, str) else given:
            reward |= _reward_version(src, base)
        options = t.get("options") or {}
        if t.get("name") == "redis":  # a stream: which one (its entries are in the episodes)
            redis = options.get("redis") or {}
            data["stream"] = {"url": redis.get("url"), **{k: options.get(k) for k in (
                "stream", "group", "consumer")}}
        elif isinstance(options.get("path"), str):  # a prompt data file (task: dataset)
            data["file"] = _file_version(options["path"], base)
    path = (config.get("data") or {}).get("path")
    if path:
        data["preference_file"] = _file_version(path, base)
    for env in config.get("envs") or []:  # leagues: the env's own rewards
        from agentrt.envs.registration import ENVS

        target = ENVS.get(env["id"]).entry_point if env["id"] in ENVS else env["id"]
        if isinstance(target, str):  # 'module:Class'
            try:
                target = import_callable(target, f"env {env['id']!r}") if ":" in target else None
            except ConfigError:
                target = None
        data.setdefault("envs", {})[env["id"]] = env.get("kwargs") or {}
        reward[env["id"]] = source_sha(target) if target is not None else None
    if config.get("family"):  # the decomposer: the family's verifiers pay
        # agentrt.decomposer.sdk's registry (a layer above), loaded by the decomposer's run
        families = REGISTRIES.get("task family")
        f = config["family"]
        data["family"] = {k: f.get(k) for k in ("name", "options", "seed", "train_size")}
        known = families is not None and f["name"] in families
        reward[f["name"]] = source_sha(families.get(f["name"])) if known else None
    return {"data": data, "reward": reward}


def _file_version(path: str, base: Path) -> dict[str, Any]:
    p = Path(path) if Path(path).is_absolute() else base / path
    return {"path": str(path), "sha256": sha256_of(p) if p.is_file() else None}


def _reward_version(src: dict[str, Any], base: Path) -> dict[str, str | None]:
    """``{name: version}`` of one reward source: a Python function's source sha256, a reward
    model folder's sha256 (its config and weight files), or a service's (redacted) URL, which
    is all of it this side can see."""
    from agentrt.rewards import REWARDS

    if src.get("model"):
        folder = Path(src["model"]) if Path(src["model"]).is_absolute() else base / src["model"]
        files = sorted(f for f in folder.glob("*") if f.is_file() and (
            f.name == "config.json" or f.suffix in (".safetensors", ".bin")))
        digest = hashlib.sha256()
        for f in files:
            digest.update(f"{f.name}:{sha256_of(f)}\n".encode())
        return {src["model"]: digest.hexdigest() if files else None}
    if src.get("http"):
        return {src["http"]: f"service {src['http']}"}
    name = src.get("python")
    try:
        return {name: source_sha(REWARDS.get(name))}
    except (KeyError, ConfigError):
        return {name: None}


class VersionBook:
    """The run's ``versions.json``: records added at checkpoints and snapshots."""

    def __init__(self, run_dir: Path, config: dict[str, Any], code: str) -> None:
        self.path = run_dir / VERSIONS
        self.run_dir = run_dir
        held = read_identity(run_dir)
        self.common = {"run": str(run_dir.resolve()), "code": code,
                       "config_sha256": held["config_sha256"] if held else None,
                       **provenance(config, Path.cwd())}
        self.records: dict[str, dict[str, Any]] = read_versions(run_dir)

    def checkpointed(self, step: int, versions: dict[str, int], metrics: dict[str, Any]) -> None:
        """Records each trainable policy at ``versions[pid]`` (its version at this step)."""
        for pid, version in versions.items():
            earlier = [r["version"] for r in self.records.values()
                       if r["policy"] == pid and r["kind"] == "policy" and r["version"] < version]
            parent = f"{pid}@v{max(earlier)}" if earlier else None
            self.records[f"{pid}@v{version}"] = {
                "policy": pid, "version": version, "kind": "policy", "parent": parent,
                "step": step, **self.common, "metrics": _numbers(metrics)}
        self._write()

    def snapshot(self, key: str, source: str, version: int, step: int) -> None:
        self.records[key] = {"policy": key, "version": version, "kind": "snapshot",
                             "parent": f"{source}@v{version}", "step": step, **self.common,
                             "metrics": {}}

    def _write(self) -> None:
        from agentrt.controller.run_dir import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.records, indent=1, sort_keys=True) + "\n")


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def read_versions(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / VERSIONS
    if not path.is_file():
        return {}
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); restore it, or move it "
                          "away to start a new record of the versions") from None
    if not isinstance(records, dict):
        raise ConfigError(f"{path} does not hold a mapping of versions")
    return records


def find(spec: str, default_run: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The record of ``[RUN_DIR:]key`` (``lm@v4``, a snapshot ``lm@25``, or ``lm``: the newest
    checkpointed version of that policy)."""
    run_text, sep, key = spec.rpartition(":")
    run = Path(run_text) if sep else default_run
    if run is None:
        raise ConfigError(f"{spec!r}: give RUN_DIR:policy@version")
    records = read_versions(run)
    if not records:
        raise ConfigError(f"{run} has no {VERSIONS}; is it a run folder with a checkpoint?")
    if key in records:
        return run, records[key]
    mine = [r for r in records.values() if r["policy"] == key and r["kind"] == "policy"]
    if "@" in key or not mine:
        raise ConfigError(f"{key!r} is not a version of {run}; versions: "
                          f"{', '.join(sorted(records))}")
    return run, max(mine, key=lambda r: r["version"])


def listing(run_dir: Path) -> list[str]:
    records = read_versions(run_dir)
    if not records:
        raise ConfigError(f"{run_dir} has no {VERSIONS}; is it a run folder with a checkpoint?")
    rows = [f"{'version':<18} {'kind':<9} {'parent':<18} {'step':>6}  metrics"]
    for key, r in sorted(records.items(), key=lambda kv: (kv[1]["policy"], kv[1]["version"])):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r["metrics"].items())
                          if k.startswith(KEY_FIGURES))[:90]
        rows.append(f"{key:<18} {r['kind']:<9} {r['parent'] or '-':<18} {r['step']:>6}  "
                    f"{shown or '-'}")
    return rows


def diff(a: tuple[Path, dict[str, Any]], b: tuple[Path, dict[str, Any]]) -> list[str]:
    """One line per provenance field that differs between two version records."""
    (run_a, ra), (run_b, rb) = a, b
    out = []
    for field in ("code", "config_sha256", "data", "reward"):
        if ra.get(field) != rb.get(field):
            both = isinstance(ra.get(field), dict) and isinstance(rb.get(field), dict)
            out.append(f"{field}:" if both else
                       f"{field}: {_short(ra.get(field))} vs {_short(rb.get(field))}")
            if field == "config_sha256":
                ia, ib = read_identity(run_a), read_identity(run_b)
                if ia and ib:
                    out.append(f"  config fields (first there, second here): "
                               f"{differences(ia, ib)}")
            if isinstance(ra.get(field), dict) and isinstance(rb.get(field), dict):
                for k in sorted(set(ra[field]) | set(rb[field])):
                    if ra[field].get(k) != rb[field].get(k):
                        out.append(f"  {field}.{k}: {_short(ra[field].get(k))} vs "
                                   f"{_short(rb[field].get(k))}")
    common = sorted(set(ra["metrics"]) & set(rb["metrics"]))
    moved = [f"{k} {ra['metrics'][k]:.4g} -> {rb['metrics'][k]:.4g}" for k in common
             if k.startswith(KEY_FIGURES) and ra["metrics"][k] != rb["metrics"][k]]
    if moved:
        out.append("metrics: " + ", ".join(moved[:8]))
    return out


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 70 else text[:67] + "..."
