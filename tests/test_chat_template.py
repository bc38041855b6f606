"""Real chat templates (Qwen2.5's ChatML and Llama-3's) on a locally built tokenizer: the train
task's, a league game's and serving's prompts equal ``tokenizer.apply_chat_template(messages,
tokenize=True, add_generation_prompt=True)`` token for token; ``template: none`` keeps the plain
rendering; a bad ``template:`` is one error naming the field; ``check-config`` prints the
rendered first prompt."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agentrt.cli import app
from agentrt.config.sections import PolicyConfig
from agentrt.core.errors import ConfigError
from agentrt.config.load import validate_config
from agentrt.envs.registration import make_multi
from agentrt.policies.base import ActRequest
from agentrt.policies.lm import LMPolicy
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunnerConfig
from agentrt.serving.protocol import parse
from agentrt.tools.first_prompt import first_prompts
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.workloads.prompts.data import open_source

# Qwen2.5-Instruct's template, its tool-call branches left out (no tools here)
QWEN = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# Meta-Llama-3-8B-Instruct's template
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
# Renders the last user message only: a later prompt does not extend the earlier one
FORGETFUL = ("{{ messages[-1]['content'] }}<|im_end|>{% if add_generation_prompt %}"
             "<|im_start|>{% endif %}")
SYSTEM = "You play games well."


def chat_model(folder: Path, template: str, specials: list[str], bos: str | None,
               eos: str) -> Path:
    """llama-nano with its byte-level tokenizer given a chat template and the special tokens it
    uses (embeddings resized), eos the template's end of turn, as Qwen/Llama-3 ship them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrt.policies.models import build_model

    build_model(folder, "llama-nano", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = eos
    if bos is not None:
        tokenizer.bos_token = bos
    tokenizer.chat_template = template
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer))
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_model(tmp_path_factory.mktemp("qwen"), QWEN, ["<|im_start|>", "<|im_end|>"],
                      None, "<|im_end|>")


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_model(tmp_path_factory.mktemp("llama3"), LLAMA3,
                      ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>")


def config(model: Any, data: dict[str, Any]) -> Any:
    return validate_config(data, model)


def tokenizer_of(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def expected(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True,
                                              add_generation_prompt=True)["input_ids"])


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def train_config(folder: Path, **policy: Any) -> TrainConfig:
    return config(TrainConfig, {
        "task": {"name": "arithmetic"},
        "policy": {"id": "arith", "model": {"path": str(folder)}, **policy}})


@pytest.mark.parametrize("name", ["qwen", "llama3"])
def test_train_task_prompt_is_apply_chat_template(name: str, request: Any) -> None:
    folder = request.getfixturevalue(name)
    tokenizer = tokenizer_of(folder)
    cfg = train_config(folder, system=SYSTEM)
    question = open_source(cfg.task, cfg.seed).next(1)[0].prompt  # the task's plain text
    [first] = first_prompts("train", cfg)
    assert first.ids == expected(tokenizer, [{"role": "system", "content": SYSTEM},
                                             user(question)])
    assert first.text.startswith("<|begin_of_text|>" if name == "llama3" else "<|im_start|>")
    # template: none keeps the plain rendering: bos + the prompt's own ids
    [plain] = first_prompts("train", train_config(folder, template="none"))
    assert plain.ids == [tokenizer.bos_token_id] + tokenizer.encode(question,
                                                                    add_special_tokens=False)


def test_a_train_run_plays_and_logs_the_templated_prompts(qwen: Path, tmp_path: Path) -> None:
    """One step of ``agentrt train``'s workload: every episode's prompt ids are the template
    applied to [system, user(task prompt)] of some training example."""
    from agentrt.controller.episodes import EpisodeLog
    from agentrt.workloads.prompts.workload import Trainer

    tokenizer = tokenizer_of(qwen)
    cfg = config(TrainConfig, {
        "seed": 0, "run_dir": str(tmp_path / "run"), "progress": False,
        "task": {"name": "arithmetic", "train_size": 50, "eval_size": 4},
        "policy": {"model": {"path": str(qwen)}, "system": SYSTEM,
                   "rollout": {"sampling": {"max_new_tokens": 3}}},
        "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2},
        "eval": {"every": 100}, "checkpoint": {"every": 100}})
    Trainer(cfg).run()
    source = open_source(cfg.task, cfg.seed)
    allowed = {tuple(expected(tokenizer, [{"role": "system", "content": SYSTEM},
                                          user(ex.prompt)])) for ex in source.train}
    played = list(EpisodeLog(cfg.run_dir))
    assert len(played) == 4
    assert all(tuple(e.prompt_ids) in allowed for e in played)


def test_league_first_and_later_prompts_are_apply_chat_template(qwen: Path) -> None:
    """A real TicTacToe game of the model against itself (greedy, invalid moves retried, so an
    agent's later prompts extend its earlier ones): every prompt equals the template applied
    to the conversation (system, user observations, assistant answers)."""
    from agentrt.runtime.learner import Learner
    from agentrt.tournaments.run_config import TemplateConfig

    tokenizer = tokenizer_of(qwen)
    pcfg = config(PolicyConfig, {
        "id": "lm", "model": {"path": str(qwen)}, "system": SYSTEM,
        "rollout": {"sampling": {"temperature": 0.0, "max_new_tokens": 3}}})
    template = TemplateConfig()
    policy = LMPolicy(Learner(pcfg, seed=0), {"TicTacToe-v0": template.prompt()})
    runner = EpisodeRunner({"lm": policy}, RunnerConfig(
        random_seats=False, invalid_action="retry", max_retries=2, record_text=True))
    record = runner.run([EpisodeSpec("TicTacToe-v0", ("lm", "lm"), seed=0)])
    later = 0
    for traj in record.trajectories:
        messages = [{"role": "system", "content": SYSTEM}]
        canonical = True
        for k, turn in enumerate(traj.turns):
            text = (template.first if k == 0 else template.turn).format(
                observation=turn.info["observation"])
            messages.append(user(text.strip()))
            if canonical:
                assert turn.prompt_ids == expected(tokenizer, messages)
                later += k > 0
            action = turn.info["action"]
            messages.append({"role": "assistant", "content": action})
            ids = turn.response_ids[:-1] if turn.finished else turn.response_ids
            canonical &= ids == tokenizer.encode(action, add_special_tokens=False)
        traj.to_sequence()  # each later prompt extends the earlier prompt and response
    assert later >= 2  # later turns were compared, not only first ones

    # an answer that stopped on the template's end of turn (<|im_end|>, the eos): in the ids once
    first = record.trajectories[0].turns[0]
    answer = tokenizer.encode("4", add_special_tokens=False) + [tokenizer.eos_token_id]
    stopped = dataclasses.replace(first, response_ids=answer, logprobs=[0.0, 0.0],
                                  finished=True, info=dict(first.info, action="4"))
    env = make_multi("TicTacToe-v0")
    env.reset(seed=0)
    ids = policy.prompt_ids(ActRequest(env, "e", "TicTacToe-v0", "player_0", 0, 1, 0, stopped))
    assert ids[:len(first.prompt_ids) + 2] == first.prompt_ids + answer
    assert ids == expected(tokenizer, [
        {"role": "system", "content": SYSTEM},
        user(template.first.format(observation=first.info["observation"]).strip()),
        {"role": "assistant", "content": "4"},
        user(template.turn.format(observation=env.observe("player_0")).strip())])


def test_a_template_that_does_not_extend_is_rendered_afresh(tmp_path: Path) -> None:
    from agentrt.runtime.learner import Learner

    folder = chat_model(tmp_path / "m", FORGETFUL, ["<|im_start|>", "<|im_end|>"], None,
                        "<|im_end|>")
    tokenizer = tokenizer_of(folder)
    pcfg = config(PolicyConfig, {
        "id": "lm", "model": {"path": str(folder)},
        "rollout": {"sampling": {"temperature": 0.0, "max_new_tokens": 3}}})
    runner = EpisodeRunner({"lm": LMPolicy(Learner(pcfg, seed=0))}, RunnerConfig(
        random_seats=False, invalid_action="retry", max_retries=2, record_text=True))
    record = runner.run([EpisodeSpec("TicTacToe-v0", ("lm", "lm"), seed=0)])
    for turn in [t for traj in record.trajectories for t in traj.turns]:
        text = f"{turn.info['observation']}\nAction:"
        assert turn.prompt_ids == expected(tokenizer, [user(text)])
    longer = [traj for traj in record.trajectories if len(traj.turns) > 1]
    assert longer
    with pytest.raises(ValueError, match="does not extend"):  # so each turn trains on its own
        longer[0].to_sequence()


def test_preference_prompts_are_user_messages_through_the_template(qwen: Path,
                                                                    tmp_path: Path) -> None:
    from agentrt.policies.chat import policy_chat
    from agentrt.workloads.prompts.config import DataConfig
    from agentrt.workloads.prompts.preference_data import load_preference_data

    tokenizer = tokenizer_of(qwen)
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "2+2=", "chosen": "4", "rejected": "5"}\n')
    chat = policy_chat(config(PolicyConfig, {"system": SYSTEM}), tokenizer)
    [ex], _ = load_preference_data(DataConfig(path=str(path), eval_fraction=0.0), tokenizer,
                                   False, chat=chat)
    want = expected(tokenizer, [{"role": "system", "content": SYSTEM}, user("2+2=")])
    assert ex.prompts == [want, want]


