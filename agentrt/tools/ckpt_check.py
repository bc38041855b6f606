"""``agentrt ckpt check CKPT [--against CONFIG|CKPT]``: can this checkpoint be resumed or served
with that config, and if not, what differs.

A checkpoint is checked on its own first (manifest, format version, checksums: the loader a
resume uses, :func:`agentrt.controller.checkpoint.load_checkpoint`). Against a config (any run kind), each
LM policy of the config must be in the checkpoint with:

- the architecture the config builds: every weight's name and shape, read from the model folder's
  ``config.json`` or the preset, on PyTorch's meta device (no weights are loaded);
- for a LoRA policy, the adapter's rank and target modules, and adapter shapes that fit the base;
  for a full policy, no adapter;
- an optimizer state over as many parameters as the policy trains (a resume restores it).

Against another checkpoint: the same policies with the same weight names and shapes, the same
format version. Every difference is named (``policies.lm: model.embed_tokens.weight is (259,
128) in the checkpoint, (259, 256) in the config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrt.controller.checkpoint import FORMAT, CheckpointError, _manifest, load_checkpoint
from agentrt.core.errors import ConfigError

_LORA = re.compile(r"^(?:base_model\.model\.)?(.+)\.(lora_[AB])(?:\.[^.]+)?\.weight$")


@dataclass
class Verdict:
    """What :func:`check` found: ``ok`` and one line per difference (or per fact when ok)."""

    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def bad(self, line: str) -> None:
        self.ok = False
        self.lines.append(line)

    def text(self, ckpt: Path, against: Path | None) -> str:
        what = f" with {against}" if against is not None else ""
        head = f"{ckpt}: compatible{what}" if self.ok else f"{ckpt}: NOT compatible{what}"
        return "\n".join([head, *(f"  - {line}" for line in self.lines)])


def resolve(path: Path) -> Path:
    """A checkpoint folder (``step_N``) or a run folder (its newest checkpoint)."""
    if (path / "state.pt").is_file() or (path / "manifest.json").is_file():
        return path
    steps = sorted((p for p in (path / "checkpoints").glob("step_*")
                    if p.name.removeprefix("step_").isdecimal()),
                   key=lambda p: int(p.name.removeprefix("step_")))
    if not steps:
        raise ConfigError(f"{path} is neither a checkpoint folder (state.pt, manifest.json) nor a "
                          "run folder with checkpoints/step_N")
    return steps[-1]


def check(ckpt: Path, against: Path | None = None, imports: tuple[str, ...] = ()) -> Verdict:
    """Checks ``ckpt`` alone, or against a config file or another checkpoint."""
    verdict = Verdict()
    folder = resolve(ckpt)
    try:
        state = load_checkpoint(folder)
    except CheckpointError as exc:
        verdict.bad(f"cannot be loaded: {exc}")
        return verdict
    pools = _policies(state)
    verdict.lines.append(f"format {FORMAT}, step {state.get('step')}, policies: "
                         f"{', '.join(sorted(pools)) or '-'}")
    if against is None:
        return verdict
    verdict.lines.clear()
    if against.is_dir() or against.name == "state.pt" or against.name == "manifest.json":
        _against_checkpoint(verdict, folder, pools, resolve(against if against.is_dir()
                                                            else against.parent))
    else:
        _against_config(verdict, pools, against, imports)
    return verdict


def _policies(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Policy id -> its engine state, over every pool of the checkpoint."""
    return {pid: eng for pool in state.get("pools", {}).values()
            for pid, eng in pool.get("policies", {}).items()}


def _against_checkpoint(verdict: Verdict, folder: Path, mine: dict[str, Any],
                        other_folder: Path) -> None:
    try:
        other = _policies(load_checkpoint(other_folder))
        fmt = _manifest(other_folder).get("format")
    except CheckpointError as exc:
        verdict.bad(f"{other_folder} cannot be loaded: {exc}")
        return
    if fmt != _manifest(folder).get("format"):
        verdict.bad(f"format {_manifest(folder).get('format')} here, {fmt} there")
    for pid in sorted(set(mine) ^ set(other)):
        verdict.bad(f"policy {pid!r} is only in {'this' if pid in mine else 'the other'} "
                    "checkpoint")
    for pid in sorted(set(mine) & set(other)):
        lora = [any(_LORA.match(k) for k in p[pid]["model"]) for p in (mine, other)]
        if lora[0] != lora[1]:
            kinds = ("a LoRA adapter", "full weights") if lora[0] else ("full weights",
                                                                        "a LoRA adapter")
            verdict.bad(f"policies.{pid}: this checkpoint holds {kinds[0]}, the other "
                        f"{kinds[1]}")
            continue
        _same_shapes(verdict, pid, _shapes(mine[pid]["model"]), _shapes(other[pid]["model"]),
                     "this checkpoint", "the other")


