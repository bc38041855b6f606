"""`agentrt check-config`: every example passes, bad configs of every kind fail in one line that
names the field, before any run folder exists, and the check imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from agentrt.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if p.name != "raycluster.yaml")


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *args: str) -> tuple[int, str, str]:
    """Runs ``agentrt ARGS`` in this process through the real entry point."""
    monkeypatch.setattr(sys, "argv", ["agentrt", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes(path: Path, monkeypatch, capsys, request) -> None:
    args = ["check-config", str(path)]
    # cluster configs: their model lives on the cluster's shared storage
    models = {"grpo_cluster.yaml": ["policy"], "league_cluster.yaml": ["policies.0", "policies.1"],
              "decompose_cluster.yaml": [f"policies.{i}" for i in range(3)],
              "ttt_eval.yaml": ["policies.0"]}.get(path.name, [])  # what ttt_league.yaml trains
    for model in models:
        args += ["--set", f"{model}.model.path={request.getfixturevalue('tiny_model_dir')}"]
    if path.name == "grpo_parquet.yaml":  # its file is written by examples/make_prompts_parquet
        from test_prompt_data import prompts_parquet

        data = prompts_parquet(request.getfixturevalue("tmp_path"))
        args += ["--set", f"task.options.path={data}"]
    if path.name == "arith_grpo_service.yaml":  # its reward service must answer: start it
        server = subprocess.Popen([sys.executable, str(ROOT / "examples" / "reward_server.py"),
                                   "--port", "0"], stdout=subprocess.PIPE, text=True)
        request.addfinalizer(server.kill)
        args += ["--set", f"reward.0.http={server.stdout.readline().split()[-1]}"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    kind = out.splitlines()[0]
    assert kind in ("# train config, valid", "# tournament config, valid",
                    "# decompose config, valid")
    assert "run_dir:" in out  # the resolved config follows


NANO = "{id: lm, model: {preset: llama-nano}}"
PAIRS = ROOT / "examples" / "data" / "arith_pairs.jsonl"  # columns prompt, chosen, rejected
TTT = f"envs: [{{id: TicTacToe-v0}}]\npolicies: [{NANO}]\n"
WORDCHAIN = """family: {name: wordchain}
planner: {kind: rule}
policies:
  - {id: reader, model: {preset: llama-nano}, skills: [parse, format]}
  - {id: calc, model: {preset: llama-nano}, skills: [add, sub, mul, div]}