def test_sft_demonstrations_start_with_the_templated_prompt(qwen: Path) -> None:
    from agentrt.envs.tasks import Example
    from agentrt.policies.chat import policy_chat
    from agentrt.workloads.prompts.data.sources import chat_prompt
    from agentrt.workloads.prompts.workload import demonstrations

    tokenizer = tokenizer_of(qwen)
    chat = policy_chat(config(PolicyConfig, {}), tokenizer)
    [demo] = demonstrations(tokenizer, [Example(chat_prompt(chat, "2+2="), "4")], bos=False)
    turn = demo.turns[0]
    assert turn.prompt_ids == expected(tokenizer, [user("2+2=")])  # no second bos or system
    assert turn.response_ids == tokenizer.encode("4<|im_end|>", add_special_tokens=False)


def test_serving_chat_request_is_apply_chat_template(qwen: Path) -> None:
    tokenizer = tokenizer_of(qwen)
    messages = [{"role": "system", "content": SYSTEM}, user("Say hi."),
                {"role": "assistant", "content": "hi"}, user("Again, in French.")]
    params = parse({"model": "m", "messages": messages}, True, lambda name: tokenizer,
                   lambda name: 2048, 16)
    assert params.prompts == [expected(tokenizer, messages)]


def test_league_template_none_and_auto_without_a_template_keep_the_old_prompt(
        qwen: Path) -> None:
    tokenizer = tokenizer_of(qwen)
    def league(**policy: Any) -> TournamentRunConfig:
        return config(TournamentRunConfig, {
            "policies": [{"id": "lm", "model": {"path": str(qwen)}, **policy}],
            "envs": [{"id": "TicTacToe-v0"}]})

    [chat] = first_prompts("tournament", league(system=SYSTEM))
    assert chat.ids[:1] == [tokenizer.convert_tokens_to_ids("<|im_start|>")]
    assert chat.text.endswith("Action:<|im_end|>\n<|im_start|>assistant\n")
    [plain] = first_prompts("tournament", league(template="none"))
    assert plain.text.startswith("<bos>") and plain.text.endswith("\nAction: ")
    # a preset's byte-level tokenizer has no chat template: auto renders as before
    [preset] = first_prompts("tournament", config(TournamentRunConfig, {
        "policies": [{"id": "lm"}], "envs": [{"id": "TicTacToe-v0"}]}))
    assert preset.text == plain.text


