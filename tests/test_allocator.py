"""runtime.keep_freed_memory: a step's freed tensors are reused, not faulted in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from agentrt.config import RuntimeConfig

PROBE = """
import json, resource, sys, torch
from agentrt.allocator import keep_freed_memory
applied = keep_freed_memory(sys.argv[1] == "keep")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                            torch.nn.Linear(2048, 512))
x = torch.randn(8192, 512)
faults = []
for _ in range(6):  # training steps: 64 MB activations and gradients allocated and freed
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
    # the default returns the large blocks to the OS: every step faults them in again (65-85k
    # pages a step measured); kept, the steps after the first two reuse them (16k, then 0)
    assert min(default["faults"][2:]) > 16384
    assert sum(kept["faults"][2:]) < 0.25 * sum(default["faults"][2:])


def test_on_by_default_and_off_by_config():
    assert RuntimeConfig().keep_freed_memory is True
    assert RuntimeConfig(keep_freed_memory=False).keep_freed_memory is False
