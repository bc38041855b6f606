"""Online control (agentrt.controller.control): a real ``agentrt train`` process on llama-nano takes
commands through its HTTP endpoint (``agentrt ctl``) and a real Redis stream while it runs.

One scenario, run once for the module: the run starts paused (``control.start_paused``), is told
to pause again before step 11 and resumed; while it holds there it gets an unauthenticated
request, a bad value, a field that is not live, an unknown episode, a batch size and a
temperature, feedback for the 100 latest episodes and for one too old, and a learning rate
through the Redis stream; then it finishes, and is resumed for two more steps with control off.
The tests read what it wrote: metrics.jsonl and the episode log.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis
import yaml

from agentrt.cli import main
from agentrt.config.load import load_config
from agentrt.controller.control.client import send
from agentrt.controller.episodes import EpisodeLog
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

STEPS, PROMPTS, GROUP, PAUSE, STALENESS, MAX_GROUPS = 14, 2, 8, 11, 8, 10


def ctl(*args: str) -> tuple[int, str, str]:
    """``agentrt ctl ARGS`` in this process through the real entry point."""
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["agentrt", "ctl", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def wait_for(what: str, check: Any, proc: subprocess.Popen, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def raw_post(url: str, body: dict[str, Any], token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + "/commands", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from agentrt.testing.redis_server import RedisServer
    from agentrt.policies.models import build_model

    base = tmp_path_factory.mktemp("control")
    nano = build_model(base / "nano", "llama-nano", seed=0)
    run = base / "run"
    server = RedisServer().start()
    config = {"seed": 0, "run_dir": str(run), "progress": False, "threads": 1,
              "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4},
              "policy": {"id": "arith", "model": {"path": str(nano)},
                         "rollout": {"sampling": {"max_new_tokens": 3, "temperature": 0.9}}},
              "train": {"steps": STEPS, "prompts_per_step": PROMPTS, "group_size": GROUP},
              "eval": {"every": 100}, "checkpoint": {"every": 5, "keep": 3},
              "control": {"enabled": True, "start_paused": True,
                          "feedback": {"max_staleness": STALENESS,
                                       "max_groups_per_step": MAX_GROUPS},
                          "redis": {"url": server.url, "stream": "ctl"}}}
    path = base / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_CTL_TOKEN"}
    rec: dict[str, Any] = {"run": run, "config": path}
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "train", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoint = wait_for("control.json", lambda: (run / "control.json").is_file()
                            and json.loads((run / "control.json").read_text()), proc)
        rec["endpoint"], rec["mode"] = endpoint, (run / "control.json").stat().st_mode & 0o777
        rec["unauthenticated"] = raw_post(endpoint["url"], {"cmd": "set", "values": {
            "train.prompts_per_step": 5}}, None)
        rec["wrong_token"] = raw_post(endpoint["url"], {"cmd": "set", "values": {
            "train.prompts_per_step": 5}}, "not-the-token")
        rec["pause"] = ctl(str(run), "pause", "--at-step", str(PAUSE))
        rec["resume_start"] = ctl(str(run), "resume")
        wait_for(f"the pause before step {PAUSE}", lambda: (
            (s := send(run, None))["paused"] and s["next_step"] == PAUSE), proc)
        rec["bad_value"] = ctl(str(run), "set", "train.prompts_per_step=0")
        rec["ctl_table"] = {" ".join(args): (ctl(str(run), *args), words)
                            for args, words in CTL_BAD}
        rec["not_live"] = ctl(str(run), "set", "policy.optim.betas=[0.8, 0.9]")
        rec["unknown_episode"] = ctl(str(run), "feedback", "s99-0", "1.0")
        rec["status_before"] = send(run, None)
        rec["set"] = ctl(str(run), "set", "train.prompts_per_step=3",
                         "policy.rollout.sampling.temperature=0.7")
        ids = [e.id for e in EpisodeLog(run) if e.step < PAUSE][-100:]
        rec["feedback_ids"] = ids
        for eid in ids[:-1]:
            send(run, {"cmd": "feedback", "episode": eid, "value": 1.0})
        rec["feedback_cli"] = ctl(str(run), "feedback", ids[-1], "1")
        rec["old"] = ctl(str(run), "feedback", "s1-0", "1.0")
        rec["inject"] = ctl(str(run), "inject", "97+1=", "--answer", "98")
        client = redis.Redis.from_url(server.url)
        client.xadd("ctl", {"json": json.dumps({"cmd": "set",
                                                "values": {"policy.optim.lr": 5e-4}})})
        replies = wait_for("the redis reply", lambda: client.xread({"ctl:replies": "0-0"},
                                                                   block=100), proc)
        rec["redis_reply"] = json.loads(replies[0][1][0][1][b"json"])
        rec["resume"] = ctl(str(run), "resume")
        rec["stderr"] = proc.communicate(timeout=300)[1]
        rec["returncode"] = proc.returncode
        rec["after_end"] = ctl(str(run), "status")
        rec["metrics"] = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl")
                                                   .read_text().splitlines())}
        rec["episodes"] = list(EpisodeLog(run))
        # a resume for two more steps (in this process), control off: the live values stay
        Trainer(load_config(path, [f"train.steps={STEPS + 2}", "control.enabled=false"], TrainConfig)).run()
        rec["metrics_resumed"] = {r["step"]: r for r in map(
            json.loads, (run / "metrics.jsonl").read_text().splitlines())}
        rec["episodes_resumed"] = list(EpisodeLog(run))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
    return rec


# agentrt ctl's bad input against a live (paused) run: (arguments, piece of the one error line).
# Sizes a run cannot hold and a max_new_tokens no prompt fits would have wedged the run or
# trained nothing (issue 41, finding 8); each is refused and changes nothing.
CTL_BAD = [
    (["set", "train.prompts_per_step=1000000000"], "train.prompts_per_step"),
    (["set", "train.group_size=100000"], "train.group_size"),
    (["set", "train.group_size=0"], "train.group_size"),
    (["set", "train.prompts_per_step=true"], "expected a number"),
    (["set", "train.prompts_per_step=2.5"], "train.prompts_per_step"),
    (["set", "policy.rollout.sampling.max_new_tokens=4096"], "leaves no room for a prompt"),
    (["set", "policy.rollout.sampling.max_new_tokens=0"], "max_new_tokens"),
    (["set", "policy.rollout.sampling.temperature=-1"], "temperature"),
    (["set", "policy.rollout.sampling.top_p=0"], "top_p"),
    (["set", "policy.optim.lr=-0.1"], "policy.optim.lr"),
    (["set", "policy.optim.lr=fast"], "policy.optim.lr"),
    (["set", "seed=5"], "cannot be changed while the run runs"),
    (["set", "nonsense.field=1"], "cannot be changed while the run runs"),
    (["set", "train.prompts_per_step"], "must look like"),
    (["set", "=3"], "must look like"),
    (["set", "train.prompts_per_step=[1"], "not valid YAML"),
    (["feedback", "s1-0", "nan"], "finite number"),
    (["feedback", "s1-0", "inf"], "finite number"),
    (["feedback", "../../etc/passwd", "1"], "no episode"),
    (["inject", "   "], "inject needs"),
    (["pause", "--at-step", "-3"], "step number >= 1"),
    (["pause", "--at-step", "0"], "step number >= 1"),
]


def by_step(episodes: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for e in episodes:
        out.setdefault(e.step, []).append(e)
    return out


def test_the_run_ends_normally_and_its_endpoint_with_it(scenario) -> None:
    assert scenario["returncode"] == 0, scenario["stderr"]
    assert "token" in scenario["endpoint"] and scenario["mode"] == 0o600
    assert scenario["endpoint"]["url"].startswith("http://127.0.0.1:")
    code, _, err = scenario["after_end"]
    assert code == 2 and err.count("\n") == 1 and "has no control endpoint" in err


def test_unauthenticated_request_is_refused_and_changes_nothing(scenario) -> None:
    for key in ("unauthenticated", "wrong_token"):
        status, body = scenario[key]
        assert status == 401 and "token" in body["error"] and "nothing" in body["error"]
    assert scenario["status_before"]["received"] == 2  # the two pause/resume commands only
    sizes = {step: len(eps) for step, eps in by_step(scenario["episodes"]).items()}
    assert 5 * GROUP not in sizes.values()


def test_refused_commands_are_one_line_and_change_nothing(scenario) -> None:
    for key, words in (("bad_value", "train.prompts_per_step"),
                       ("not_live", "cannot be changed while the run runs"),
                       ("unknown_episode", "no episode 's99-0'")):
        code, out, err = scenario[key]
        assert code == 2 and out == "" and err.count("\n") == 1 and words in err, (key, err)
    assert scenario["status_before"]["live"] == {}
    row = scenario["metrics"][PAUSE]
    assert "control/set/policy.optim.betas" not in row and "control/refused" not in row


def test_ctl_bad_input_table_is_one_line_each_and_changes_nothing(scenario) -> None:
    """Every row of CTL_BAD: exit 2, one ``error:`` line naming what is wrong, nothing on
    stdout, and the run's live values untouched (its status after them shows none)."""
    for line, ((code, out, err), words) in scenario["ctl_table"].items():
        assert code == 2 and out == "" and err.count("\n") == 1, (line, code, out, err)
        assert err.startswith("error: ") and words in err and "Traceback" not in err, (line, err)
    assert scenario["status_before"]["live"] == {}
    assert len(scenario["ctl_table"]) == len(CTL_BAD) >= 20


