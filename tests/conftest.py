"""Shared fixtures. Tests are CPU-first; models are built locally (nothing is downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def _devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=_devices())
def device(request: pytest.FixtureRequest) -> str:
    """"cpu" always, and "cuda" too where torch sees a GPU: a test that takes it runs once per
    device, so the same suite checks a GPU machine (the one device rule, agentrt.core.device)."""
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A llama-tiny model + byte tokenizer in HF format, built once per session."""
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama-tiny", "llama-tiny", seed=0)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray runtime with 2 CPUs, started once and shared by every test that needs Ray."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def redis_server():
    """A real redis-server on a free 127.0.0.1 port (AOF on), killed after the test.

    Fails, never skips, when redis-server is not installed: `make test` installs it.
    """
    from agentrt.memory.errors import BackendUnavailableError
    from agentrt.testing.redis_server import RedisServer

    try:
        server = RedisServer().start()
    except BackendUnavailableError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
