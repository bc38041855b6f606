"""Runs across Ray nodes: a head and two worker nodes started as separate raylets on this machine
(agentrt.testing.ray_cluster). `agentrt train` and `agentrt tournament run` join the cluster as
a user's driver does (`runtime.address`), pools are pinned to chosen nodes (`resources.custom`),
and a worker node killed mid-run costs time, not records."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agentrt.config.load import load_config, validate_config
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir
from agentrt.testing.ray_cluster import LocalRayCluster
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.workloads.prompts.workload import Trainer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Timing and machine figures differ between any two runs; everything else must be equal.
MACHINE = ("timing_s/", "perf/", "runtime/")


@pytest.fixture(scope="module")
def cluster():
    """Head (no CPUs: the driver's node; its dashboard takes `ray job submit`) + node_0 and
    node_1 (2 CPUs each)."""
    with LocalRayCluster([{}, {}], cpus_per_node=2, dashboard=True) as c:
        yield c


class Driver:
    """An agentrt command joined to the cluster, its stderr read as it comes."""

    def __init__(self, cluster: LocalRayCluster, args: list[str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=cluster.environ())
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr),
                                       daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str, timeout_s: float = 240) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            assert self.proc.poll() is None, "".join(self.lines)[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in:\n" + "".join(self.lines)[-3000:])

    def finish(self, timeout_s: float = 600) -> str:
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.reader.join(timeout=10)
        err = "".join(self.lines)
        assert self.proc.returncode == 0, err[-3000:]
        return err


def node_of(cluster: LocalRayCluster, driver: Driver, pool: str) -> int:
    """The worker node (index) that runs ``pool``'s worker: the process group of its pid."""
    pid = int(driver.wait_for(rf"pool '{pool}': 1 workers up \(pids \[(\d+)\]").group(1))
    node = cluster.node_of(pid)
    assert node is not None, f"pid {pid} is on no worker node"
    return node


def same_rows(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key, value in rb.items():
            if key.startswith(MACHINE) or key.endswith(("/latency_s", "/down_s")) or key == "time":
                continue
            # Ray workers run 1 torch thread: float sums may differ in the last bits
            assert ra[key] == pytest.approx(value, abs=1e-5), (ra["step"], key)


# ------------------------------------------------------------------------- lost results
# A driver that calls an actor on node_1 and waits until its result (1 MB: kept in node_1's
# object store, not inlined) is made; node_1 is then lost before the driver fetched it.
LOST_RESULT = """
import sys, numpy as np, ray
from agentrt.runtime.ray_pool import WorkerLost, gather
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
@ray.remote(num_cpus=0.01, resources={"node_1": 0.01}, max_restarts=0)
class Maker:
    def make(self):
        return np.ones(1 << 18, dtype=np.float32)
ref = Maker.remote().make.remote()
ray.wait([ref], num_returns=1, fetch_local=False)
print("ready", flush=True)
sys.stdin.readline()  # the node is killed now
try:
    gather([ref], timeout_s=30)
    print("fetched")
except WorkerLost as exc:
    print("WorkerLost", str(exc).splitlines()[0][:80])
"""


def test_a_result_lost_with_its_node_before_it_was_fetched_is_a_lost_worker(cluster):
    """The pool's gather reads such a loss (Ray's ObjectLostError: an actor's result cannot be
    made again) as a lost worker, which the pool recovers from, instead of failing the run with
    Ray's error: a CI run's node kill fell between the PPO worker's reply and the driver's
    fetch (its gather also fetched every result a second time, after the loop: once now)."""
    proc = subprocess.Popen([sys.executable, "-c", LOST_RESULT, cluster.address],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=cluster.environ())
    try:
        assert proc.stdout.readline().strip() == "ready"
        cluster.kill_node(1)
        out, _ = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.restart_node(1)
    last = out.strip().splitlines()[-1]  # Ray prints the node's death to stdout before it
    assert last.startswith("WorkerLost worker 0 died: Failed to retrieve object"), out


# ---------------------------------------------------------------------------------- GRPO
def grpo(run_dir: Path, model_dir: Path, **policy) -> dict:
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False,
        "task": {"name": "arithmetic", "train_size": 200, "eval_size": 8},
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "micro_batch_size": 8, **policy,
                   "algorithm": {"name": "grpo", "kl": {"coef": 0.01}, "mini_batches": 2},
                   "rollout": {"sampling": {"max_new_tokens": 4}}},
        "sft": {"steps": 1, "batch_size": 8},
        "train": {"steps": 3, "prompts_per_step": 4, "group_size": 4},
        "eval": {"every": 3}, "checkpoint": {"every": 1},
    }


@pytest.fixture(scope="module")
def local_grpo(tmp_path_factory, tiny_model_dir) -> list[dict]:
    run_dir = tmp_path_factory.mktemp("grpo_local")
    Trainer(validate_config(grpo(run_dir, tiny_model_dir), TrainConfig)).run()
    return RunDir(run_dir).read_metrics()


def test_grpo_on_a_chosen_node_of_three_keeps_the_records_of_a_local_run(
        cluster, tmp_path, tiny_model_dir, local_grpo):
    cfg = grpo(tmp_path, tiny_model_dir, resources={"custom": {"node_1": 0.01}})
    cfg["runtime"] = {"backend": "ray", "address": cluster.address}
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(cfg))
    driver = Driver(cluster, ["train", str(tmp_path / "grpo.yaml")])
    assert node_of(cluster, driver, "policy") == 1  # resources.custom placed it
    driver.finish()
    rows = RunDir(tmp_path).read_metrics()
    assert rows[-1]["runtime/worker_restarts"] == 0.0  # a Ray pool, never restarted
    same_rows(rows, local_grpo)


