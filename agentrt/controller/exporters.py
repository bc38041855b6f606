"""Metrics exporters: every metrics row the controller logs also goes to Prometheus and MLflow.

``export.prometheus`` in any run config serves the run's metrics at ``http://HOST:PORT/metrics``
(127.0.0.1 by default) while the run lives, for a Prometheus scrape and a Grafana dashboard
(``examples/grafana_dashboard.json``):

- ``agentrt_metric{run, name}``: the latest value of every numeric metric of the run
  (``name`` is the metrics.jsonl key, e.g. ``reward/mean``, ``eval/win_rate_vs_random``);
- ``agentrt_step{run}``: the last step logged;
- ``agentrt_phase_seconds{run, phase}``: a histogram of each step's time per phase (rollout,
  train, eval, ...: the ``timing_s/`` keys), the rollout latency a dashboard plots;
- ``agentrt_step_reward{run}``: a histogram of each step's mean reward (``reward/mean``, or the
  mean over policies of a league's ``reward/mean@<id>``).

The exporter binds only the address configured; a port already in use is one config error
before any work starts.

``export.mlflow`` logs the run to MLflow through its client (no global state): the resolved
config as params, each metrics row as metrics at its step, the config hash and code version as
tags; a resumed run continues the same MLflow run. At the end each final model folder of the
run becomes a version of the registered model ``<model_prefix><policy id>``, tagged with the
run folder, step, config hash and code version. The default store is ``sqlite:///<run
folder>/mlflow.db`` (``mlflow ui --backend-store-uri`` reads it).
"""

from __future__ import annotations

import hashlib
import logging
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from agentrt.controller.identity import flatten, read_identity
from agentrt.core.errors import ConfigError

log = logging.getLogger(__name__)

PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
REWARD_BUCKETS = (-10, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 2, 10)


