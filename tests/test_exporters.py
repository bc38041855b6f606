"""Prometheus export: a run's metrics rows served at /metrics while it runs.

A real prometheus_client HTTP server on 127.0.0.1, scraped with urllib and parsed with
prometheus_client's own text parser; the run-level test scrapes a real ``agentrt train`` run.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrt.config.export import ExportConfig
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.core.errors import ConfigError
from agentrt.controller.exporters import Exporters, MLflowExporter, PrometheusExporter, model_folders

ROOT = Path(__file__).resolve().parents[1]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_rows_become_gauges_and_histograms() -> None:
    exp = PrometheusExporter("r1", port=0)
    try:
        assert exp.url.startswith("http://127.0.0.1:") and exp.url.endswith("/metrics")
        exp.emit(1, {"reward/mean": 0.25, "eval/accuracy": 0.5, "timing_s/rollout": 0.3,
                     "note": "text", "flag": True, "bad": float("nan")})
        exp.emit(2, {"reward/mean": 0.75, "timing_s/rollout": 3.0})
        got = scrape(exp.url)
    finally:
        exp.close()
    m = lambda name: got[("agentrt_metric", (("name", name), ("run", "r1")))]  # noqa: E731
    assert m("reward/mean") == 0.75 and m("eval/accuracy") == 0.5  # the latest value of each
    assert not any(dict(k[1]).get("name") in {"note", "flag", "bad"} for k in got)
    assert got[("agentrt_step", (("run", "r1"),))] == 2
    rollout = (("phase", "rollout"), ("run", "r1"))
    assert got[("agentrt_phase_seconds_count", rollout)] == 2
    assert got[("agentrt_phase_seconds_sum", rollout)] == pytest.approx(3.3)
    assert got[("agentrt_phase_seconds_bucket", (("le", "0.5"), *rollout))] == 1
    assert got[("agentrt_step_reward_count", (("run", "r1"),))] == 2


def test_a_taken_port_is_one_config_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"export.prometheus: cannot listen on "
                                              f"127.0.0.1:{port} .*pick another"):
            PrometheusExporter("r", port=port)


def test_nothing_is_served_unless_asked() -> None:
    assert Exporters(ExportConfig(), Path("runs/r")).sinks == []
    assert TrainConfig().export.prometheus is None
    cfg = TrainConfig.model_validate({"export": {"prometheus": {}}})
    assert (cfg.export.prometheus.host, cfg.export.prometheus.port) == ("127.0.0.1", 9464)


def test_the_grafana_dashboard_queries_what_is_exported() -> None:
    board = json.loads((ROOT / "examples" / "grafana" / "agentrt_dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs and all(any(n in e for n in ("agentrt_metric", "agentrt_step",
                                              "agentrt_phase_seconds", "agentrt_step_reward"))
                         for e in exprs)


def test_mlflow_logs_the_run_resumes_it_and_registers_the_final_models(tmp_path: Path,
                                                                       tiny_model_dir) -> None:
    """Real mlflow, its SQLite store in the run folder: params, metrics by step, provenance
    tags; a second exporter on the same folder (a resumed run) continues the same MLflow run;
    the final model folder becomes a registered model version with the same tags."""
    import shutil

    from mlflow import MlflowClient

    from agentrt.config.export import MLflowConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    text = "seed: 3\npolicy: {id: lm, optim: {lr: 0.001}}\n"
    exp = MLflowExporter(MLflowConfig(), run_dir, text)
    exp.emit(1, {"reward/mean": 0.25, "actor/loss@lm": 1.5, "note": "x"})
    exp.close(ok=False)  # killed
    again = MLflowExporter(MLflowConfig(), run_dir, text)
    assert again.run_id == exp.run_id
    again.emit(2, {"reward/mean": 0.5})
    shutil.copytree(tiny_model_dir, run_dir / "final_models" / "lm")
    assert model_folders(run_dir) == {"lm": run_dir / "final_models" / "lm"}
    again.finish()
    again.close()

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(exp.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["seed"] == "3" and run.data.params["policy.optim.lr"] == "0.001"
    assert run.data.tags["agentrt.run_dir"] == str(run_dir.resolve())
    history = [(m.step, m.value) for m in client.get_metric_history(exp.run_id, "reward/mean")]
    assert sorted(history) == [(1, 0.25), (2, 0.5)]
    assert client.get_metric_history(exp.run_id, "actor/loss.lm")[0].value == 1.5
    (version,) = client.search_model_versions("name = 'lm'")
    assert version.run_id == exp.run_id and version.source == str((run_dir / "final_models"
                                                                   / "lm").resolve())
    assert version.tags["agentrt.step"] == "2" and version.tags["agentrt.policy"] == "lm"
    assert version.tags["agentrt.config_hash"] == run.data.tags["agentrt.config_hash"]
    assert version.tags["agentrt.code_version"] == run.data.tags["agentrt.code_version"] != ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_running_train_run_is_scraped_and_logged_to_mlflow(tmp_path: Path,
                                                             tiny_model_dir) -> None:
    """`agentrt train` from config alone: /metrics answers while the run runs (scraped until
    a step has been exported), and the finished run is an MLflow run whose final model is a
    registered model version tagged with its provenance."""
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient

    port = free_port()
    run_dir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(f"""
run_dir: {run_dir}
progress: false
threads: 1
task: {{name: arithmetic, train_size: 64, eval_size: 8}}
policy:
  id: arith
  model: {{path: {tiny_model_dir}}}
  rollout: {{sampling: {{max_new_tokens: 4}}}}
train: {{steps: 6, prompts_per_step: 4, group_size: 2}}
eval: {{every: 3}}
export:
  prometheus: {{port: {port}}}
  mlflow: {{model_prefix: "arith-"}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "train", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    while proc.poll() is None and seen.get(("agentrt_step", (("run", "run"),)), 0) < 1:
        try:
            seen = scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            pass  # not listening yet
        time.sleep(0.2)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert seen.get(("agentrt_step", (("run", "run"),)), 0) >= 1, "never scraped a step"
    assert (("agentrt_metric", (("name", "reward/mean"), ("run", "run"))) in seen)

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("agentrt").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["policy.id"] == "arith"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    (version,) = client.search_model_versions("name = 'arith-arith'")
    assert version.source == str((run_dir / "final_model").resolve())
    assert version.tags["agentrt.step"] == "6"
    ident = json.loads((run_dir / "run.json").read_text())
    assert version.tags["agentrt.config_hash"] == ident["config_sha256"]