"""

# (config text, a piece of the one error line: the field it names)
BAD = {
    # train
    "lr_negative": ("policy: {optim: {lr: -1}}", "policy.optim.lr"),
    "reward_unknown": ("reward: exact_matsh", "reward: unknown reward 'exact_matsh'"),
    "reward_module": ("reward: no_such_mod_x:f", "reward: cannot import module 'no_such_mod_x'"),
    "reward_attr": ("reward: agentrt.rewards:nope", "reward: 'agentrt.rewards' has no function"),
    "reward_source_kind": ("reward: [{grpc: x, weight: 1}]", "reward.0: unknown reward source"),
    "reward_source_fn": ("reward: [{python: nope_x}]", "reward.0.python: unknown reward 'nope_x'"),
    "reward_dead_url": ("reward: {http: 'http://127.0.0.1:9/score'}",
                        "reward.0.http: cannot reach http://127.0.0.1:9/score"),
    "reward_not_classifier": ("reward: {model: /no/such/rm}", "reward.0.model"),
    "task_unknown": ("task: {name: algebra}", "unknown task 'algebra'"),
    "task_option": ("task: {options: {bogus: 1}}", "task: options"),
    "advantage": ("policy: {algorithm: {advantage: ppo2}}", "advantage 'ppo2' is not registered"),
    "preset": ("policy: {model: {preset: llama-huge}}", "unknown preset 'llama-huge'"),
    "model_path": ("policy: {model: {path: /no/such/model}}", "policy.model.path"),
    "data_path": ("data: {path: /no/such.jsonl}", "data.path"),
    "dpo_no_data": ("policy: {algorithm: dpo}", "needs data.path"),
    "unknown_key": ("task: {name: arithmetic}\ntrian: {steps: 1}", "trian: Extra inputs"),
    "steps": ("task: {name: arithmetic}\ntrain: {steps: -1}", "train.steps"),
    "backend": ("policy: {rollout: {backend: tpu}}", "policy.rollout.backend"),
    "dataset_no_path": ("task: {name: dataset, options: {format: jsonl}}", "path: Field required"),
    "dataset_missing_file": ("task: {name: dataset, options: {path: /no/such.parquet}}",
                             "path '/no/such.parquet' does not exist"),
    "dataset_format": (f"task: {{name: dataset, options: {{path: {PAIRS}, format: csv}}}}",
                       "format"),
    "dataset_column": (f"task: {{name: dataset, options: {{path: {PAIRS}, columns: "
                       "{prompt: question}}}", "task.options.columns.prompt: column 'question'"),
    "dataset_two_prompts": (f"task: {{name: dataset, options: {{path: {PAIRS}, columns: "
                            "{prompt: prompt, messages: chosen}}}", "not both"),
    # tournament
    "env_unknown": (f"envs: [{{id: Nope-v0}}]\npolicies: [{NANO}]", "unknown env 'Nope-v0'"),
    "baseline_wrong_game": (
        f"envs: [{{id: ConnectFour-v0}}]\npolicies: [{NANO}]\n"
        "baselines: [{id: random, kind: random}, {id: mm, kind: minimax}]",
        "baselines.1.kind: 'minimax' cannot play ConnectFour-v0"),
    "baseline_unknown": (TTT + "baselines: [{id: b, kind: alphazero}]",
                         "unknown scripted policy 'alphazero'"),
    "baseline_module": (TTT + "baselines: [{id: b, kind: 'no_such_mod_x:P'}]",
                        "cannot import module 'no_such_mod_x'"),
    "teacher_wrong_game": (
        f"envs: [{{id: KuhnPoker-v0}}]\npolicies: [{NANO}]\n"
        "baselines: [{id: random}]\nwarm_start: {steps: 2, teacher: connect4}",
        "warm_start.teacher: 'connect4' cannot play KuhnPoker-v0"),
    "eval_opponent": (TTT + "eval: {opponents: [ghost]}", "eval.opponents ['ghost']"),
    "format": (TTT + "schedule: {format: elo}", "schedule.format"),
    "env_twice": (f"envs: [{{id: TicTacToe-v0}}, {{id: TicTacToe-v0, kwargs: {{}}}}]\n"
                  f"policies: [{NANO}]", "envs: 'TicTacToe-v0' appears more than once"),
    "duplicate_ids": (TTT + "baselines: [{id: lm, kind: random}]", "repeated: ['lm']"),
    "roles": (TTT.replace("llama-nano}", "llama-nano}, roles: [dealer]"), "policies.0.roles"),
    "no_policies": ("envs: [{id: TicTacToe-v0}]", "policies: Field required"),
    "tournament_model_path": (
        TTT.replace("preset: llama-nano", "path: /no/such/model") + "baselines: [{id: random}]",
        "policies.0.model.path"),
    # decompose
    "family": ("family: {name: poetry}\npolicies: [{id: p}]", "family.name"),
    "planner_policy": (WORDCHAIN.replace("kind: rule", "kind: lm"), "planner.policy"),
    "planner_kind": (WORDCHAIN.replace("kind: rule", "kind: magic"), "planner.kind"),
    "skill": (WORDCHAIN.replace("[add, sub, mul, div]", "[add, sub, mul, div, pow]"),
              "unknown skill 'pow'"),
    "missing_skill": (WORDCHAIN.replace("[add, sub, mul, div]", "[add, sub, mul]"),
                      "subtask type 'div'"),
    "tool_fn": (WORDCHAIN + "tools: [{id: t, fn: 'no_such_mod_x:f', skills: [div]}]",
                "tools.0.fn: cannot import module"),
    # any kind
    "two_kinds": ("envs: [{id: TicTacToe-v0}]\nfamily: {name: wordchain}",
                  "several config kinds: tournament (envs); decompose (family)"),
    "policies_only": (f"policies: [{NANO}]", "pass --kind"),
    "not_yaml": ("envs: [unclosed", "not valid YAML"),
    "not_mapping": ("- a\n- b", "the top level must be a mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_config_is_one_line(name: str, tmp_path: Path, monkeypatch, capsys) -> None:
    text, field = BAD[name]
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    run_dir = tmp_path / "run"
    code, out, err = run_cli(monkeypatch, capsys, "check-config", str(path),
                             "--set", f"run_dir={run_dir}")
    assert code == 2, (out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert field in lines[0], lines[0]
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_kind_option_and_wrong_kind(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"policies: [{NANO}]\n" + TTT.split("\n")[0] + "\nbaselines: [{id: random}]\n")
    code, out, _ = run_cli(monkeypatch, capsys, "check-config", str(path), "--kind", "tournament")
    assert code == 0 and out.startswith("# tournament config, valid")
    code, _, err = run_cli(monkeypatch, capsys, "check-config", str(path), "--kind", "train")
    assert code == 2 and "envs: Extra inputs are not permitted" in err
    code, _, err = run_cli(monkeypatch, capsys, "check-config", str(path), "--kind", "league")
    assert code == 2 and "--kind 'league' is not a config kind" in err


LIGHT_CHECK = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    from agentrt.cli import main
    sys.argv, code = ["agentrt", "check-config", "--no-prompt", sys.argv[1]], 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    heavy = [m for m in ("torch", "transformers", "ray", "matplotlib", "vllm") if m in sys.modules]
    print(json.dumps({"code": code, "heavy": heavy, "s": time.perf_counter() - t0}))
""")


