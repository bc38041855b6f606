"""``agentrt debug RUN_DIR SAMPLE``: why is this sample bad? Evidence and a verdict per cause.

SAMPLE is an episode id of the run's episode log (:mod:`agentrt.controller.episodes`, e.g. ``s3-5``
of a train run, ``s3-5-player_0-2`` of a league's or ``s3-5-a0-0`` of a decompose run's) or a
JSON file ``{"prompt", "response", "reward"?, "info"?, "step"?}``. The run is of any kind
(``agentrt train``, ``tournament run``, ``decompose run``). Three causes are checked
(docs/debug.md); a league's or a decompose run's reward and leakage are one line saying why
they do not apply (a match's reward is its outcome; no data set was trained on):

- **reward**: the sample is re-scored :data:`REPEATS` times with the run's reward (resolved from
  the saved config): scores that differ = a non-deterministic reward; a re-score that differs
  from the logged reward; a second source (``--reward module:fn``, default the task's exact
  match) that differs by more than :data:`DISAGREE`.
- **actor**: the response's log-prob under each kept checkpoint's weights and under the
  reference (the warm-started or initial policy), a per-token KL estimate (k1, k3) from it; a
  mean per-token log-prob that rose by more than :data:`DRIFT_NATS` between two consecutive
  checkpointed versions = actor drift.
- **leakage** (:mod:`agentrt.tools.leakage`): the prompt (and the answer) matched exactly and by
  embedding (cosine at least :data:`COSINE`) against the run's training data (the task's train
  split, a preference data file) and the FAISS memory banks in the run folder; a prompt in the
  train and the eval split at once.

:func:`diagnose` returns a :class:`Report`; its ``text()`` starts with one verdict line.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrt.core.errors import ConfigError
from agentrt.tools.evidence import COSINE, Cause, Sample, clip

REPEATS = 8  # re-scores of the run's reward
REWARD_TOL = 1e-6  # scores closer than this are equal
DISAGREE = 0.5  # a second reward source disagrees when it differs by more than this
DRIFT_NATS = 1.0  # rise of the mean per-token log-prob between consecutive versions = drift
CAUSES = ("reward", "actor", "leakage")


@dataclass
class Report:
    run_dir: str
    sample: Sample
    causes: list[Cause]

    @property
    def verdict(self) -> list[str]:
        return [c.name for c in self.causes if c.found]

    def headline(self) -> str:
        found = [c for c in self.causes if c.found]
        if not found:
            return "verdict: none (no evidence of a bad reward, actor drift or prompt leakage)"
        return "verdict: " + "; ".join(f"{c.name} ({c.summary})" for c in found)

    def text(self) -> str:
        s = self.sample
        lines = [self.headline(),
                 f"sample {s.source}" + (f" (step {s.step}" if s.step is not None else "")
                 + (f", policy version {s.policy_version}" if s.policy_version is not None
                    else "") + (")" if s.step is not None else "")
                 + f": prompt {clip(s.prompt)} response {clip(s.response)}"
                 + (f" reward {s.reward:g}" if s.reward is not None else "")]
        for c in self.causes:
            lines.append(f"{c.name}: {'FOUND' if c.found else 'ok'}: {c.summary}")
            lines += [f"  - {e}" for e in c.evidence]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        sample = {k: v for k, v in asdict(self.sample).items()
                  if k not in ("prompt_ids", "response_ids", "logprobs")}
        return {"run_dir": self.run_dir, "verdict": self.verdict, "headline": self.headline(),
                "sample": sample,
                "thresholds": {"repeats": REPEATS, "reward_tol": REWARD_TOL,
                               "disagree": DISAGREE, "drift_nats_per_token": DRIFT_NATS,
                               "cosine": COSINE},
                "causes": {c.name: {"found": c.found, "summary": c.summary,
                                    "evidence": c.evidence, **c.data} for c in self.causes}}


# ----------------------------------------------------------------------------- inputs
#: Why a cause does not apply to a run kind (the causes it has no data for), in one line.
NOT_APPLICABLE = {
    ("tournament", "reward"): "a match's reward is its outcome (win, draw, loss), not a "
    "scored response; nothing to re-score",
    ("tournament", "leakage"): "a league trains on its own matches; no data set to check",
    ("decompose", "reward"): "a chain's rewards are its subtask verifiers' and its task "
    "outcome, not a reward function of the config; nothing to re-score",
    ("decompose", "leakage"): "a decompose run trains on its own chains; no data set to check",
}


def load_run(run_dir: Path, imports: tuple[str, ...] = ()) -> tuple[str, Any]:
    """The run's kind ('train', 'tournament', 'decompose') and config from its
    ``config.yaml``, resolved as its command resolves it (plugins, reward, model folders)."""
    from agentrt.tools.checks import load_checked

    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a folder; give the folder of a run")
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "run.json").is_file():
        raise ConfigError(f"{run_dir} holds no run (no config.yaml and run.json); give the "
                          "folder of a run")
    return load_checked(run_dir / "config.yaml", imports=imports)


def run_policy(cfg: Any, pid: str | None) -> Any:
    """The config of policy ``pid`` of the run (None: its first learner)."""
    policies = [cfg.policy] if hasattr(cfg, "policy") else list(cfg.policies)
    found = [p for p in policies if p.id == pid] or [p for p in policies if p.trainable]
    return (found or policies)[0]


def load_sample(run_dir: Path, spec: str) -> Sample:
    """An episode id of the run's log, or a JSON file."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        return _json_sample(path)
    from agentrt.controller.episodes import EpisodeLog

    log = EpisodeLog(run_dir)
    ep = log.get(spec)
    if ep is None:
        first = next(iter(log), None)
        shown = f"e.g. {first.id}" if first is not None else "it holds none yet"
        raise ConfigError(f"{run_dir} has no episode {spec!r}; give an episode id of its "
                          f"episodes.sqlite ({shown}) or a JSON file")
    return Sample(source=ep.id, prompt=ep.prompt, response=ep.response, reward=ep.reward,
                  info=ep.info, step=ep.step, policy_version=ep.policy_version,
                  prompt_ids=ep.prompt_ids, response_ids=ep.response_ids, logprobs=ep.logprobs,
                  trained=True, policy_id=ep.policy_id)


