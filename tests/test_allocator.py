"""runtime.keep_freed_memory: a step's freed tensors are reused, not faulted in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from agentrt.config.sections import RuntimeConfig
from agentrt.workloads.prompts.config import TrainConfig

PROBE = """
import json, resource, sys, torch
from agentrt.runtime.allocator import keep_freed_memory
applied = keep_freed_memory(sys.argv[1] == "keep")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                            torch.nn.Linear(2048, 512))
x = torch.randn(8192, 512)
faults = []
for _ in range(8):  # training steps: 64 MB activations and gradients allocated and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")
def test_freed_memory_is_reused_instead_of_faulted_in_every_step():
    default, kept = probe("default"), probe("keep")
    assert not default["applied"] and kept["applied"]
    # the default returns the large blocks to the OS: every step faults them in again (16-91k
    # pages a step measured); kept, the later steps reuse them: most fault (almost) nothing,
    # though some may still fault in one 64 MB block (16,384 pages) while the trim threshold
    # settles (0-32k measured; four steps of six once, under load), so the test compares totals
    later_default, later_kept = default["faults"][2:], kept["faults"][2:]
    assert min(later_default) > 16384
    assert sum(later_kept) <= sum(later_default) / 2, (later_kept, later_default)


def test_on_by_default_and_off_by_config():
    assert RuntimeConfig().keep_freed_memory is True
    assert RuntimeConfig(keep_freed_memory=False).keep_freed_memory is False


def test_setup_objects_are_frozen_until_the_run_ends():
    import gc

    from agentrt.runtime.allocator import freeze_setup_objects, release_setup_objects

    assert gc.get_freeze_count() == 0
    freeze_setup_objects()
    try:
        assert gc.get_freeze_count() > 0
        cycle: list = []
        cycle.append(cycle)  # garbage made after the freeze is still collected
        del cycle
        assert gc.collect() > 0
    finally:
        release_setup_objects()
    assert gc.get_freeze_count() == 0


FREEZE_COUNTS: list[int] = []


def test_a_run_freezes_after_its_first_step_and_releases_at_its_end(tmp_path, tiny_model_dir):
    import gc

    from agentrt.config.load import validate_config
    from agentrt.rewards import reward
    from agentrt.workloads.prompts.workload import Trainer
    from test_trainer import small_config

    @reward("test_freeze_count")
    def count(prompt: str, response: str, info: dict) -> float:
        FREEZE_COUNTS.append(gc.get_freeze_count())
        return 0.0

    cfg = small_config(tmp_path, tiny_model_dir, reward="test_freeze_count")
    cfg["train"] = {**cfg.get("train", {}), "steps": 3}
    Trainer(validate_config(cfg, TrainConfig)).run()
    assert FREEZE_COUNTS[0] == 0  # the start-up evaluation and step 1 run unfrozen
    frozen = [i for i, c in enumerate(FREEZE_COUNTS) if c > 0]
    assert frozen and frozen == list(range(frozen[0], frozen[-1] + 1))  # then steps 2-3
    assert gc.get_freeze_count() == 0  # released at the end of the run