@pytest.mark.parametrize("case", ["ttt_league.yaml", "decompose_wordchain.yaml", "bad_reward"])
def test_check_imports_nothing_heavy(case: str, tmp_path: Path) -> None:
    """A fresh interpreter checks a config without torch, transformers, Ray or matplotlib
    (--no-prompt: the first prompts need the tokenizers); the time it took is reported (not
    asserted: the machine may be busy)."""
    path = ROOT / "examples" / case
    if case == "bad_reward":
        path = tmp_path / "bad.yaml"
        path.write_text("reward: no_such_reward\n")
    proc = subprocess.run([sys.executable, "-c", LIGHT_CHECK, str(path)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    result = json.loads(proc.stdout.splitlines()[-1])
    print(f"check-config {case}: exit {result['code']} in {result['s']:.2f} s")
    assert result["code"] == (2 if case == "bad_reward" else 0), proc.stderr
    assert result["heavy"] == []


EX = ROOT / "examples"
# (command line with {tmp} for the test's folder, a piece of the one error line)
BAD_INPUTS = {
    "train_missing_file": ("train {tmp}/none.yaml", "does not exist"),
    "train_bad_yaml": ("train {tmp}/broken.yaml", "not valid YAML at line"),
    "train_tournament_config": (f"train {EX}/ttt_league.yaml",
                                "run it with `agentrt tournament run`"),
    "train_bad_override": (f"train {EX}/arith_grpo.yaml --set foo",
                           "override 'foo' must look like section.field=value"),
    "train_bad_value": (f"train {EX}/arith_grpo.yaml --set policy.optim.lr=-1",
                        "policy.optim.lr: Input should be greater than 0"),
    "train_unknown_reward": (f"train {EX}/arith_grpo.yaml --set reward=nope",
                             "reward: unknown reward 'nope'"),
    "train_missing_argument": ("train", "Missing argument 'config'"),
    "train_unknown_option": (f"train {EX}/arith_grpo.yaml --bogus", "No such option: --bogus"),
    "tournament_run_train_config": (f"tournament run {EX}/arith_grpo.yaml",
                                    "run it with `agentrt train`"),
    "tournament_run_wrong_baseline": (
        f"tournament run {EX}/ttt_league.yaml --set baselines.1.kind=connect4",
        "baselines.1.kind: 'connect4' cannot play TicTacToe-v0"),
    "tournament_run_list_index": (f"tournament run {EX}/ttt_league.yaml --set policies.3.id=x",
                                  "policies is a list of 1"),
    "tournament_eval_decompose_config": (f"tournament eval {EX}/decompose_wordchain.yaml",
                                         "run it with `agentrt decompose run`"),
    "tournament_eval_missing_file": ("tournament eval {tmp}/none.yaml", "does not exist"),
    "tournament_report_not_a_run": ("tournament report {tmp}", "has no matches.sqlite"),
    "tournament_report_corrupt": ("tournament report {tmp}/corrupt", "cannot be read"),
    "decompose_run_tournament_config": (f"decompose run {EX}/ttt_league.yaml",
                                        "run it with `agentrt tournament run`"),
    "decompose_run_bad_family": (f"decompose run {EX}/decompose_wordchain.yaml "
                                 "--set family.name=poetry", "family.name"),
    "decompose_report_not_a_run": ("decompose report {tmp}", "has no chains.jsonl"),
    "check_config_missing_file": ("check-config {tmp}/none.yaml", "does not exist"),
    "check_config_bad_kind": (f"check-config {EX}/ttt_league.yaml --kind league",
                              "--kind 'league' is not a config kind"),
    "unknown_command": ("tournamnet run x.yaml", "No such command 'tournamnet'"),
    "play_not_a_run": ("play {tmp}", "has no config.yaml; give the folder of a tournament run"),
    "play_train_run": ("play {tmp}/train_run", "is a train run; agentrt play needs a tournament"),
    "play_unknown_policy": ("play {tmp}/league_run --policy ghost",
                            "--policy 'ghost' is not a policy of this run; valid: lm"),
    "play_unfinished_run": ("play {tmp}/league_run", "has no final model; let the run finish"),
    "play_bad_games": ("play {tmp}/league_run --games 0", "--games"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_to_any_command_is_one_line(name: str, tmp_path: Path, monkeypatch,
                                              capsys) -> None:
    """Exit code 2, one line on stderr, no traceback, and nothing started (no run folder)."""
    line, expected = BAD_INPUTS[name]
    (tmp_path / "broken.yaml").write_text("policy: {optim: [unclosed\n")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "matches.sqlite").write_text("not a database")
    for run, example in (("train_run", "arith_grpo.yaml"), ("league_run", "ttt_league.yaml")):
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.yaml").write_text((EX / example).read_text())
    monkeypatch.chdir(tmp_path)  # an example's default run_dir would land here
    args = line.format(tmp=tmp_path).split()
    if args[0] in ("train", "tournament", "decompose") and "report" not in args:
        args += ["--set", f"run_dir={tmp_path / 'run'}"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch, capsys) -> None:
    from agentrt.core.errors import ConfigError

    monkeypatch.setattr(sys, "argv", ["agentrt", "--debug", "check-config", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="does not exist"):
        main()


def test_eval_opponents_default_needs_no_random_baseline(tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    """Without eval.opponents: random when a baseline has that id, else every baseline."""
    path = tmp_path / "c.yaml"
    for baselines, expected in (("[]", []), ("[{id: mm, kind: minimax}]", ["mm"]),
                                ("[{id: mm, kind: minimax}, {id: random}]", ["random"])):
        path.write_text(TTT + f"baselines: {baselines}\n")
        code, out, err = run_cli(monkeypatch, capsys, "check-config", str(path))
        assert code == 0, err
        assert yaml.safe_load(out)["eval"]["opponents"] == expected


@pytest.mark.parametrize("kind", ["train", "tournament", "decompose"])
def test_config_help_lists_every_field(kind: str, monkeypatch, capsys) -> None:
    """config-help prints each field with its default and a description, and an unknown field
    or kind is one line."""
    from agentrt.tools.checks import config_model, describe_fields

    code, out, _ = run_cli(monkeypatch, capsys, "config-help", kind)
    assert code == 0
    rows = describe_fields(config_model(kind))
    leaves = [r for r in rows if r[1] != "section"]
    assert len(leaves) > 50 and all(doc for _, _, _, doc in leaves)
    printed = {line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")}
    assert printed == {path for path, *_ in rows}
    assert "seed: int = 0\n    Global seed" in out
    code, out, _ = run_cli(monkeypatch, capsys, "config-help", kind, "seed")
    assert code == 0 and out.splitlines()[0] == "seed: int = 0"
    code, _, err = run_cli(monkeypatch, capsys, "config-help", kind, "no.such")
    assert code == 2 and f"{kind} configs have no field 'no.such'" in err


def test_config_help_section_and_bad_kind(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "config-help", "train", "policy.algorithm.kl")
    assert code == 0 and out.startswith("policy.algorithm.kl: section\n")
    assert "policy.algorithm.kl.coef: float = 0.0\n    KL coefficient" in out
    assert "policy.algorithm.name" not in out
    code, _, err = run_cli(monkeypatch, capsys, "config-help", "league")
    assert code == 2 and "'league' is not a config kind" in err


def test_config_help_shows_the_fields_of_list_entries(monkeypatch, capsys) -> None:
    """Issue 41: entries of a list (envs, policies, baselines) are described field by field,
    under ``name[].``, and asked for as ``envs.template`` or ``envs.0.template``."""
    code, out, _ = run_cli(monkeypatch, capsys, "config-help", "tournament", "envs.0.template")
    assert code == 0 and out.startswith("envs[].template: section\n    How an env's")
    assert "envs[].template.history: bool = True\n    Later prompts extend" in out
    code, out, _ = run_cli(monkeypatch, capsys, "config-help", "tournament", "policies")
    assert code == 0 and "policies[].rollout.sampling.temperature: float" in out
    assert "policies[].lora.r: int = " in out
    code, out, _ = run_cli(monkeypatch, capsys, "config-help", "decompose", "tools")
    assert code == 0 and "tools[].fn: str = required" in out


def test_an_unknown_env_is_one_clause(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 41: the error of an unknown env id (or of any entry of a list) ends with what is
    wrong with the entry, not with pydantic's "Tuple should have at least 1 item" about the
    list its failure left short."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"envs": [{"id": "Nope-v0"}],
                                   "policies": [{"id": "lm", "model": {"preset": "llama-nano"}}]}))
    code, _, err = run_cli(monkeypatch, capsys, "check-config", str(cfg))
    assert code == 2 and "unknown env 'Nope-v0'" in err, err
    assert "should have at least" not in err and err.rstrip().endswith("(imports:)"), err