@pytest.mark.parametrize("value, message", [
    ("chatml", "template: 'chatml' is not auto, none, a Jinja chat template nor a file"),
    ("{% for m in messages %}{{ m.content }}", "template: the Jinja chat template does not "
                                                "parse"),
])
def test_a_bad_template_is_one_error_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        config(TrainConfig, {"task": {"name": "arithmetic"},
                                      "policy": {"template": value}})
    assert "\n" not in str(err.value)


def test_check_config_prints_the_rendered_first_prompt(qwen: Path, tmp_path: Path) -> None:
    template = tmp_path / "chatml.jinja"  # a template given as a file overrides the tokenizer's
    template.write_text(QWEN.replace("<|im_end|>", "<|im_end|> "))
    config = tmp_path / "train.yaml"
    config.write_text(f"task: {{name: arithmetic}}\npolicy:\n  id: arith\n  model: {{path: "
                      f"{qwen}}}\n  system: {SYSTEM}\n  template: {template}\n")
    result = CliRunner().invoke(app, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    resolved, _, shown = result.output.partition("# first prompt of arith (task arithmetic), ")
    assert yaml.safe_load(result.output)["policy"]["system"] == SYSTEM  # still YAML
    text = "\n".join(line[4:] for line in shown.splitlines()[1:])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|> \n<|im_start|>user\n")
    assert text.endswith("<|im_end|> \n<|im_start|>assistant\n")
    league = tmp_path / "league.yaml"
    league.write_text(f"policies:\n  - id: lm\n    model: {{path: {qwen}}}\n"
                      f"envs:\n  - id: TicTacToe-v0\n")
    result = CliRunner().invoke(app, ["check-config", str(league)])
    assert result.exit_code == 0, result.output
    assert "# first prompt of lm (TicTacToe-v0 as player_0)" in result.output
    assert "You are Qwen, created by Alibaba Cloud." in result.output
    decompose = Path(__file__).parents[1] / "examples" / "decompose_wordchain.yaml"
    result = CliRunner().invoke(app, ["check-config", str(decompose)])
    assert result.exit_code == 0, result.output
    assert "# first prompt of planner (planner of the first wordchain task)" in result.output
    assert "\n# | <bos>plan: " in result.output  # a preset: no chat template, as before