def _json_sample(path: Path) -> Sample:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"sample file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"sample file {path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sample file {path} must hold an object with prompt and response")
    for key in ("prompt", "response"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"sample file {path}: {key} must be a string")
    reward, info, step = data.get("reward"), data.get("info", {}), data.get("step")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise ConfigError(f"sample file {path}: reward must be a number")
    if not isinstance(info, dict):
        raise ConfigError(f"sample file {path}: info must be an object")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ConfigError(f"sample file {path}: step must be an integer")
    unknown = set(data) - {"prompt", "response", "reward", "info", "step"}
    if unknown:
        raise ConfigError(f"sample file {path}: unknown field {sorted(unknown)[0]!r}; "
                          "fields: prompt, response, reward, info, step")
    return Sample(source=str(path), prompt=data["prompt"], response=data["response"],
                  reward=None if reward is None else float(reward), info=info, step=step)


# ----------------------------------------------------------------------------- reward
def rescore(spec: Any, s: Sample, n: int, device: str = "cpu") -> tuple[list[float], list[str]]:
    """``n`` scores of the sample by the reward ``spec`` (a name, 'module:fn' or a run's list
    of sources), through the executors a run scores with (agentrt.rewards), each under its own
    sample id (a service must not answer a repeat from its cache). Returns (values, errors)."""
    import uuid

    from agentrt.rewards.executors import Sample as Scored
    from agentrt.rewards.executors import build_executor
    from agentrt.rewards.sources import sources_of

    executor = build_executor(sources_of(spec), device, namespace=f"debug-{uuid.uuid4().hex}")
    try:
        values, errors, _ = executor.score_batch(
            [Scored(f"debug-{i}", s.prompt, s.response, dict(s.info)) for i in range(n)])
    finally:
        executor.close()
    return [float(v) for v in values], [e for e in errors if e is not None]


def reward_label(spec: Any) -> str:
    """A reward setting in a line: the name, or its sources with their weights."""
    if isinstance(spec, str):
        return spec
    return " + ".join(f"{src.weight:g} x {src.kind} {src.ref}" for src in spec)


def reward_cause(cfg: Any, s: Sample, second: str | None = None, repeats: int = REPEATS
                 ) -> Cause:
    """Re-scores, logged reward, a second source."""
    from agentrt.core.device import resolve_device

    device = str(resolve_device(cfg.policy.model.device))
    label = reward_label(cfg.reward)
    scores, errors = rescore(cfg.reward, s, repeats, device)
    distinct = sorted({round(x, 9) for x in scores})
    ev = [f"re-scored {repeats} times with {label}: {', '.join(f'{x:g}' for x in scores)}"
          + (f" ({len(errors)} failed: {errors[0]})" if errors else "")]
    why = []
    if max(scores) - min(scores) > REWARD_TOL:
        why.append(f"non-deterministic reward: {len(distinct)} different scores in {repeats} "
                   "re-scores")
    if s.reward is not None:
        off = [x for x in scores if abs(x - s.reward) > REWARD_TOL]
        ev.append(f"logged reward {s.reward:g}: {len(off)} of {repeats} re-scores differ")
        if off and not why:
            why.append(f"re-scoring gives {scores[0]:g}, the log says {s.reward:g}")
    name = second or ("exact_match" if "answer" in s.info and cfg.reward != "exact_match"
                      else None)
    other = None
    if name is None:
        ev.append("second source: none (the run's reward is the task's exact match; pass "
                  "--reward module:fn)" if "answer" in s.info else
                  "second source: none (no answer in info; pass --reward module:fn)")
    else:
        (other,), bad = rescore(name, s, 1, device)
        ev.append(f"second source {name}: {other:g}" + (f" (failed: {bad[0]})" if bad else ""))
        if abs(other - scores[0]) > DISAGREE:
            why.append(f"{name} gives {other:g}, {label} {scores[0]:g}")
    summary = "; ".join(why) or f"deterministic, re-scores agree ({scores[0]:g})"
    return Cause("reward", bool(why), summary, ev,
                 {"scores": scores, "errors": errors, "logged": s.reward,
                  "second_source": name, "second_score": other})


# ----------------------------------------------------------------------------- actor
def actor_cause(run_dir: Path, cfg: Any, s: Sample) -> Cause:
    """The response's log-prob under the model folder's weights, every kept checkpoint (one
    loaded at a time) and the reference; drift between consecutive versions. ``cfg``: the
    config of the policy that played the sample."""
    from agentrt.controller.checkpoint import CheckpointError, load_checkpoint
    from agentrt.controller.run_dir import RunDir

    policy = _Policy(run_dir, cfg)
    prompt, response = policy.ids(s)
    if not response:
        return Cause("actor", False, "the response has no tokens; nothing to score")
    with policy.weights(None):  # first: a full-weight model is overwritten next
        ref = policy.logprobs(prompt, response)
    ref_name = "the model folder's weights (the initial policy)"
    versions: list[tuple[int, int, list[float]]] = []
    skipped, kl_ref = [], None
    for path in RunDir(run_dir).checkpoints():
        try:
            state = load_checkpoint(path)
        except CheckpointError as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        eng = next((p["policies"][policy.pid] for p in state["pools"].values()
                    if policy.pid in p.get("policies", {})), None)
        if eng is None:
            continue
        with policy.weights(eng["model"]):
            versions.append((int(eng["version"]), int(state["step"]),
                             policy.logprobs(prompt, response)))
        if kl_ref is None and eng.get("reference") is not None:  # the warm start's, in each
            with policy.weights(eng["reference"]):
                kl_ref = policy.logprobs(prompt, response)
    versions.sort(key=lambda t: (t[0], t[1]))
    if kl_ref is not None:
        ref, ref_name = kl_ref, "the warm-started policy (the checkpoint's KL reference)"
    elif versions and versions[0][1] == 0:
        ref = versions[0][2]
        ref_name = "version 0 (step 0 checkpoint: the initial or warm-started policy)"
    return _actor_verdict(s, policy.pid, ref, ref_name, versions, skipped)


class _Policy:
    """A policy's model (its model folder, with the LoRA adapter when it has one) to compute
    log-probs under any of its saved weights. ``cfg``: the policy's config."""

    def __init__(self, run_dir: Path, cfg: Any) -> None:
        from agentrt.tools.leakage import run_model_folder
        from agentrt.policies.models import load_model

        self.cfg, self.pid = cfg, cfg.id
        folder = run_model_folder(cfg, run_dir)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"the run's model folder {folder} is missing; agentrt debug needs "
                              "it to compute log-probs")
        model, self.tokenizer = load_model(folder)
        if cfg.lora.enabled:
            from peft import get_peft_model

            from agentrt.runtime.shared_model import peft_config

            model = get_peft_model(model, peft_config(cfg, model), adapter_name=self.pid)
        self.model = model.eval()

    def weights(self, weights: dict[str, Any] | None) -> Any:
        """A context computing with ``weights`` (a checkpoint's trainable weights: the adapter
        of a LoRA policy); None: the model folder's own (a LoRA base with its adapter off)."""
        import contextlib

        if self.cfg.lora.enabled:
            if weights is None:
                return self.model.disable_adapter()
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, weights, adapter_name=self.pid)
        elif weights is not None:
            self.model.load_state_dict(weights)
        return contextlib.nullcontext()

    def ids(self, s: Sample) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids): a logged episode's, or the texts encoded as a run does."""
        from agentrt.envs.tasks import encode_prompt

        if s.prompt_ids is not None and s.response_ids is not None:
            return s.prompt_ids, s.response_ids
        return (encode_prompt(self.tokenizer, s.prompt),
                self.tokenizer.encode(s.response, add_special_tokens=False))

    def logprobs(self, prompt: list[int], response: list[int]) -> list[float]:
        """Log-probs of ``response`` after ``prompt`` under the loaded weights, of the sampling
        distribution (logits / temperature), as the rollout's log-probs are."""
        import torch

        from agentrt.runtime.steps import shift_logprobs

        temp = self.cfg.rollout.sampling.temperature or 1.0
        from agentrt.core.device import module_device

        ids = torch.tensor([prompt + response], device=module_device(self.model))
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits.float() / temp
        return shift_logprobs(logits, ids)[0, len(prompt):].tolist()


