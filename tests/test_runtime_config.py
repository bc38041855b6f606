"""Runtime config and cluster examples: validated up front, parsed by the tools that run them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.config.load import load_config, parse_overrides, validate_config
from agentrt.core.errors import ConfigError
from agentrt.workloads.prompts.config import TrainConfig

CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster"


@pytest.mark.parametrize("patch, expected", [
    ({"runtime": {"backend": "slurm"}}, "runtime.backend: Input should be 'local' or 'ray'"),
    ({"policy": {"resources": {"placement": "RANDOM"}}}, "policy.resources.placement"),
    ({"policy": {"resources": {"num_workers": 0}}}, "policy.resources.num_workers"),
    ({"policy": {"resources": {"colocate_roles": False}}}, "keep it true"),
    ({"runtime": {"adress": "auto"}}, "runtime.adress: Extra inputs are not permitted"),
    ({"policy": {"algorithm": {"old_logprobs": "rollout"}, "model": {"preset": "llama-nano", "dtype": "bf16"}}},
     "when model.dtype is bf16; use old_logprobs: auto"),
    ({"policy": {"algorithm": {"old_logprobs": "rollout"}, "rollout": {"backend": "vllm"}}},
     "when rollout.backend is vllm; use old_logprobs: auto"),
])
def test_bad_runtime_values_are_one_message_naming_the_field(patch, expected):
    with pytest.raises(ConfigError) as exc:
        validate_config(patch, TrainConfig)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_rollout_logprobs_where_the_numerics_match():
    cfg = validate_config({"policy": {"algorithm": {"old_logprobs": "rollout"}}}, TrainConfig)
    assert cfg.policy.algorithm.old_logprobs == "rollout"


def test_cluster_training_config_validates_and_addresses_override():
    cfg = load_config(CLUSTER / "grpo_cluster.yaml",
                      ["runtime.address=10.0.0.1:6379", "policy.model.path=/tmp"], TrainConfig)
    assert cfg.runtime.backend == "ray" and cfg.runtime.address == "10.0.0.1:6379"
    assert cfg.policy.resources.num_workers == 4 and cfg.policy.resources.gpus_per_worker == 1
    assert parse_overrides(["runtime.address=auto"]) == {"runtime": {"address": "auto"}}


def test_overrides_index_list_sections():
    from agentrt.tournaments.run_config import TournamentRunConfig

    league = Path(__file__).parents[1] / "examples" / "ttt_league.yaml"
    cfg = load_config(league, ["policies.0.optim.lr=3e-4", "envs.0.kwargs.compact=false"],
                      TournamentRunConfig)
    assert cfg.policies[0].optim.lr == 3e-4 and cfg.envs[0].kwargs["compact"] is False
    assert cfg.policies[0].model.preset == "llama-tiny"  # the rest of the entry stays
    with pytest.raises(ConfigError, match=r"override policies\.3: policies is a list of 1"):
        load_config(league, ["policies.3.optim.lr=3e-4"], TournamentRunConfig)


