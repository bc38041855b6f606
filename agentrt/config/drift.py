"""The ``drift:`` section of every run config (the monitor: :mod:`agentrt.controller.drift`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from agentrt.core.schema import ConfigModel

SIGNALS = ("response_length", "token_entropy", "topic", "reward")


class SignalTest(ConfigModel):
    """The test that compares a signal's recent window with its reference."""

    test: Literal["psi", "ks", "centroid"] = Field(
        "ks", description="'psi': population stability index over quantile bins, flagged above "
        "threshold; 'ks': two-sample Kolmogorov-Smirnov, flagged when p < alpha; 'centroid' "
        "(topic only): embedding centroid distance, block-bootstrap p < alpha.")
    bins: int = Field(10, ge=2, le=100, description="psi: quantile bins of the reference.")
    threshold: float = Field(0.25, gt=0.0, description="psi: flag a step above this PSI "
                             "(0.1 moderate, 0.25 a significant shift, by the usual rule).")
    alpha: float = Field(1e-3, gt=0.0, lt=1.0, description="ks, centroid: flag a step when "
                         "p < alpha (centroid's smallest p is 1/1001).")
    min_change: float = Field(0.0, ge=0.0, description="An effect size on top of the test "
                              "(0: off). psi, ks: flag a step only when the recent mean also "
                              "differs from the reference mean by more than this fraction of "
                              "it; centroid: only when the centroids' cosine distance is above "
                              "this.")

def _default_signals() -> dict[str, SignalTest]:
    """All four; all but reward with an effect size too (why: docs/drift.md, Figures)."""
    return {"response_length": SignalTest(test="psi", min_change=0.2),
            "token_entropy": SignalTest(min_change=0.3),
            "topic": SignalTest(test="centroid", min_change=0.02),
            "reward": SignalTest(test="psi")}

class DriftConfig(ConfigModel):
    """Drift detection on the learning policies' rollouts (agentrt.controller.drift, docs/drift.md)."""

    enabled: bool = Field(False, description="Watch the rollouts for drift.")
    signals: dict[str, SignalTest] = Field(
        default_factory=_default_signals, description="Signals to watch and the test of each: "
        f"{', '.join(SIGNALS)}.")
    reference: Literal["trailing", "fixed"] = Field(
        "trailing", description="'trailing': the reference is the reference_steps steps just "
        "before the recent window (slow change while learning is not drift); 'fixed': the "
        "first reference_steps steps after warm-up.")
    warmup_steps: int = Field(0, ge=0, description="Steps skipped before the reference window.")
    reference_steps: int = Field(20, gt=0, description="Steps in the reference window.")
    window_steps: int = Field(6, gt=0, description="Recent steps compared with the reference.")
    patience: int = Field(3, gt=0, description="Flagged steps in a row that make an alert.")
    action: Literal["log", "pause", "rollback", "retrain"] = Field(
        "log", description="On an alert: log it; pause the run; roll the policies back to the "
        "last checkpoint before the drift; or roll back and train those steps again.")
    max_actions: int = Field(3, gt=0, description="Rollbacks/retrains before an alert pauses.")
    embedder: str = Field("minilm", description="Embedder of the topic signal "
                          "(agentrt.memory.embedders: minilm, hashing).")

    @field_validator("embedder")
    @classmethod
    def _embedder(cls, name: str) -> str:
        from agentrt.memory.embedders import EMBEDDERS

        try:
            EMBEDDERS.get(name)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        return name

    @field_validator("signals")
    @classmethod
    def _known(cls, signals: dict[str, SignalTest]) -> dict[str, SignalTest]:
        unknown = sorted(set(signals) - set(SIGNALS))
        if unknown:
            raise ValueError(f"unknown signal {unknown[0]!r}; choose from {', '.join(SIGNALS)}")
        if not signals:
            raise ValueError("give at least one signal, or set drift.enabled: false")
        for name, test in signals.items():
            if (name == "topic") != (test.test == "centroid"):
                raise ValueError(f"signals.{name}: the topic signal takes test 'centroid' and "
                                 "the others 'psi' or 'ks'")
        return signals
