"""Bad input everywhere (issue 18, must-show 5; issue 41, must-shows 2 and 3): bad configs of
every kind through the command that runs them, serve's bad command lines (ctl's are in
test_control.py, against a live run), and corrupt run folders through every command that reads
one. Each is exit code
2, exactly one ``error:`` line on stderr, no traceback, and nothing changed on disk (every file's
bytes and mtime, ``.lock`` aside). ``pytest -s`` prints the counts.

Configs are a valid base per kind with one field made bad (the error names the field); corrupt
states are copies of real run folders (one train and one league run of the tiny model) with one
file damaged. Everything runs in this process through ``agentrt.cli.main``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from test_cli_check import run_cli  # the real entry point, in this process

NANO = {"preset": "llama-nano"}
PAIRS = str(Path(__file__).resolve().parents[1] / "examples" / "data" / "arith_pairs.jsonl")
BASE: dict[str, dict[str, Any]] = {
    "train": {"task": {"name": "arithmetic"}, "reward": "exact_match",
              "policy": {"model": NANO}, "train": {"steps": 2}},
    "tournament": {"envs": [{"id": "TicTacToe-v0"}], "baselines": [{"id": "random"}],
                   "policies": [{"id": "lm", "model": NANO}]},
    "decompose": {"family": {"name": "wordchain"}, "planner": {"kind": "rule"},
                  "policies": [{"id": "reader", "model": NANO, "skills": ["parse", "format"]},
                               {"id": "calc", "model": NANO,
                                "skills": ["add", "sub", "mul", "div"]}]},
}
COMMAND = {"train": ["train"], "tournament": ["tournament", "run"],
           "eval": ["tournament", "eval"], "decompose": ["decompose", "run"]}
P, L = "policy.", "policies.0."  # the train policy; the first policy of a list kind
POLICY_FIELDS = [  # (field under a policy, bad value, expected piece of the error)
    ("optim.lr", True, "expected a number"), ("optim.lr", 2.0, "optim.lr"),
    ("optim.lr", "fast", "optim.lr"), ("optim.betas", [0.9, 1.5], "betas"),
    ("optim.betas", [True, 0.9], "expected a number"), ("optim.eps", -1, "optim.eps"),
    ("optim.schedule", "zigzag", "optim.schedule"), ("optim.warmup_steps", -3, "warmup_steps"),
    ("optim.max_grad_norm", 0, "max_grad_norm"), ("optim.weight_decay", [1], "weight_decay"),
    ("model.dtype", "fp8", "model.dtype"), ("model.device", "tpu", "model.device"),
    ("model", {"preset": "llama-nano", "path": "/x"}, "exactly one of model.path"),
    ("lora.r", 0, "lora.r"), ("lora.r", False, "expected a number"),
    ("lora.enabled", 1, "expected true or false"), ("lora.dropout", 1.5, "lora.dropout"),
    ("rollout.backend", "tpu", "rollout.backend"),
    ("rollout.sampling.temperature", -1, "temperature"),
    ("rollout.sampling.top_p", 0, "top_p"), ("rollout.sampling.top_k", -1, "top_k"),
    ("rollout.sampling.max_new_tokens", 0, "max_new_tokens"),
    ("rollout.sampling.max_new_tokens", True, "expected a number"),
    ("rollout.batch_size", "all", "batch_size"),
    ("algorithm.advantage", "ppo2", "'ppo2'"), ("algorithm.policy_loss", "nope", "'nope'"),
    ("algorithm.loss_agg", "sum", "loss_agg"), ("algorithm.clip_ratio_low", -0.1, "clip_ratio"),
    ("algorithm.kl.estimator", "k9", "estimator"), ("algorithm.kl.coef", -1, "kl.coef"),
    ("algorithm.kl.placement", "head", "placement"), ("algorithm.ppo_epochs", 0, "ppo_epochs"),
    ("algorithm.norm_adv", 0, "expected true or false"), ("algorithm.gamma", 1.5, "gamma"),
    ("micro_batch_size", 0, "micro_batch_size"), ("resources.num_workers", 0, "num_workers"),
    ("resources.placement", "SCATTER", "placement"), ("trainable", "yes please", "trainable"),
    ("memory", {"bank": ""}, "memory.bank"), ("bogus", 1, "bogus: Extra inputs"),
]
TRAIN = [("train.steps", True, "expected a number"), ("train.steps", -1, "train.steps"),
         ("train.steps", "ten", "train.steps"), ("train.prompts_per_step", 0, "prompts_per_step"),
         ("train.group_size", 0, "group_size"), ("train.group_size", 2.5, "group_size"),
         ("task.name", "algebra", "unknown task 'algebra'"), ("task.train_size", 0, "train_size"),
         ("task.options", {"digits": 9}, "digits"), ("task.options", {"digits": True}, "digits"),
         ("reward", "exact_matsh", "unknown reward"), ("reward", 3, "reward"),
         ("reward", [{"grpc": "x"}], "reward.0: unknown reward source kind"),
         ("reward", {"python": "exact_match", "workers": 0}, "reward.0.workers"),
         ("reward", ["exact_match", {"http": "ftp://h/x"}], "reward.1.http"),
         ("reward", {"http": "http://127.0.0.1:9/score"}, "reward.0.http: cannot reach"),
         ("reward", {"model": "/no/such/rm"}, "reward.0.model: '/no/such/rm' does not exist"),
         ("reward", [{"python": "exact_match"}, {"python": "exact_match"}], "reward.1.name"),
         ("sft.steps", -1, "sft.steps"), ("sft.lr", False, "expected a number"),
         ("eval.every", 0, "eval.every"), ("eval.greedy", 1, "expected true or false"),
         ("checkpoint.every", 0, "checkpoint.every"), ("checkpoint.keep", 0, "checkpoint.keep"),
         ("seed", True, "expected a number"), ("seed", "one", "seed"),
         ("threads", 0, "threads"), ("progress", 1, "expected true or false"),
         ("runtime.backend", "slurm", "runtime.backend"),
         ("guards.max_reward_error_rate", 2, "max_reward_error_rate"),
         ("data.path", "/no/such.jsonl", "data.path"), ("data.format", "xml", "data.format"),
         ("data.eval_fraction", 1.5, "eval_fraction"), ("train", [1, 2], "train"),
         ("policy", "lm", "policy"), ("trian", {"steps": 1}, "trian: Extra inputs"),
         ("policy.id", "a/b", "policy id 'a/b' names folders"),
         ("task", {"name": "dataset", "options": {"path": "/no/such.parquet"}}, "does not exist"),
         ("task", {"name": "dataset", "options": {"path": PAIRS, "format": "xml"}}, "format"),
         ("task", {"name": "dataset", "options": {"path": PAIRS, "columns": {"answer": "ans"}}},
          "task.options.columns.answer: column 'ans' is not in"),
         ("task", {"name": "dataset", "options": {"path": PAIRS, "eval": {"fraction": 0}}},
          "fraction"),
         ("drift.action", "restart", "drift.action"), ("drift.patience", 0, "drift.patience"),
         ("drift.signals", {"length": {}}, "unknown signal 'length'"),
         ("drift.signals", {"topic": {"test": "ks"}}, "topic signal takes test 'centroid'"),
         ("drift.signals", {}, "at least one signal"), ("drift.enabled", 1, "true or false"),
         ("drift.embedder", "bert", "unknown embedder 'bert'"),
         ("control.http.port", 70000, "control.http.port"),
         ("control.feedback.max_staleness", -1, "control.feedback.max_staleness"),
         ("control.step_interval_s", -1, "control.step_interval_s"),
         ("control.token_env", "", "control.token_env"), ("control.enabled", 1, "true or false"),
         ("control", {"enabled": True, "http": {"enabled": False}},
          "control.enabled needs a channel"),
         ("control.redis", {"url": "redis://127.0.0.1:6379/0", "strem": "x"}, "strem"),
         # sizes and seeds past what a run can hold or numpy can seed: refused by name, never
         # a hang or a crash deep inside (issue 41, findings 8 and 11)
         ("seed", 2**70, "seed"), ("seed", -1, "seed"), ("task.seed", 2**40, "task.seed"),
         ("task.train_size", 10**9, "task.train_size"), ("task.eval_size", 10**12, "eval_size"),
         ("train.prompts_per_step", 10**9, "prompts_per_step"),
         ("train.group_size", 10**10, "group_size"),
         (P + "rollout.sampling.max_new_tokens", 2048, "leaves no room for a prompt"),
         (P + "rollout.sampling.max_new_tokens", 10**6, "context of 2048 tokens"),
         ("threads", 100000, "threads"),
         ("reward", "broken_at_import:reward", "failed while importing: RuntimeError: the "
                                               "reward module is broken")]
TOURNAMENT = [("envs.0.id", "Nope-v0", "unknown env 'Nope-v0'"), ("envs", [], "envs"),
              ("envs.0.template.history", 2, "expected true or false"),
              ("baselines.0.kind", "alphazero", "unknown scripted policy"),
              ("baselines.0.seed", True, "expected a number"),
              ("schedule.format", "elo", "schedule.format"),
              ("schedule.games_per_pairing", 0, "games_per_pairing"),
              ("schedule.pfsp_weighting", "soft-ish", "pfsp_weighting"),
              ("schedule.snapshot.every", 0, "snapshot.every"),
              ("schedule.snapshot.win_rate", 1.5, "win_rate"),
              ("runner.max_turns", 0, "runner.max_turns"),
              ("runner.random_seats", 0, "expected true or false"),
              ("runner.invalid_action", "ignore", "invalid_action"),
              ("runner.concurrency", True, "expected a number"),
              ("warm_start.steps", -1, "warm_start.steps"),
              ("warm_start", {"steps": 2, "teacher": "connect4"}, "warm_start.teacher"),
              ("train.games_per_step", 0, "games_per_step"), ("eval.games", -2, "eval.games"),
              ("eval.opponents", ["ghost"], "ghost"), ("policies", [], "policies"),
              ("policies.0.roles", ["dealer"], "roles"), ("policies.0.id", 7, "policies.0.id"),
              ("policies.0.id", "../outside", "policy id '../outside' names folders"),
              ("policies.0.id", "/tmp/abs", "policy id '/tmp/abs' names folders"),
              ("baselines.0.kind", "best_response", "target names the learner"),
              ("baselines.0.target", "lm", "target names the learner"),
              ("memory.banks", {"b": {"backend": "mongo"}}, "backend"),
              ("drift.window_steps", 0, "drift.window_steps"),
              ("seed", 2**70, "seed"), ("runner.seed", 2**64, "runner.seed"),
              ("baselines.0.seed", -5, "baselines.0.seed"),
              ("train.games_per_step", 10**9, "games_per_step"),
              ("warm_start.games_per_step", 10**12, "warm_start.games_per_step"),
              ("eval.exploiter", {"every": 10, "games_per_step": 10**9}, "games_per_step"),
              (L + "rollout.sampling.max_new_tokens", 5000, "leaves no room for a prompt"),
              ("envs.0.template.first", "{observation} {board}", "unknown placeholder(s) "
                                                                  "{board}"),
              ("envs.0.template.turn", "{observation", "expected '}' before end of string"),
              ("envs.0.template.first", "{}: {legal}", "unknown placeholder(s) {}"),
              # LoRA policies sharing a pool run with its first policy's pool settings
              ("policies", [{"id": "a", "model": NANO, "lora": {"enabled": True}},
                            {"id": "b", "model": NANO, "lora": {"enabled": True},
                             "rollout": {"batch_size": 16}}],
               "policies.1.rollout.batch_size differs from policies.0's"),
              ("policies", [{"id": "a", "model": NANO, "lora": {"enabled": True}},
                            {"id": "b", "model": NANO, "lora": {"enabled": True},
                             "resources": {"cpus_per_worker": 2}}],
               "policies.1.resources differs from policies.0's"),
              ("policies", [{"id": "a", "model": NANO, "lora": {"enabled": True}},
                            {"id": "b", "model": NANO, "lora": {"enabled": True},
                             "rollout": {"decode": "hf"}}],
               "policies.1.rollout.decode differs")]
DECOMPOSE = [("family.name", "poetry", "family.name"), ("family.train_size", 0, "train_size"),
             ("planner.kind", "magic", "planner.kind"), ("planner.max_subtasks", 0,
                                                         "max_subtasks"),
             ("planner.kind", "lm", "planner.policy"),
             ("policies.1.skills", ["add", "sub", "mul", "div", "pow"], "unknown skill 'pow'"),
             ("router.exploration", "greedy", "router.exploration"),
             ("chain.outcome_share", 2, "outcome_share"),
             ("chain.on_failure", "panic", "on_failure"), ("train.group_size", False,
                                                           "expected a number"),
             ("train.tasks_per_step", 0, "tasks_per_step"),
             ("tools", [{"id": "t", "fn": "no_such_mod_x:f", "skills": ["div"]}], "tools.0.fn"),
             ("policies.1.memory", {"bank": "m"}, "policies.1.memory: a decomposer specialist "
                                                  "has no memory bank yet"),
             ("drift.reference", "rolling", "drift.reference"),
             ("policies.1.id", "..", "policy id '..' names folders"),
             ("family.train_size", 10**9, "train_size"), ("family.eval_size", 10**9, "eval_size"),
             ("family.seed", 2**70, "family.seed"), ("train.group_size", 10**6, "group_size"),
             ("train.tasks_per_step", 10**9, "tasks_per_step"), ("seed", 2**33, "seed"),
             ("policies.1.rollout.sampling.max_new_tokens", 2100, "leaves no room")]


def _cases() -> dict[str, tuple[str, str, Any, str]]:
    cases = {f"train-{P}{f}={v!r}": ("train", P + f, v, e) for f, v, e in POLICY_FIELDS}
    cases |= {f"tournament-{L}{f}={v!r}": ("eval" if i % 2 else "tournament", L + f, v, e)
              for i, (f, v, e) in enumerate(POLICY_FIELDS[::2])}
    cases |= {f"decompose-{L}{f}={v!r}": ("decompose", L + f, v, e)
              for f, v, e in POLICY_FIELDS[1::3]}
    cases |= {f"train-{f}={v!r}": ("train", f, v, e) for f, v, e in TRAIN}
    cases |= {f"tournament-{f}={v!r}": ("tournament", f, v, e) for f, v, e in TOURNAMENT}
    cases |= {f"decompose-{f}={v!r}": ("decompose", f, v, e) for f, v, e in DECOMPOSE}
    return cases


CONFIGS = _cases()
# whole files and command lines: (kind, file bytes or None for the base, --set args, expected)
RAW = {
    "duplicate_key": ("train", b"train: {steps: 1}\ntask: {name: arithmetic}\ntrain: {steps: 2}",
                      [], "duplicate key 'train' (also at line 1)"),
    "duplicate_nested": ("tournament", b"envs: [{id: TicTacToe-v0, id: ConnectFour-v0}]\n"
                         b"policies: [{id: lm, model: {preset: llama-nano}}]", [],
                         "duplicate key 'id'"),
    "empty": ("train", b"", [], "is empty"), "blank": ("decompose", b"  \n\n# nothing\n", [],
                                                       "is empty"),
    "binary": ("train", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", [], "not a UTF-8 text file"),
    "nul_bytes": ("tournament", b"envs: [\x00]\n", [], "not valid YAML"),
    "scalar": ("train", b"42\n", [], "top level must be a mapping"),
    "set_no_field": ("train", None, ["--set", "=3"], "override '=3' must look like"),
    "set_no_value": ("train", None, ["--set", "a.b"], "override 'a.b' must look like"),
    "set_empty_part": ("tournament", None, ["--set", "policies..id=x"], "must look like"),
    "set_bad_yaml": ("decompose", None, ["--set", "train.steps=[1"], "not valid YAML"),
    "set_twice": ("train", None, ["--set", "train=1", "--set", "train.steps=2"],
                  "set to a value by another --set"),
    "set_bool_steps": ("train", None, ["--set", "train.steps=true"], "expected a number"),
}


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry under ``root`` (``.lock`` aside, and SQLite's ``-shm`` shared-memory index,
    which any reader of a database with a write-ahead log rewrites): a file's sha256 and mtime,
    a folder's mtime."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name == ".lock" or path.name.endswith("-shm"):
            continue
        stat = path.lstat()
        digest = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir")
        found[str(path.relative_to(root))] = (digest, stat.st_mtime_ns)
    return found


def assert_one_line(code: int, out: str, err: str, expected: str) -> None:
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert expected in lines[0], lines[0]


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize("name", sorted(CONFIGS) + [f"raw-{k}" for k in sorted(RAW)])
def test_bad_config(name: str, tmp_path: Path, monkeypatch, capsys) -> None:
    if name.startswith("raw-"):
        kind, text, extra, expected = RAW[name[4:]]
        data = yaml.safe_load(yaml.safe_dump(BASE[kind if kind in BASE else "tournament"]))
    else:
        kind, field, value, expected = CONFIGS[name]
        data = yaml.safe_load(yaml.safe_dump(BASE["tournament" if kind == "eval" else kind]))
        _set(data, field, value)
        text, extra = None, []
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if text is not None else yaml.safe_dump(data).encode())
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    args = [*COMMAND[kind], str(path), *extra, "--set", f"run_dir={tmp_path / 'run'}"]
    assert_one_line(*run_cli(monkeypatch, capsys, *args), expected)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind,field", [("train", "policy.compile"),
                                        ("tournament", "policies.0.compile"),
                                        ("decompose", "policies.1.compile")])
def test_compile_without_a_compiler(kind: str, field: str, tmp_path: Path, monkeypatch,
                                    capsys) -> None:
    """``compile: true`` on a machine with no C++ compiler (``CXX`` names none) is one line at
    check time, naming the field and what to install, not inductor's error at the first
    update."""
    data = yaml.safe_load(yaml.safe_dump(BASE[kind]))
    _set(data, field, True)
    path = tmp_path / "compile.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    before = snapshot(tmp_path)
    for args in (["check-config", str(path), "--no-prompt"],
                 [*COMMAND[kind], str(path), "--set", f"run_dir={tmp_path / 'run'}"]):
        assert_one_line(*run_cli(monkeypatch, capsys, *args),
                        f"{field}: torch.compile builds C++ and needs a C++ compiler")
    assert snapshot(tmp_path) == before
    monkeypatch.delenv("CXX")  # with one (g++ here), the same config checks
    assert run_cli(monkeypatch, capsys, "check-config", str(path), "--no-prompt")[0] == 0


def test_counts(capsys) -> None:
    """Issue 41, must-shows 2 and 3: >= 250 bad inputs across every command (configs of every
    kind, serve's command line here, ctl's against a live run in test_control.py) and >= 60
    damaged states over the files of a run folder."""
    from test_control import CTL_BAD

    total = len(CONFIGS) + len(RAW) + len(SERVE) + len(CTL_BAD)
    with capsys.disabled():
        print(f"\n{len(CONFIGS) + len(RAW)} bad configs, {len(SERVE)} bad serve command lines, "
              f"{len(CTL_BAD)} bad ctl commands ({total} bad inputs); "
              f"{len(STATES)} corrupt states")
    assert total >= 250 and len(STATES) >= 60




# ---------------------------------------------------------------- corrupt run folders
def _train_cfg(run: Path, model: Path) -> dict[str, Any]:
    return {"run_dir": str(run), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 16, "eval_size": 2},
            "policy": {"model": {"path": str(model)},
                       "rollout": {"sampling": {"max_new_tokens": 2}}},
            "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2},
            "checkpoint": {"every": 1}}


def _league_cfg(run: Path, model: Path) -> dict[str, Any]:
    return {"run_dir": str(run), "progress": False, "threads": 1,
            "envs": [{"id": "TicTacToe-v0"}], "baselines": [{"id": "random"}],
            "policies": [{"id": "lm", "model": {"path": str(model)},
                          "rollout": {"sampling": {"max_new_tokens": 2}}}],
            "train": {"steps": 1, "games_per_step": 2}, "eval": {"every": 100, "games": 2},
            "checkpoint": {"every": 1}}


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished train run and a finished league run (1 step each) to damage copies of."""
    from agentrt.config.load import validate_config
    from agentrt.tools.checks import config_model
    from agentrt.tournaments.trainer import LeagueTrainer
    from agentrt.workloads.prompts.workload import Trainer

    root = tmp_path_factory.mktemp("runs")
    Trainer(validate_config(_train_cfg(root / "train", tiny_model_dir),
                            config_model("train"))).run()
    LeagueTrainer(validate_config(_league_cfg(root / "league", tiny_model_dir),
                                  config_model("tournament"))).run()
    return {"train": root / "train", "league": root / "league"}