def test_grpo_through_ray_job_submit_keeps_the_records_of_a_local_run(
        cluster, tmp_path, tiny_model_dir, local_grpo):
    """The way a KubeRay RayJob or a verl user starts a run: the driver is the job's entrypoint
    on the head (runtime.address: auto reads the RAY_ADDRESS the job server sets)."""
    cfg = grpo(tmp_path / "run", tiny_model_dir)
    cfg["runtime"] = {"backend": "ray", "address": "auto"}
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(cfg))
    ray = Path(sys.executable).with_name("ray")
    out = subprocess.run(
        [str(ray), "job", "submit", "--address", cluster.dashboard_url, "--submission-id",
         "agentrt-grpo", "--", sys.executable, "-m", "agentrt.cli", "train",
         str(tmp_path / "grpo.yaml")],
        env=cluster.environ(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "'agentrt-grpo' succeeded" in out.stdout, \
        (out.stdout + out.stderr)[-3000:]
    rows = RunDir(tmp_path / "run").read_metrics()
    assert "runtime/worker_restarts" in rows[-1]  # its pool was Ray actors
    same_rows(rows, local_grpo)


# ---------------------------------------------------------------------------------- league
def league(run_dir: Path, *over: str) -> list[str]:
    return [f"run_dir={run_dir}", "progress=false", "threads=1", "warm_start.steps=0",
            "train.steps=4", "train.games_per_step=16", "eval.every=4", "eval.games=20",
            "checkpoint.every=2", *over]


def records(run_dir: Path) -> list:
    with MatchStore(run_dir) as store:
        return sorted((r.match.match_id, r.match.keys, r.scores, step)
                      for r, step in store.results())


def weights(run_dir: Path) -> dict:
    pools = load_checkpoint(RunDir(run_dir).checkpoints()[-1])["pools"]
    return {p: pools[p]["policies"][p]["model"] for p in ("ppo", "dpo")}


@pytest.fixture(scope="module")
def local_league(tmp_path_factory) -> Path:
    """examples/ttt_ppo_dpo.yaml (two pools: PPO and DPO), 4 short steps in this process."""
    run_dir = tmp_path_factory.mktemp("league_local")
    LeagueTrainer(load_config(EXAMPLES / "ttt_ppo_dpo.yaml", league(run_dir),
                              TournamentRunConfig)).run()
    return run_dir


def run_league(cluster: LocalRayCluster, run_dir: Path, *over: str) -> Driver:
    # a result Ray cannot fetch within 60 s (not 300) is a lost worker: a pull from a surviving
    # node after a node loss was seen to hang, and the run must recover inside the test's time
    sets = league(run_dir, "runtime.backend=ray", f"runtime.address={cluster.address}",
                  "runtime.collective_timeout_s=60", *over)
    return Driver(cluster, ["tournament", "run", str(EXAMPLES / "ttt_ppo_dpo.yaml"),
                            *(a for s in sets for a in ("--set", s))])


def same_league(run_dir: Path, local: Path) -> list[dict]:
    assert len(records(local)) == 4 * 16 and records(run_dir) == records(local)
    rows = RunDir(run_dir).read_metrics()
    same_rows(rows, RunDir(local).read_metrics())
    ours, theirs = weights(run_dir), weights(local)
    for pid in ("ppo", "dpo"):
        worst = max(float((ours[pid][k] - theirs[pid][k]).abs().max()) for k in theirs[pid])
        assert worst < 1e-5, (pid, worst)
    return rows


def test_a_league_with_its_pools_on_two_nodes_keeps_the_records_of_a_local_run(
        cluster, tmp_path, local_league):
    driver = run_league(cluster, tmp_path, "policies.0.resources.custom={node_0: 0.01}",
                        "policies.1.resources.custom={node_1: 0.01}")
    assert (node_of(cluster, driver, "ppo"), node_of(cluster, driver, "dpo")) == (0, 1)
    driver.finish()
    rows = same_league(tmp_path, local_league)
    assert rows[-1]["runtime/worker_restarts@ppo"] == 0.0


def test_a_worker_node_lost_mid_league_costs_time_not_records(cluster, tmp_path, local_league):
    """Killing the raylet of the node that runs PPO's pool (and every process on it): Ray moves
    the pool's placement-group bundle to the other node and restarts its worker there, the pool
    restores its last checkpoint and replays its journal (samples included, so its RNG is where
    the lost worker's was), and the run ends with the uninterrupted run's matches and weights."""
    driver = run_league(cluster, tmp_path)
    lost = node_of(cluster, driver, "ppo")
    deadline = time.monotonic() + 240
    while len(RunDir(tmp_path).read_metrics()) < 2:  # step 1 done: mid-run
        assert time.monotonic() < deadline and driver.proc.poll() is None, "".join(driver.lines)
        time.sleep(0.2)
    cluster.kill_node(lost)
    try:
        err = driver.finish()
    finally:
        cluster.restart_node(lost)  # the next test has both nodes again
    assert "Restarting its workers" in err
    rows = same_league(tmp_path, local_league)
    assert rows[-1]["runtime/worker_restarts@ppo"] >= 1.0
    lost_s = rows[-1]["runtime/recovery_s@ppo"]
    assert lost_s > 0.0
    print(f"node_{lost} lost after step 1: {lost_s:.1f} s lost to the recovery")