class PrometheusExporter:
    """Serves the run's latest metrics on ``host:port`` (port 0: a free one, see :attr:`url`)."""

    def __init__(self, run: str, host: str = "127.0.0.1", port: int = 9464) -> None:
        from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

        self.run = run
        self.registry = CollectorRegistry()
        self.metric = Gauge("agentrt_metric", "Latest value of a run metric (metrics.jsonl key)",
                            ["run", "name"], registry=self.registry)
        self.step = Gauge("agentrt_step", "Last step logged", ["run"], registry=self.registry)
        self.phase = Histogram("agentrt_phase_seconds", "Seconds per step spent in each phase",
                               ["run", "phase"], buckets=PHASE_BUCKETS, registry=self.registry)
        self.reward = Histogram("agentrt_step_reward", "Mean reward of each step", ["run"],
                                buckets=REWARD_BUCKETS, registry=self.registry)
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"export.prometheus: cannot listen on {host}:{port} ({exc.strerror})"
                              "; pick another export.prometheus.port") from None
        self.url = f"http://{host}:{self.server.server_port}/metrics"
        log.info("prometheus metrics of run %s at %s", run, self.url)

    def emit(self, step: int, metrics: dict[str, Any]) -> None:
        self.step.labels(self.run).set(step)
        rewards = []
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            self.metric.labels(self.run, name).set(value)
            if name.startswith("timing_s/"):
                self.phase.labels(self.run, name.removeprefix("timing_s/")).observe(value)
            if name == "reward/mean" or name.startswith("reward/mean@"):
                rewards.append(value)
        if rewards:
            self.reward.labels(self.run).observe(sum(rewards) / len(rewards))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def code_version() -> str:
    """The git commit of the agentrt checkout (with ``+dirty`` when it has changes), else the
    package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=root, capture_output=True, text=True, timeout=10).stdout
            return head.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from agentrt import __version__

    return f"agentrt {__version__}"


def model_folders(run_dir: Path) -> dict[str, Path]:
    """Policy id -> final model folder of a finished run of any kind (train: ``final_model``,
    tournament: ``final_models/<id>``, decompose: ``final/<id>``)."""
    found = {}
    if (run_dir / "final_model").is_dir():
        found[_policy_of_train_run(run_dir)] = run_dir / "final_model"
    for parent in ("final_models", "final"):
        for folder in sorted((run_dir / parent).glob("*")):
            if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
                found[folder.name] = folder
    return found


def _policy_of_train_run(run_dir: Path) -> str:
    try:
        return yaml.safe_load((run_dir / "config.yaml").read_text())["policy"]["id"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return "policy"


class MLflowExporter:
    """Logs one agentrt run as one MLflow run and registers its final models."""

    def __init__(self, cfg: Any, run_dir: Path, config_text: str) -> None:
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise ConfigError("export.mlflow needs mlflow: pip install 'agentrt[mlflow]'"
                              ) from None
        self.cfg, self.run_dir = cfg, run_dir
        uri = cfg.tracking_uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        held = read_identity(run_dir)  # run.json: the hash a resume is checked against
        self.config_hash = (held["config_sha256"] if held else
                            hashlib.sha256(config_text.encode()).hexdigest())
        self.code = code_version()
        self.step = 0
        exp = self.client.get_experiment_by_name(cfg.experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(cfg.experiment)
        folder = str(run_dir.resolve())
        previous = self.client.search_runs(
            [exp_id], filter_string=f"tags.`agentrt.run_dir` = '{folder}'", max_results=1,
            order_by=["attributes.start_time DESC"])
        if previous:  # a resumed run continues its MLflow run
            self.run_id = previous[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"agentrt.run_dir": folder, "agentrt.config_hash": self.config_hash,
                "agentrt.code_version": self.code, "mlflow.runName": run_dir.name}
        self.run_id = self.client.create_run(exp_id, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(k[:250], str(v)[:6000]) for k, v in
                  flatten(yaml.safe_load(config_text) or {}).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def emit(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_mlflow_key(k), float(v), now, step) for k, v in metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        for i in range(0, len(rows), 500):
            self.client.log_batch(self.run_id, metrics=rows[i:i + 500])
        self.step = step

    def finish(self) -> None:
        """Registers each final model folder as a model version tagged with its provenance."""
        if not self.cfg.register_models:
            return
        from mlflow.exceptions import MlflowException

        for pid, folder in model_folders(self.run_dir).items():
            name = f"{self.cfg.model_prefix}{pid}"
            try:
                self.client.get_registered_model(name)
            except MlflowException:
                self.client.create_registered_model(name)
            self.client.create_model_version(
                name, source=str(folder.resolve()), run_id=self.run_id,
                tags={"agentrt.run_dir": str(self.run_dir.resolve()), "agentrt.policy": pid,
                      "agentrt.step": str(self.step), "agentrt.config_hash": self.config_hash,
                      "agentrt.code_version": self.code})

    def close(self, ok: bool = True) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


def _mlflow_key(name: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / space``; ``@`` of per-policy keys -> ``.``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "." for c in name)


class Exporters:
    """The exporters an ``export:`` section asks for; :meth:`emit` sends a row to each."""

    def __init__(self, cfg: Any | None, run_dir: Path, config_text: str = "") -> None:
        self.sinks: list[Any] = []
        if cfg is None:
            return
        if cfg.prometheus is not None:
            p = cfg.prometheus
            self.sinks.append(PrometheusExporter(run_dir.name, host=p.host, port=p.port))
        if cfg.mlflow is not None:
            self.sinks.append(MLflowExporter(cfg.mlflow, run_dir, config_text))

    def emit(self, step: int, metrics: dict[str, Any]) -> None:
        for sink in self.sinks:
            try:
                sink.emit(step, metrics)
            except Exception as exc:  # an exporter never stops the run
                log.warning("exporter %s failed at step %d: %s", type(sink).__name__, step, exc)

    def finish(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "finish"):
                try:
                    sink.finish()
                except Exception as exc:
                    log.warning("exporter %s failed at the end of the run: %s",
                                type(sink).__name__, exc)

    def close(self, ok: bool = True) -> None:
        for sink in self.sinks:
            try:
                sink.close(ok) if isinstance(sink, MLflowExporter) else sink.close()
            except Exception as exc:
                log.warning("exporter %s failed to close: %s", type(sink).__name__, exc)
        self.sinks = []
