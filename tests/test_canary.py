"""Canary releases (issue 15, must-show 2).

The statistics (agentrt.serving.canary_stats) with fixed seeds: the maximum sample size is the normal
approximation's fixed-sample size times the design's inflation, checked here from the formula
with the standard library; a planted better candidate is promoted and a planted worse one rolled
back, each within that maximum; a few hundred seeded simulations give the stated error rates.

End to end: a real `agentrt serve` process with three real LoRA adapters of llama-nano, the real
`openai` client and a seeded user simulator whose satisfaction depends on the version that
answered (the planted quality): the better candidate is promoted while requests run (none fails,
later ones are answered by it); a worse one, scored by a real reward function on the response
text, is rolled back and unloaded; the canary log holds every look with its evidence.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import NormalDist

import httpx
import numpy as np
import pytest

from agentrt.serving.canary_stats import CanaryTest, SequentialTest, design
from agentrt.config.rollout import SamplingConfig
from agentrt.policies.models import build_model
from agentrt.serving.protocol import encode_text
from test_cli_check import run_cli
from test_serve import PROMPTS, TOKEN, Server, client, lora_engine

N = NormalDist()
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6)


def fixed_samples(alpha: float, power: float, margin: float, share: float,
                  sigma: float = 0.5) -> float:
    """Both arms' samples of the one-look non-inferiority z-test (normal approximation):
    Var(mean_c - mean_i) = sigma^2 / (s N) + sigma^2 / ((1 - s) N) = sigma^2 / (s (1 - s) N)."""
    z = N.inv_cdf(1 - alpha) + N.inv_cdf(power)
    return (z * sigma / margin) ** 2 / (share * (1 - share))


def simulate(test: CanaryTest, p_candidate: float, p_incumbent: float, seed: int,
             beta: bool = False):
    """Feeds one seeded stream of samples (Bernoulli, or Beta with those means) until the test
    decides; returns the final Decision and every Decision."""
    rng = np.random.default_rng(seed)
    seq = SequentialTest(test)
    n = seq.design.max_samples
    arms = rng.random(n) < test.share
    if beta:  # rewards in [0, 1] with the given means (concentration 4)
        values = np.where(arms, rng.beta(4 * p_candidate, 4 * (1 - p_candidate), n),
                          rng.beta(4 * p_incumbent, 4 * (1 - p_incumbent), n))
    else:
        values = (rng.random(n) < np.where(arms, p_candidate, p_incumbent)).astype(float)
    for arm, x in zip(arms, values):
        seq.add("candidate" if arm else "incumbent", float(x))
        if seq.final is not None:
            return seq.final, seq.decisions
    raise AssertionError("no decision by the maximum sample size")


@pytest.mark.parametrize("alpha,power,margin,share", [(0.05, 0.9, 0.05, 0.05),
                                                      (0.025, 0.8, 0.1, 0.5),
                                                      (0.1, 0.95, 0.02, 0.2)])
def test_max_samples_is_the_normal_approximation_times_the_inflation(alpha, power, margin, share):
    one = design(CanaryTest(alpha=alpha, power=power, margin=margin, share=share, looks=1))
    assert one.max_samples == math.ceil(fixed_samples(alpha, power, margin, share))
    assert one.promote_at == one.rollback_at == pytest.approx((N.inv_cdf(1 - alpha),))
    five = design(CanaryTest(alpha=alpha, power=power, margin=margin, share=share, looks=5))
    want = fixed_samples(alpha, power, margin, share)
    assert five.fixed_samples == pytest.approx(want)
    assert 1.0 < five.inflation < 1.2  # group-sequential designs with 5 looks: about 1.1
    assert five.max_samples == math.ceil(want * five.inflation)
    assert five.promote_at[-1] == pytest.approx(five.rollback_at[-1])  # a decision at the end
    assert all(lo < hi for lo, hi in zip(five.rollback_at[:-1], five.promote_at[:-1]))
    half = design(CanaryTest(alpha=alpha, power=power, margin=margin, share=share, looks=5,
                             sigma=0.25))
    assert half.max_samples == math.ceil(want / 4 * five.inflation)


@pytest.mark.parametrize("beta", [False, True], ids=["bernoulli", "bounded"])
def test_planted_better_is_promoted_and_worse_rolled_back_within_the_bound(beta):
    test = CanaryTest(share=0.1, margin=0.05, alpha=0.05, power=0.9, looks=5)
    bound = design(test).max_samples
    assert bound <= math.ceil(fixed_samples(0.05, 0.9, 0.05, 0.1) * 1.2)
    for seed in range(5):
        better, _ = simulate(test, 0.7, 0.6, seed, beta)
        worse, _ = simulate(test, 0.5, 0.6, seed, beta)
        assert better.decision == "promote", better.rule
        assert worse.decision == "rollback", worse.rule
        for d in (better, worse):
            assert sum(d.samples.values()) <= bound
            assert d.samples["candidate"] > 0 and d.samples["incumbent"] > 0
        assert better.p_value <= 0.05 < worse.p_value
        print(f"seed {seed} ({'beta' if beta else 'bernoulli'}): promoted after "
              f"{sum(better.samples.values())}, rolled back after "
              f"{sum(worse.samples.values())} samples (bound {bound})")


def test_error_rates_over_seeded_simulations():
    """Equal arms are promoted at about the stated power (false rollbacks at 1 - power); a
    candidate worse by exactly the margin is promoted at about alpha."""
    test = CanaryTest(share=0.3, margin=0.1, alpha=0.05, power=0.9, looks=5)
    runs = 1000
    equal = [simulate(test, 0.5, 0.5, seed)[0] for seed in range(runs)]
    worse = [simulate(test, 0.4, 0.5, 10_000 + seed)[0] for seed in range(runs)]
    false_rollback = sum(d.decision == "rollback" for d in equal) / runs
    false_promote = sum(d.decision == "promote" for d in worse) / runs
    mean_n = np.mean([sum(d.samples.values()) for d in equal + worse])
    print(f"\nfalse rollback rate {false_rollback:.3f} (design {1 - test.power:.2f}), "
          f"false promotion rate {false_promote:.3f} (alpha {test.alpha}), mean samples "
          f"{mean_n:.0f} of at most {design(test).max_samples}, {runs} seeds each")
    sd = lambda p: math.sqrt(p * (1 - p) / runs)  # noqa: E731
    assert abs(false_rollback - (1 - test.power)) <= 3 * sd(1 - test.power)
    assert false_promote <= test.alpha + 3 * sd(test.alpha)
    assert max(sum(d.samples.values()) for d in equal + worse) <= design(test).max_samples


def test_p_value_and_evidence():
    test = CanaryTest(looks=1, share=0.5, margin=0.1)
    seq = SequentialTest(test)
    for x in (1.0, 0.0, 1.0, 1.0):
        seq.add("candidate", x)
    for x in [1.0, 0.0] * 2:
        seq.add("incumbent", x)
    assert seq.decisions == []  # the one look is at the maximum sample size
    d = design(test)
    rng = random.Random(3)
    while seq.final is None:
        seq.add(rng.choice(["candidate", "incumbent"]), float(rng.random() < 0.5))
    final = seq.final
    assert sum(final.samples.values()) == d.max_samples
    se = math.sqrt(final.var["candidate"] / final.samples["candidate"] +
                   final.var["incumbent"] / final.samples["incumbent"])
    z = (final.mean["candidate"] - final.mean["incumbent"] + 0.1) / se
    assert final.statistic == pytest.approx(z)
    assert final.p_value == pytest.approx(1 - N.cdf(z), abs=1e-6)  # one look: the z-test
    five = SequentialTest(CanaryTest(looks=5))  # a Z on the last boundary: p-value alpha
    assert five.p_value(4, five.design.promote_at[4]) == pytest.approx(0.05, abs=1e-4)
    assert five.p_value(0, 1.0) == pytest.approx(1 - N.cdf(1.0))
    record = final.record()
    for key in ("decision", "samples", "mean", "statistic", "promote_at", "rollback_at",
                "p_value", "rule", "margin", "alpha"):
        assert key in record
    with pytest.raises(ValueError, match="already decided"):
        seq.add("candidate", 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SequentialTest(test).add("candidate", 1.5)
    for bad, piece in [({"margin": 1.0}, "margin"), ({"high": 0.0}, "high"),
                       ({"sigma": 0.7}, "sigma"), ({"alpha": 0.6}, "alpha"),
                       ({"share": 1.0}, "share"), ({"looks": True}, "looks")]:
        with pytest.raises(ValueError, match=piece):
            CanaryTest(**bad)


def test_bad_canary_options_are_one_line(monkeypatch, capsys, tmp_path):
    for args, piece in [(["--canary-alpha", "0.7"], "--canary-alpha"),
                        (["--canary-share", "0"], "--canary-share"),
                        (["--canary-margin", "2"], "--canary-margin"),
                        (["--canary-log", str(tmp_path)], "--canary-log")]:
        code, _, err = run_cli(monkeypatch, capsys, "serve", str(tmp_path), *args)
        assert code == 2 and piece in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- end to end
LIKED = {"agentrt-chat-v0": 0.55, "agentrt-chat-v1": 0.85}  # the planted quality
SCORER = '''
REFERENCE = {reference!r}

def score(prompt, response, info):
    """1 when the response is the promoted version's answer to the prompt."""
    return float(REFERENCE.get(prompt.strip()) == response)