def _actor_verdict(s: Sample, pid: str, ref: list[float], ref_name: str,
                   per_version: list[tuple[int, int, list[float]]], skipped: list[str]) -> Cause:
    n = len(ref)
    mean_ref = sum(ref) / n
    ev = [f"{n} response tokens; reference = {ref_name}: mean log-prob {mean_ref:.3f} per token"]
    rows: list[dict[str, Any]] = []
    rises = []
    for i, (version, step, lps) in enumerate(per_version):
        mean = sum(lps) / n
        k1 = sum(a - b for a, b in zip(lps, ref)) / n
        k3 = sum(math.exp(b - a) - (b - a) - 1 for a, b in zip(lps, ref)) / n
        rise = None if i == 0 else mean - rows[-1]["mean_logprob"]
        rows.append({"version": version, "step": step, "logprob": sum(lps),
                     "mean_logprob": mean, "kl_k1": k1, "kl_k3": k3, "rise": rise})
        ev.append(f"{pid}@v{version} (step {step}): log-prob {sum(lps):.3f}, {mean:.3f} per "
                  f"token, KL to reference k1 {k1:.3f} k3 {k3:.3f} per token"
                  + (f", rise {rise:+.3f} per token" if rise is not None else ""))
        if rise is not None and rise > DRIFT_NATS:
            rises.append((rows[-2]["version"], version, rise))
    if not rows:
        ev.append("no checkpoint of the policy to compare (pass a run with checkpoints)")
    ev += [f"skipped damaged checkpoint {x}" for x in skipped]
    if s.logprobs and s.policy_version is not None:
        at = [r for r in rows if r["version"] == s.policy_version]
        ev.append(f"sampled by v{s.policy_version}: logged mean log-prob "
                  f"{sum(s.logprobs) / n:.3f} per token"
                  + (f", recomputed {at[0]['mean_logprob']:.3f}" if at else
                     " (that version's checkpoint is not kept)"))
    if rises:
        a, b, rise = max(rises, key=lambda r: r[2])
        summary = (f"log-prob of the response rose {rise:+.2f} nats per token from v{a} to "
                   f"v{b} (threshold {DRIFT_NATS:g})")
    elif rows:
        summary = f"no rise above {DRIFT_NATS:g} nats per token across {len(rows)} " \
                  "checkpointed versions"
    else:
        summary = "no checkpoints to compare"
    return Cause("actor", bool(rises), summary, ev,
                 {"reference": ref_name, "reference_mean_logprob": mean_ref, "versions": rows})


