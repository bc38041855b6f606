"""bench/rollout.py --arch in small, so the bench cannot rot: one round over Llama, a static-path
architecture (Qwen2) and a fallback one (GPT-2) reports each one's path (the fallback's reason),
its greedy parity with ``generate``, a positive tokens/s and a ratio to Llama."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "rollout_arch.py"


def _bench():
    spec = importlib.util.spec_from_file_location("rollout_arch", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arch_bench_reports_path_speed_and_ratio(tmp_path):
    bench = _bench()
    rows = bench.bench_archs(bench.parse_archs("gpt2,qwen2"), size="nano", rounds=1,
                             workdir=tmp_path, batch=8, new_tokens=4)
    assert list(rows) == ["llama", "gpt2", "qwen2"]
    for arch in ("llama", "qwen2"):
        assert rows[arch]["path"] == "static" and rows[arch]["reason"] is None
        assert rows[arch]["greedy_equal"] == rows[arch]["greedy_rows"] == 64
    assert rows["gpt2"]["path"] == "generate" and "gpt2" in rows["gpt2"]["reason"]
    assert rows["gpt2"]["greedy_rows"] == 0
    assert rows["llama"]["ratio"] == 1.0
    for row in rows.values():
        assert len(row["runs"]) == 1 and row["runs"][0]["tokens"] > 0
        assert row["tok_s"] > 0 and row["ratio"] > 0
        assert row["params"] > row["params_non_embedding"] > 0


def test_arch_bench_names_an_unknown_architecture():
    with pytest.raises(SystemExit, match="--arch: unknown architecture bert"):
        _bench().parse_archs("qwen2,bert")