'''


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A llama-nano base, adapter folders (incumbent, better, worse) and each one's greedy
    texts on PROMPTS."""
    root = tmp_path_factory.mktemp("canary")
    base = build_model(root / "llama-nano", "llama-nano", seed=0)
    first = lora_engine(base, "policy-inc", 41)
    engines = {"incumbent": first, "better": lora_engine(base, "policy-bet", 42, first.shared),
               "worse": lora_engine(base, "policy-wor", 43, first.shared)}
    prompts = [encode_text(first.tokenizer, p) for p in PROMPTS]
    folders = {k: e.save_pretrained(root / k) for k, e in engines.items()}
    texts = {k: [first.tokenizer.decode([t for t in c.response_ids if t != e.eos_id],
                                        skip_special_tokens=True)
                 for c in e.generate(prompts, GREEDY)] for k, e in engines.items()}
    assert len({json.dumps(t) for t in texts.values()}) == 3
    return base, root, folders, texts


def _admin(url: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=120, **kw)


def _traffic(url: str, seed: int, feedback: bool, limit: int) -> tuple[list[dict], list[str]]:
    """Requests (and the simulated users' feedback) on 16 threads until the canary decides."""
    c, http = client(url), httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"},
                                        timeout=120)
    records, failures = [], []

    def one(i: int) -> dict:
        res = c.completions.create(model="chat", prompt=PROMPTS[i % len(PROMPTS)],
                                   temperature=0, max_tokens=GREEDY.max_new_tokens)
        rec = {"i": i, "fp": res.system_fingerprint, "text": res.choices[0].text}
        if feedback:
            liked = random.Random(f"{seed}-{i}").random() < LIKED[rec["fp"]]
            r = http.post(f"{url}/v1/feedback", json={"id": res.id, "reward": float(liked)})
            rec["feedback"] = r.status_code
        return rec

    with ThreadPoolExecutor(16) as pool:
        for start in range(0, limit, 32):
            for f in [pool.submit(one, i) for i in range(start, min(start + 32, limit))]:
                try:
                    records.append(f.result())
                except Exception as exc:  # noqa: BLE001 - counted, asserted to be none
                    failures.append(repr(exc))
            state = http.get(f"{url}/admin/canary").json()["canaries"][0]["state"]
            if state != "running":
                break
    return records, failures


def test_canary_end_to_end_promotes_the_better_and_rolls_back_the_worse(adapters, tmp_path,
                                                                        monkeypatch):
    base, root, folders, texts = adapters
    reference = {p: t for p, t in zip(PROMPTS, texts["better"])}
    (root / "canary_scorer_e2e.py").write_text(SCORER.format(reference=reference))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))  # the server imports it
    # one torch thread: on 2 cores shared with other tests, torch's spinning intra-op threads
    # made each generate call 15-40x slower; the answers are the same
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    log_path = tmp_path / "canary.jsonl"
    cmd = [sys.executable, "-m", "agentrt.cli", "serve", str(base), "--name", "base",
           "--adapter", f"chat={folders['incumbent']}", "--port", "0", "--token", TOKEN,
           "--max-batch", "16", "--canary-share", "0.25", "--canary-margin", "0.2",
           "--canary-log", str(log_path)]
    with Server(cmd) as url:
        _run_canaries(url, folders, texts, log_path)


def _run_canaries(url: str, folders: dict, texts: dict, log_path: Path) -> None:
    started = _admin(url, "POST", "/admin/canary", json={
        "model": "chat", "path": str(folders["better"]), "seed": 1})
    assert started.status_code == 200, started.text
    bound = started.json()["max_samples"]
    assert bound == math.ceil(fixed_samples(0.05, 0.9, 0.2, 0.25) *
                              design(CanaryTest(share=0.25, margin=0.2)).inflation)
    # while it runs: no second canary, no hot swap of the name, bad feedback refused
    assert _admin(url, "POST", "/admin/canary", json={
        "model": "chat", "path": str(folders["worse"])}).status_code == 409
    assert _admin(url, "POST", "/admin/load", json={
        "model": "chat", "path": str(folders["worse"])}).status_code == 409
    bad = _admin(url, "POST", "/admin/canary", json={"model": "base", "path": "x", "share": 2})
    assert bad.status_code == 400 and "share" in bad.json()["error"]["message"]
    assert _admin(url, "POST", "/v1/feedback", json={"id": "cmpl-nope", "reward": 1}
                  ).status_code == 404
    res = client(url).completions.create(model="chat", prompt="x", max_tokens=2)
    out = _admin(url, "POST", "/v1/feedback", json={"id": res.id, "reward": 3})
    assert out.status_code == 400 and out.json()["error"]["param"] == "reward"
    chunks = list(client(url).completions.create(model="chat", prompt="x", max_tokens=2,
                                                 stream=True))
    out = _admin(url, "POST", "/v1/feedback", json={"id": chunks[0].id, "reward": 1})
    assert out.status_code == 200 and out.json()["counted"], out.text  # a streamed response
    assert _admin(url, "POST", "/v1/feedback", json={"id": chunks[0].id, "reward": 1}
                  ).status_code == 404  # each response counts once

    records, failures = _traffic(url, seed=7, feedback=True, limit=bound * 2)
    assert failures == []
    status = _admin(url, "GET", "/admin/canary").json()["canaries"][0]
    assert status["state"] == "promoted", status
    decided = status["events"][-2]
    assert decided["decision"] == "promote"
    assert sum(decided["samples"].values()) <= bound
    by_fp = {"agentrt-chat-v0": "incumbent", "agentrt-chat-v1": "better"}
    for r in records:  # each answer is the greedy text of the version that says it answered
        assert r["text"] == texts[by_fp[r["fp"]]][r["i"] % len(PROMPTS)]
    share = sum(r["fp"] == "agentrt-chat-v1" for r in records) / len(records)
    after, failures = _traffic(url, seed=8, feedback=False, limit=20)
    assert failures == [] and {r["fp"] for r in after} == {"agentrt-chat-v1"}

    started = _admin(url, "POST", "/admin/canary", json={
        "model": "chat", "path": str(folders["worse"]), "seed": 2,
        "scorer": "canary_scorer_e2e:score"})
    assert started.status_code == 200, started.text
    worse, failures = _traffic(url, seed=9, feedback=False, limit=bound * 2)
    assert failures == []
    status = _admin(url, "GET", "/admin/canary").json()["canaries"][0]
    assert status["state"] == "rolled back", status
    assert sum(status["events"][-2]["samples"].values()) <= bound
    assert status["events"][-1]["now_serving"] == "agentrt-chat-v1"
    versions = _admin(url, "GET", "/admin/versions").json()["versions"]
    assert sorted(v["fingerprint"] for v in versions if v["model"] == "chat") == \
        ["agentrt-chat-v1"]  # the worse candidate (v2) was unloaded
    res = client(url).completions.create(model="chat", prompt=PROMPTS[0], temperature=0)
    assert res.system_fingerprint == "agentrt-chat-v1"

    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [x["event"] for x in lines if x["event"] != "look"] == \
        ["start", "promoted", "start", "rolled_back"]
    looks = [x for x in lines if x["event"] == "look"]
    assert looks and all(k in x for x in looks for k in (
        "samples", "mean", "statistic", "promote_at", "rollback_at", "p_value", "rule"))
    assert [x["decision"] for x in looks if x["decision"] != "continue"] == ["promote",
                                                                              "rollback"]
    assert {x["via"] for x in looks} == {"feedback", "scorer"}
    print(f"\npromoted after {sum(decided['samples'].values())} rewards "
          f"({len(records)} requests, {share:.0%} on the candidate), rolled back after "
          f"{sum(status['events'][-2]['samples'].values())} (bound {bound})")
