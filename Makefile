# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench install clean redis-server

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Reinstall only when the dependency list changes; the package itself is editable.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/agentrt train examples/arith_grpo.yaml

# Memory tests start their own real redis-server on 127.0.0.1 (openssl makes its TLS test
# certificates); install Debian's packages when missing.
redis-server:
	@(command -v redis-server && command -v openssl) >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		redis-server openssl)

test: $(STAMP) redis-server
	$(BIN)/python -m pytest

test-fast: $(STAMP) redis-server
	$(BIN)/python -m pytest -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/grpo_arith.py

clean:
	rm -rf $(VENV) runs .pytest_cache
