"""The ``export:`` section of every run config (the exporters: :mod:`agentrt.controller.exporters`)."""

from __future__ import annotations

from pydantic import Field, field_serializer

from agentrt.core.schema import ConfigModel


class PrometheusConfig(ConfigModel):
    host: str = Field("127.0.0.1", description="Address the /metrics endpoint binds (0.0.0.0 "
                      "exposes it to the network: a scrape reads every metric of the run).")
    port: int = Field(9464, ge=0, le=65535, description="Port of /metrics (0: any free one).")

class MLflowConfig(ConfigModel):
    tracking_uri: str | None = Field(
        None, description="MLflow tracking and registry store (default: sqlite:///<run "
        "folder>/mlflow.db); any URI MLflow takes, e.g. http://host:5000.")
    experiment: str = Field("agentrt", min_length=1, description="MLflow experiment name.")
    register_models: bool = Field(
        True, description="Register each final model folder as a model version at the end.")
    model_prefix: str = Field("", description="Registered model name: <prefix><policy id>.")

    @field_serializer("tracking_uri", when_used="json")
    def _redacted_uri(self, uri: str | None) -> str | None:
        from agentrt.core.urls import redact  # a password in the URI stays out of files

        return None if uri is None else redact(uri)

class ExportConfig(ConfigModel):
    """Where a run's metrics go besides metrics.jsonl (agentrt.controller.exporters)."""

    prometheus: PrometheusConfig | None = Field(
        None, description="Serve the run's metrics for Prometheus while it runs ({} for the "
        "defaults: 127.0.0.1:9464).")
    mlflow: MLflowConfig | None = Field(
        None, description="Log the run to MLflow and register its final models ({} for the "
        "defaults: a SQLite store in the run folder).")