def test_batch_size_and_temperature_change_at_the_next_step(scenario) -> None:
    code, out, err = scenario["set"]
    assert code == 0 and f"applies at the start of step {PAUSE}" in out, err
    m = scenario["metrics"]
    assert m[PAUSE]["control/set/train.prompts_per_step"] == 3
    assert m[PAUSE]["control/set/policy.rollout.sampling.temperature"] == 0.7
    assert not any(k.startswith("control/set") for s in range(1, PAUSE) for k in m[s])
    steps = by_step(scenario["episodes"])
    for step in range(1, STEPS + 1):
        before = step < PAUSE
        assert len(steps[step]) == (PROMPTS if before else 3) * GROUP, step
        assert {e.sampling["temperature"] for e in steps[step]} == {0.9 if before else 0.7}


def test_learning_rate_through_the_redis_stream(scenario) -> None:
    assert scenario["redis_reply"]["applies_at_step"] == PAUSE
    m = scenario["metrics"]
    assert m[PAUSE]["control/set/policy.optim.lr"] == 5e-4
    assert m[PAUSE - 1]["actor/lr"] == pytest.approx(1e-4)
    assert all(m[s]["actor/lr"] == pytest.approx(5e-4) for s in range(PAUSE, STEPS + 1))


def test_feedback_for_100_episodes_is_trained_within_the_bound(scenario) -> None:
    ids = scenario["feedback_ids"]
    assert len(ids) == 100 and scenario["feedback_cli"][0] == 0 and scenario["old"][0] == 0
    episodes = {e.id: e for e in scenario["episodes"]}
    assert min(episodes[i].step for i in ids) >= PAUSE - STALENESS  # within the bound
    groups = sorted({(episodes[i].step, episodes[i].group_id) for i in ids})
    assert len(groups) == 13  # steps 4 (one group) to 10: the oldest 10 first, 3 a step later
    m = scenario["metrics"]
    for step, part in ((PAUSE, groups[:MAX_GROUPS]), (PAUSE + 1, groups[MAX_GROUPS:])):
        given = [i for i in ids if (episodes[i].step, episodes[i].group_id) in part]
        replayed = [e for e in scenario["episodes"] if (e.step, e.group_id) in part]
        row = m[step]
        assert row["control/feedback/applied"] == len(given)
        assert row["control/feedback/groups"] == len(part)
        assert row["control/feedback/trained"] == len(replayed) == len(part) * GROUP
        # trained on: the step's loss tokens are its own episodes' plus the replayed groups'
        own = [e for e in scenario["episodes"] if e.step == step]
        assert row["perf/train_tokens"] == sum(len(e.response_ids) for e in own + replayed)
    assert m[PAUSE]["control/feedback/applied"] + m[PAUSE + 1]["control/feedback/applied"] == 100
    assert m[PAUSE]["control/feedback/deferred"] == m[PAUSE + 1]["control/feedback/applied"]
    assert m[PAUSE]["control/feedback/dropped"] == 1  # s1-0: 10 steps old > 8
    assert m[PAUSE + 1]["control/feedback/dropped"] == 0
    assert "control/feedback/applied" not in m[PAUSE + 2]
    assert m[PAUSE + 2]["perf/train_tokens"] == sum(len(e.response_ids) for e in scenario[
        "episodes"] if e.step == PAUSE + 2)