def _against_config(verdict: Verdict, pools: dict[str, Any], path: Path,
                    imports: tuple[str, ...]) -> None:
    from agentrt.tools.checks import load_checked

    _, cfg = load_checked(path, imports=imports)
    policies = list(getattr(cfg, "policies", None) or [cfg.policy])
    for pid in sorted(set(pools) - {p.id for p in policies}):
        verdict.bad(f"policy {pid!r} is in the checkpoint but not in the config")
    for p in policies:
        if p.id not in pools:
            verdict.bad(f"policy {p.id!r} of the config is not in the checkpoint")
            continue
        eng = pools[p.id]
        have = _shapes(eng["model"])
        adapter = any(_LORA.match(k) for k in have)
        if p.lora.enabled:
            if not adapter:
                verdict.bad(f"policies.{p.id}: the config trains a LoRA adapter, the checkpoint "
                            "holds full weights")
                continue
            _lora_fits(verdict, p, have)
        elif adapter:
            verdict.bad(f"policies.{p.id}: the checkpoint holds a LoRA adapter, the config "
                        "trains full weights (lora.enabled: false)")
            continue
        else:
            _same_shapes(verdict, p.id, have, _expected_shapes(p), "the checkpoint",
                         "the config")
        if p.trainable:
            _optimizer_fits(verdict, p.id, eng, len(have))


def _shapes(weights: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in weights.items()}


def _same_shapes(verdict: Verdict, pid: str, have: dict[str, tuple], want: dict[str, tuple],
                 here: str, there: str, limit: int = 5) -> None:
    diffs = [f"{k} is {_fmt(have[k])} in {here}, {_fmt(want[k])} in {there}"
             for k in sorted(set(have) & set(want)) if have[k] != want[k]]
    diffs += [f"{k} is only in {here}" for k in sorted(set(have) - set(want))]
    diffs += [f"{k} is only in {there}" for k in sorted(set(want) - set(have))]
    for line in diffs[:limit]:
        verdict.bad(f"policies.{pid}: {line}")
    if len(diffs) > limit:
        verdict.bad(f"policies.{pid}: and {len(diffs) - limit} more weight differences")


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _base_config(p: Any) -> Any:
    if p.model.path:
        from transformers import AutoConfig

        folder = Path(p.model.path)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"policies.{p.id}.model.path: {folder} has no config.json")
        return AutoConfig.from_pretrained(folder)
    from agentrt.policies.models import build_tokenizer, model_config

    return model_config(p.model.preset, vocab_size=len(build_tokenizer()))


def _meta_model(p: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(_base_config(p))


def _expected_shapes(p: Any) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in _meta_model(p).state_dict().items()}


def _lora_fits(verdict: Verdict, p: Any, have: dict[str, tuple]) -> None:
    from agentrt.policies.models import lora_targets

    modules: dict[str, dict[str, tuple]] = {}
    for key, shape in have.items():
        m = _LORA.match(key)
        if m:
            modules.setdefault(m.group(1), {})[m.group(2)] = shape
    ranks = {s["lora_A"][0] for s in modules.values() if "lora_A" in s}
    if ranks != {p.lora.r}:
        verdict.bad(f"policies.{p.id}.lora.r: {p.lora.r} in the config, "
                    f"{', '.join(map(str, sorted(ranks)))} in the checkpoint")
    targets = {name.rsplit(".", 1)[-1] for name in modules}
    meta = _meta_model(p)
    expected = lora_targets(meta, p.lora.target_modules)[0]
    if targets != set(expected):
        verdict.bad(f"policies.{p.id}.lora.target_modules: {sorted(expected)} in "
                    f"the config, {sorted(targets)} in the checkpoint")
    base = dict(meta.named_modules())
    for name, shapes in sorted(modules.items()):
        module = base.get(name) or base.get(name.removeprefix("model."))
        weight = getattr(module, "weight", None)
        if weight is None or "lora_A" not in shapes or "lora_B" not in shapes:
            continue
        out_f, in_f = tuple(weight.shape)
        if shapes["lora_A"][1] != in_f or shapes["lora_B"][0] != out_f:
            verdict.bad(f"policies.{p.id}: the adapter of {name} maps {shapes['lora_A'][1]} -> "
                        f"{shapes['lora_B'][0]} features, the config's base {in_f} -> {out_f}")
            return


def _optimizer_fits(verdict: Verdict, pid: str, eng: dict[str, Any], params: int) -> None:
    opt = eng.get("optimizer") or {}
    groups = opt.get("param_groups") or []
    count = sum(len(g.get("params", [])) for g in groups)
    if not groups:
        verdict.bad(f"policies.{pid}: no optimizer state (a resume restarts the optimizer)")
    elif count not in (params, params - 1):  # tied embeddings appear once among parameters
        verdict.bad(f"policies.{pid}: the optimizer state covers {count} parameters, the "
                    f"policy trains {params}")