# ----------------------------------------------------------------------------- all
def diagnose(run_dir: Path, spec: str, second: str | None = None, repeats: int = REPEATS,
             embedder: str = "hashing", imports: tuple[str, ...] = ()) -> Report:
    """Every cause's evidence for sample ``spec`` of the run in ``run_dir``."""
    if repeats < 2:
        raise ConfigError(f"--repeats must be at least 2 (re-scores to compare), not {repeats}")
    check_embedder(embedder)
    kind, cfg = load_run(run_dir, imports)
    if second is not None:
        from agentrt.rewards import resolve_reward

        resolve_reward(second)  # a bad --reward fails before any work
    sample = load_sample(run_dir, spec)
    from agentrt.tools.leakage import leakage_cause

    actor = actor_cause(run_dir, run_policy(cfg, sample.policy_id), sample)
    if kind != "train":
        return Report(str(run_dir), sample, [
            Cause("reward", False, f"does not apply: {NOT_APPLICABLE[kind, 'reward']}"), actor,
            Cause("leakage", False, f"does not apply: {NOT_APPLICABLE[kind, 'leakage']}")])
    causes = [reward_cause(cfg, sample, second, repeats), actor,
              leakage_cause(run_dir, cfg, sample, embedder)]
    return Report(str(run_dir), sample, causes)


def check_embedder(name: str) -> None:
    from agentrt.memory.embedders import EMBEDDERS

    if name not in EMBEDDERS:
        raise ConfigError(f"--embedder {name!r} is unknown; valid: "
                           f"{', '.join(EMBEDDERS.names())}")