def test_a_resume_keeps_the_live_values(scenario) -> None:
    m = scenario["metrics_resumed"]
    assert sorted(m) == list(range(STEPS + 3))
    assert all(m[s] == scenario["metrics"][s] for s in range(STEPS + 1))  # resumed, not redone
    steps = by_step(scenario["episodes_resumed"])
    for step in (STEPS + 1, STEPS + 2):
        assert len(steps[step]) == 3 * GROUP
        assert {e.sampling["temperature"] for e in steps[step]} == {0.7}
        assert m[step]["actor/lr"] == pytest.approx(5e-4)



def test_injected_prompt_is_the_next_steps_first(scenario) -> None:
    assert scenario["inject"][0] == 0
    assert scenario["metrics"][PAUSE]["control/inject/prompts"] == 1
    first = [e for e in scenario["episodes"] if e.step == PAUSE and e.idx < GROUP]
    assert {(e.prompt, e.info["answer"]) for e in first} == {("97+1=", "98")}
    assert not any(e.prompt == "97+1=" for e in scenario["episodes"] if e.step != PAUSE)
    assert scenario["metrics"][PAUSE]["reward/errors"] == 0  # the reward saw its answer


def test_a_run_that_does_not_answer_is_one_line(tmp_path) -> None:
    """A control.json left by a killed run: its port is closed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "control.json").write_text(json.dumps(
        {"url": f"http://127.0.0.1:{port}", "token": "x", "token_env": "AGENTRT_CTL_TOKEN"}))
    code, out, err = ctl(str(tmp_path), "set", "eval.every=5")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: the run in {tmp_path} is not running (nothing answers")
    code, _, err = ctl(str(tmp_path / "nowhere"), "status")
    assert code == 2 and "is not a folder" in err


def test_a_restarted_ray_worker_keeps_the_live_values(ray_session, tmp_path) -> None:
    """A live change made before the pool's recovery point survives a kill -9 of its worker:
    Ray restarts the actor with the config it started with, the pool applies the change again."""
    import signal

    from agentrt.config.sections import PolicyConfig, RuntimeConfig
    from agentrt.runtime.ray_pool import PolicyPool

    cfg = PolicyConfig(id="p", model={"preset": "llama-nano"}, optim={"lr": 1e-4})
    pool = PolicyPool([cfg], seed=0, total_steps=10, workdir=tmp_path,
                      runtime=RuntimeConfig(backend="ray"))
    try:
        sampling = cfg.rollout.sampling.model_copy(update={"max_new_tokens": 2})
        pool.reconfigure(cfg.model_copy(update={
            "optim": cfg.optim.model_copy(update={"lr": 5e-4}),
            "rollout": cfg.rollout.model_copy(update={"sampling": sampling})}))
        pool.state_dict()  # the recovery point, after the change
        os.kill(pool.pids[0], signal.SIGKILL)
        out = pool.generate([[1, 5, 6]] * 8)
        assert pool.worker_restarts == 1
        assert max(len(c.response_ids) for c in out) == 2  # not the default 32
        assert pool.state_dict()["policies"]["p"]["scheduler"]["base_lrs"] == [5e-4]
    finally:
        pool.shutdown()


def test_control_json_cannot_pick_a_secret_or_send_one_elsewhere(tmp_path, monkeypatch) -> None:
    """Issue 41 (2): whoever can write a shared run folder writes its control.json. agentrt ctl
    reads only AGENTRT_... variables and sends a token from the environment only to this
    machine; a real endpoint on loopback still gets it. The config refuses other names too."""
    import http.server
    import threading

    seen: list[str] = []

    class Catch(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Catch)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("MY_CLOUD_SECRET", "s3cr3t")
    monkeypatch.setenv("AGENTRT_CTL_TOKEN", "ctl-token")
    cases = [({"url": url, "token_env": "MY_CLOUD_SECRET"}, "only reads variables named"),
             ({"url": "http://198.51.100.7:8080", "token_env": "AGENTRT_CTL_TOKEN"},
              "points at '198.51.100.7', not this machine")]
    try:
        for endpoint, message in cases:
            (tmp_path / "control.json").write_text(json.dumps(endpoint))
            code, out, err = ctl(str(tmp_path), "status")
            assert code == 2 and err.count("\n") == 1 and message in err, err
        assert seen == []  # nothing was sent anywhere
        (tmp_path / "control.json").write_text(json.dumps(
            {"url": url, "token_env": "AGENTRT_CTL_TOKEN"}))
        assert send(tmp_path, None) == {"ok": True} and seen == ["Bearer ctl-token"]
    finally:
        server.shutdown()
    from agentrt.config.control import ControlConfig

    with pytest.raises(ValueError, match="token_env"):
        ControlConfig(enabled=True, token_env="MY_CLOUD_SECRET")