def _each(rel: str, change: Callable[[Path], None]) -> Callable[[Path], None]:
    """Damages every match of the glob ``rel`` (every checkpoint: one good one is resumed)."""
    def damage(run: Path) -> None:
        for path in sorted(run.glob(rel)) or [run / rel]:
            change(path)
    return damage


def _write(rel: str, data: bytes) -> Callable[[Path], None]:
    return _each(rel, lambda path: path.write_bytes(data))


def _truncate(rel: str) -> Callable[[Path], None]:
    return _each(rel, lambda path: path.write_bytes(path.read_bytes()[:100]))


def _zeros(rel: str) -> Callable[[Path], None]:
    return _each(rel, lambda path: path.write_bytes(bytes(path.stat().st_size)))


def _remove(rel: str, make_dir: bool = False) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        if make_dir:
            path.mkdir()
    return _each(rel, change)


def _other_seed(run: Path) -> None:
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("seed: 0",
                                                                               "seed: 5", 1))


def _db(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """``damage`` to matches.sqlite with its write-ahead log gone: while matches.sqlite-wal holds
    every page, SQLite reads them from there and the main file's bytes do not matter."""
    def change(run: Path) -> None:
        for suffix in ("-wal", "-shm"):
            (run / f"matches.sqlite{suffix}").unlink(missing_ok=True)
        damage(run)
    return change


def _empty_db(run: Path) -> None:
    (run / "matches.sqlite").unlink()
    with sqlite3.connect(run / "matches.sqlite") as db:
        db.execute("CREATE TABLE notes (x)")


def _sql(rel: str, statement: str) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        with closing(sqlite3.connect(run / rel)) as db, db:
            db.execute(statement)
    return change


def _zero_block(rel: str) -> Callable[[Path], None]:
    """4 KiB of zeros over the file's second page (a bad sector, a torn write)."""
    def change(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[4096:8192] = bytes(len(data[4096:8192]))
        path.write_bytes(bytes(data))
    return _each(rel, change)


def _keep_lines(rel: str, n: int) -> Callable[[Path], None]:
    return _each(rel, lambda path: path.write_text(
        "".join(path.read_text().splitlines(keepends=True)[:n])))


CKPT = "checkpoints/step_*/"
# name -> (run to copy, damage, command: {run} is the copy, {cfg} its config.yaml, expected)
STATES: dict[str, tuple[str, Callable[[Path], None], str, str]] = {
    "train_state_truncated": ("train", _truncate(CKPT + "state.pt"), "train {cfg}", "no good"),
    # every store against the rows the newest checkpoint recorded (issue 41, finding 9)
    "train_lock_dir": ("train", _remove(".lock", make_dir=True), "train {cfg}",
                       ".lock cannot be the run folder's lock file (Is a directory)"),
    "train_lock_symlink": ("train", lambda run: ((run / ".lock").unlink(missing_ok=True),
                                                 (run / ".lock").symlink_to(run / "run.json")),
                           "train {cfg}", "cannot be the run folder's lock file"),
    "train_metrics_deleted": ("train", _remove("metrics.jsonl"), "train {cfg}",
                              "metrics.jsonl holds 0 of the 2 rows step_1 recorded"),
    "train_metrics_cut": ("train", _keep_lines("metrics.jsonl", 1), "train {cfg}",
                          "metrics.jsonl holds 1 of the 2 rows"),
    "train_metrics_garbage": ("train", _write("metrics.jsonl", b"\x00garbage\n{\n"),
                              "train {cfg}", "metrics.jsonl holds 0 of the"),
    "train_metrics_dir": ("train", _remove("metrics.jsonl", make_dir=True), "train {cfg}",
                          "metrics.jsonl"),
    "train_episodes_deleted": ("train", _remove("episodes.sqlite"), "train {cfg}",
                               "episodes.sqlite holds 0 of the 4 rows"),
    "train_episodes_rows_deleted": ("train", _sql("episodes.sqlite", "DELETE FROM episodes "
                                                  "WHERE idx = 0"), "train {cfg}",
                                    "episodes.sqlite holds 3 of the 4 rows step_1 "
                                    "recorded"),
    "train_episodes_zero_block": ("train", _zero_block("episodes.sqlite"), "train {cfg}",
                                  "episodes.sqlite is damaged"),
    "train_episodes_garbage": ("train", _write("episodes.sqlite", b"not a db" * 600),
                               "train {cfg}", "episodes.sqlite is damaged"),
    "train_episodes_dir": ("train", _remove("episodes.sqlite", make_dir=True), "train {cfg}",
                           "episodes.sqlite"),
    "train_versions_deleted": ("train", _remove("versions.json"), "train {cfg}",
                               "versions.json holds 0 of the 1 rows step_1 recorded"),
    "train_versions_garbage": ("train", _write("versions.json", b"{garbage"), "train {cfg}",
                               "versions.json is not readable JSON"),
    "league_versions_deleted": ("league", _remove("versions.json"), "tournament run {cfg}",
                                "versions.json holds 0 of the"),
    "league_matches_zeros": ("league", _db(_zeros("matches.sqlite")), "tournament run {cfg}",
                             "matches.sqlite cannot be read as a match database"),
    "league_metrics_cut": ("league", _keep_lines("metrics.jsonl", 1), "tournament run {cfg}",
                           "metrics.jsonl holds 1 of the"),
    "league_matches_deleted": ("league", _db(_remove("matches.sqlite")), "tournament run {cfg}",
                               "matches.sqlite holds 0 of the"),
    "league_matches_rows_deleted": ("league", _sql("matches.sqlite", "DELETE FROM matches WHERE "
                                                   "step = 1"), "tournament run {cfg}",
                                    "matches.sqlite holds"),
    "league_metrics_deleted": ("league", _remove("metrics.jsonl"), "tournament run {cfg}",
                               "metrics.jsonl holds 0 of the"),
    "league_episodes_deleted": ("league", _remove("episodes.sqlite"), "tournament run {cfg}",
                                "episodes.sqlite holds 0 of the"),
    "league_episodes_zero_block": ("league", _zero_block("episodes.sqlite"),
                                   "tournament run {cfg}", "episodes.sqlite is damaged"),
    "train_state_zeros": ("train", _zeros(CKPT + "state.pt"), "train {cfg}", "no good"),
    "train_state_garbage": ("train", _write(CKPT + "state.pt", b"garbage" * 99), "train {cfg}",
                            "no good checkpoint"),
    "train_manifest_garbage": ("train", _write(CKPT + "manifest.json", b"{nope"), "train {cfg}",
                               "no good checkpoint"),
    "train_manifest_missing": ("train", _remove(CKPT + "manifest.json"), "train {cfg}",
                               "no good checkpoint"),
    "train_run_json_garbage": ("train", _write("run.json", b"\x00\x01garbage"), "train {cfg}",
                               "run.json"),
    "train_run_json_list": ("train", _write("run.json", b"[1, 2]"), "train {cfg}", "run.json"),
    "train_run_json_dir": ("train", _remove("run.json", make_dir=True), "train {cfg}",
                           "run.json"),
    "train_other_seed": ("train", _other_seed, "train {cfg}", "seed: 0 there, 5 here"),
    "train_locked": ("train", lambda run: None, "train {cfg} LOCK", "in use by another"),
    "train_config_garbage": ("train", _write("config.yaml", b"\xff\xfe garbage"), "train {cfg}",
                             "not a UTF-8 text file"),
    "train_run_dir_is_file": ("train", lambda run: None, "train {cfg} --run-dir {cfg}",
                              "is a file"),
    "check_config_run_folder": ("train", lambda run: None, "check-config {run}",
                                "is a directory, not a config file"),
    "check_config_empty": ("train", _write("config.yaml", b"\n"), "check-config {cfg}",
                           "is empty"),
    "league_matches_garbage": ("league", _db(_write("matches.sqlite", b"not a db" * 200)),
                               "tournament run {cfg}", "matches.sqlite"),
    "league_state_truncated": ("league", _truncate(CKPT + "state.pt"), "tournament run {cfg}",
                               "no good checkpoint"),
    "league_run_json_garbage": ("league", _write("run.json", b"{"), "tournament eval {cfg}",
                                "run.json"),
    "league_locked": ("league", lambda run: None, "tournament eval {cfg} LOCK", "in use"),
    "report_matches_zeros": ("league", _db(_zeros("matches.sqlite")), "tournament report {run}",
                             "cannot be read"),
    "report_matches_truncated": ("league", _db(_truncate("matches.sqlite")),
                                 "tournament report {run}", "cannot be read"),
    "report_matches_dir": ("league", _remove("matches.sqlite", make_dir=True),
                           "tournament report {run}", "matches.sqlite"),
    "report_matches_no_table": ("league", _empty_db, "tournament report {run}", "cannot be read"),
    "report_no_matches": ("train", lambda run: None, "tournament report {run}",
                          "has no matches.sqlite"),
    "play_config_garbage": ("league", _write("config.yaml", b"envs: [\n"), "play {run}",
                            "not valid YAML"),
    "play_config_empty": ("league", _write("config.yaml", b""), "play {run}", "is empty"),
    "play_config_duplicate": ("league", _write("config.yaml", b"seed: 1\nseed: 2\n"),
                              "play {run}", "duplicate key 'seed'"),
    "play_no_weights": ("league", _remove("final_models/lm/model.safetensors"), "play {run}",
                        "final_models"),
    "play_weights_garbage": ("league", _write("final_models/lm/config.json", b"{oops"),
                             "play {run}", "final_models"),
    "decompose_report_garbage": ("league", _write("chains.jsonl", b"\x00garbage\n{\n"),
                                 "decompose report {run}", "chains.jsonl"),
    "decompose_report_empty": ("league", _write("chains.jsonl", b""), "decompose report {run}",
                               "chains.jsonl"),
    "decompose_report_dir": ("league", lambda run: (run / "chains.jsonl").mkdir(),
                             "decompose report {run}", "chains.jsonl"),
    "debug_episodes_garbage": ("train", _write("episodes.sqlite", b"not a db" * 200),
                               "debug {run} s1-0", "cannot be read"),
    "debug_episodes_missing": ("train", _remove("episodes.sqlite"), "debug {run} s1-0",
                               "has no episodes.sqlite"),
    "debug_unknown_episode": ("train", lambda run: None, "debug {run} s9-9",
                              "no episode 's9-9'"),
    "debug_sample_garbage": ("train", _write("s.json", b"{prompt"), "debug {run} {run}/s.json",
                             "not readable JSON"),
    "debug_sample_no_response": ("train", _write("s.json", b'{"prompt": "1+1="}'),
                                 "debug {run} {run}/s.json", "response must be a string"),
    "debug_repeats_one": ("train", lambda run: None, "debug {run} s1-0 --repeats 1",
                          "--repeats must be at least 2"),
    "debug_config_garbage": ("train", _write("config.yaml", b"\xff\xfe garbage"),
                             "debug {run} s1-0", "not a UTF-8 text file"),
    "debug_no_run_json": ("train", _remove("run.json"), "debug {run} s1-0", "holds no run"),
    "debug_league_run": ("league", lambda run: None, "debug {run} s1-0",
                         "has no episode 's1-0'; give an episode id of its episodes.sqlite "
                         "(e.g. s1-0-player_"),
    "debug_second_reward_unknown": ("train", lambda run: None,
                                    "debug {run} s1-0 --reward no_such_module:fn",
                                    "cannot import module 'no_such_module'"),
    "debug_embedder_unknown": ("train", lambda run: None, "debug {run} s1-0 --embedder bert",
                               "--embedder 'bert' is unknown"),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_corrupt_state(name: str, runs: dict[str, Path], tmp_path: Path, monkeypatch,
                       capsys) -> None:
    source, damage, line, expected = STATES[name]
    run = tmp_path / "run"
    shutil.copytree(runs[source], run)
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace(str(runs[source]), str(run)))  # run_dir: the copy
    damage(run)
    args = line.format(run=run, cfg=cfg).split()
    held = None
    if "LOCK" in args:
        args.remove("LOCK")
        held = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as another agentrt process would
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    try:
        result = run_cli(monkeypatch, capsys, *args)
    finally:
        if held is not None:
            os.close(held)
    assert_one_line(*result, expected)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- agentrt serve's command line
# (arguments, with {model} a model folder, {bare} one without its tokenizer and {tmp} a folder
# holding no model; a piece of the one error line). Each is refused before anything is loaded
# or bound, except the tokenizer, whose absence shows when the folder loads.
SERVE = [
    (["{model}", "--port", "-1"], "--port -1 is not a TCP port"),
    (["{model}", "--port", "70000"], "is not a TCP port"),
    (["{model}", "--port", "http"], "--port"),
    (["{model}", "--max-batch", "0"], "--max-batch"),
    (["{model}", "--max-tokens", "-5"], "--max-tokens"),
    (["{model}", "--threads", "0"], "--threads takes 1 to 1024"),
    (["{model}", "--threads", "100000"], "--threads takes 1 to 1024"),
    (["{model}", "--backend", "tpu"], "hf or vllm"),
    (["{model}", "--device", "tpu"], "--device"),
    (["{model}", "--max-request-mb", "0"], "--max-request-mb takes"),
    (["{model}", "--max-request-mb", "nan"], "--max-request-mb takes"),
    (["{model}", "--max-request-mb", "1e9"], "--max-request-mb takes"),
    (["{model}", "--canary-share", "2"], "share"),
    (["{model}", "--canary-alpha", "0"], "alpha"),
    (["{model}", "--canary-power", "1.5"], "power"),
    (["{model}", "--canary-margin", "-1"], "margin"),
    (["{model}", "--canary-log", "{tmp}"], "is a folder"),
    (["{model}", "--canary-scorer", "no_such_reward"], "--canary-scorer"),
    (["{model}", "--follow"], "--follow takes a run folder"),
    (["{tmp}", "--follow", "--adapter", "a={model}"], "--follow serves a run's policies"),
    (["{tmp}/missing"], "does not exist"),
    (["{tmp}"], "neither a model"),
    (["{model}", "--adapter", "oops"], "NAME=PATH"),
    (["{model}", "--adapter", "a={tmp}/missing"], "does not exist"),
    (["{model}", "--base", "{tmp}/missing"], "--base"),
    (["{bare}"], "tokenizer"),
]


@pytest.fixture(scope="module")
def bare_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's weights and config without any tokenizer file."""
    bare = tmp_path_factory.mktemp("bare") / "model"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, bare / name)
    return bare


@pytest.mark.parametrize("args, expected", SERVE, ids=[" ".join(a) for a, _ in SERVE])
def test_bad_serve_command(args: list[str], expected: str, tiny_model_dir: Path,
                           bare_model: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    args = [a.format(model=tiny_model_dir, bare=bare_model, tmp=tmp_path) for a in args]
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert_one_line(*run_cli(monkeypatch, capsys, "serve", *args), expected)
    assert snapshot(tmp_path) == before
