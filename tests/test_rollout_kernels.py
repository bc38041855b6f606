"""The rollout's CPU kernels: the cache attention kernel equals softmax attention written as
tensor ops (fp32 and bf16, grouped heads, masked keys, a cache longer than the keys read, one
decode query or a prefill's causal queries, head sizes on and off the vector path); the packed
oneDNN linear equals ``F.linear``; and a generate, eager or compiled, runs both (the profiler
sees them, and no MKL matmul or SDPA). bf16 weights are packed only where the CPU has bf16
instructions (AVX-512 BF16 or AMX); elsewhere the tests check the ``F.linear`` fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from agentrt.config.rollout import SamplingConfig
from agentrt.policies.models import build_model, load_model
from agentrt.runtime.rollout import kernels, packed
from agentrt.runtime.rollout.static import StaticDecoder


ROOT = Path(__file__).resolve().parents[1]
# whether oneDNN runs bf16 linears on this CPU
BF16_PACKS = packed.packable(torch.zeros(2, 2, dtype=torch.bfloat16))


def _packs(dtype) -> bool:
    return dtype in (None, torch.float32) or BF16_PACKS


def _reference(q, k_cache, v_cache, attend, scale):
    """Softmax attention as tensor ops, fp32: q [b, heads, s, d], attend [b, 1, s, keys]."""
    keys, groups = attend.shape[-1], q.shape[1] // k_cache.shape[1]
    k = k_cache[:, :, :keys].repeat_interleave(groups, 1).float()
    v = v_cache[:, :, :keys].repeat_interleave(groups, 1).float()
    scores = q.float() @ k.transpose(-1, -2) * scale  # [b, heads, s, keys]
    return scores.masked_fill(~attend, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 64), (4, 2, 64), (2, 1, 128), (3, 3, 40)])
@pytest.mark.parametrize("queries", [1, 3])
def test_cache_attention_equals_softmax_attention(dtype, heads, kv_heads, d, queries):
    assert kernels.available()
    g = torch.Generator().manual_seed(heads * d + queries)
    b, capacity, keys = 5, 23, 17
    k_cache, v_cache = (torch.randn(b, kv_heads, capacity, d, generator=g).to(dtype)
                        for _ in "kv")
    q = torch.randn(b, heads, queries, d, generator=g).to(dtype)
    valid = torch.rand(b, capacity, generator=g) > 0.3
    valid[:, keys - queries:keys] = True  # each query sees its own new key
    valid[0, :keys - queries] = False  # and may see nothing older
    if queries == 1:
        attend = valid[:, None, None, :keys]  # a view, as a decode step passes it
    else:  # causal over the step's own keys, as a prefill passes it
        causal = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
        attend = (valid[:, None, :keys] & causal)[:, None]
    got = kernels.cache_attention(q, k_cache, v_cache, attend, d ** -0.5)
    want = _reference(q, k_cache, v_cache, attend, d ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.allclose(got.float(), want, atol=1e-5 if dtype == torch.float32 else 1e-2), \
        (got.float() - want).abs().max()
    # keys past attend.shape[-1] are never read
    k_cache[:, :, keys:], v_cache[:, :, keys:] = float("nan"), float("nan")
    assert torch.equal(kernels.cache_attention(q, k_cache, v_cache, attend, d ** -0.5), got)
    # row 0's first query sees only its own key: its output is that key's value
    own = v_cache[0, torch.arange(heads) // (heads // kv_heads), keys - queries]
    assert torch.equal(got[0, :, 0], own)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_process(tmp_path):
    """torch's loader waits forever on the lock file of a build whose process was killed; the
    kernel is built in a folder of the process's own and moved into place, then loaded as is."""
    code = ("import pathlib, sys; from torch.utils import cpp_extension; "
            "from agentrt.runtime.rollout import kernels; "
            "d = pathlib.Path(cpp_extension._get_build_directory(kernels.build_name(), False)); "
            "(d / 'lock').touch(); print(kernels.available(), sorted(p.name for p in d.iterdir()))")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    for _ in range(2):  # builds, then loads the build
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.stdout.startswith("True"), out.stderr[-2000:]
    assert f"{kernels.build_name()}.so" in out.stdout and "tmp" not in out.stdout, out.stdout


def greedy(model_dir) -> list[list[int]]:
    """llama-tiny's greedy tokens for 6 prompts, by the static decoder (fp32)."""
    model, tok = load_model(model_dir)
    ids = torch.randint(3, 250, (6, 5), generator=torch.Generator().manual_seed(0))
    tokens, _ = StaticDecoder(model.eval(), tok.pad_token_id, -1).generate(
        ids, torch.ones_like(ids), SamplingConfig(temperature=0.0, max_new_tokens=12))
    return tokens.tolist()


def test_without_a_compiler_decoding_falls_back_to_sdpa_with_one_warning(tmp_path,
                                                                        tiny_model_dir):
    """No C++ compiler (``CXX`` names none; a fresh build folder): the kernel is not built, one
    warning line says why and what to install, and greedy decoding gives the kernel's tokens."""
    code = ("import json, sys; from agentrt.runtime.rollout import kernels; "
            "from tests.test_rollout_kernels import greedy; "
            "print(json.dumps([kernels.available(), greedy(sys.argv[1])]))")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT, env={
                             **os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path),
                             "CXX": str(tmp_path / "no-such-g++")})
    assert out.returncode == 0, out.stderr[-2000:]
    built, tokens = json.loads(out.stdout.strip().splitlines()[-1])
    assert not built and kernels.available()
    assert tokens == greedy(tiny_model_dir)  # here with the kernel
    warned = [line for line in out.stderr.splitlines() if "kernel was not built" in line]
    assert len(warned) == 1 and "no C++ compiler" in warned[0] and "g++" in warned[0], out.stderr
    assert "WARNING !!" not in out.stderr  # torch's own compiler warning is not reached


def test_the_build_is_keyed_by_torch_version_and_the_full_instruction_set(monkeypatch):
    """A shared home folder sees other CPUs and other torch builds: each gets a build of its
    own, not one keyed by the AVX level only."""
    name, flags = kernels.build_name(), kernels.cpu_flags()
    assert "avx2" in flags.split() or "asimd" in flags.split()  # read from /proc/cpuinfo
    monkeypatch.setattr(kernels, "cpu_flags", lambda: flags.rsplit(" ", 1)[0])
    other_cpu = kernels.build_name()  # the same AVX level, one instruction less
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    other_torch = kernels.build_name()
    assert len({name, other_cpu, other_torch}) == 3


def test_cache_attention_refuses_what_it_cannot_run():
    q, cache = torch.randn(2, 4, 1, 64), torch.randn(2, 4, 9, 64)
    attend = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="one dtype"):
        kernels.cache_attention(q.bfloat16(), cache, cache, attend, 0.125)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        kernels.cache_attention(q, cache, cache, torch.ones(2, 1, 1, 10, dtype=torch.bool),
                                0.125)
    with pytest.raises(RuntimeError, match="contiguous caches"):
        kernels.cache_attention(q, cache.transpose(2, 3), cache.transpose(2, 3), attend, 0.125)
    with pytest.raises(RuntimeError, match="fp32 or bf16"):
        kernels.cache_attention(q.half(), cache.half(), cache.half(), attend, 0.125)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_f_linear(dtype):
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(96, 48, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    x = torch.randn(3, 7, 48, generator=g)  # fp32 activations, as under autocast
    p = packed.pack(w, 21)
    want = F.linear(x.to(dtype), w, bias)
    if not _packs(dtype):  # no bf16 oneDNN on this CPU: pack declines, linear is F.linear
        assert p is None and torch.equal(packed.linear(x, w, p, bias), want)
        return
    assert p is not None
    got = packed.linear(x, w, p, bias)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.allclose(got.float(), want.float(), atol=1e-4, rtol=1e-2 if
                          dtype == torch.bfloat16 else 1e-5)
    # the operator the compiled step calls: through the pack where using() holds one for the
    # weight, plain F.linear where it holds none
    with packed.using({w.data_ptr(): p}):
        assert torch.equal(packed.packed_linear(x, w), packed.linear(x, w, p))
    assert torch.equal(packed.packed_linear(x, w), F.linear(x.to(dtype), w))


def test_pack_declines_what_onednn_does_not_run():
    assert packed.pack(torch.randn(4, 4, requires_grad=True), 8) is None  # a training weight
    assert packed.pack(torch.randn(4, 4).half(), 8) is None
    assert packed.pack(torch.randn(4), 8) is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tokenizer = load_model(build_model(tmp_path_factory.mktemp("m") / "m", "llama-tiny",
                                              seed=0))
    return model.eval(), tokenizer


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_generate_runs_the_kernel_and_the_packed_linears(tiny, compile, dtype):
    model, tokenizer = tiny
    decoder = StaticDecoder(model, tokenizer.pad_token_id, -1, autocast_dtype=dtype,
                            compile=compile)
    ids = torch.randint(3, 250, (6, 5), generator=torch.Generator().manual_seed(0))
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=4)
    decoder.generate(ids, torch.ones_like(ids), sampling)  # compiles
    with profile() as prof:
        decoder.generate(ids, torch.ones_like(ids), sampling)
    calls = {e.key: e.count for e in prof.key_averages()}
    layers = len(model.model.layers)
    assert calls.get("agentrt_kernels::cache_attention") == (1 + 3) * layers  # prefill, 3 steps
    assert "aten::scaled_dot_product_attention" not in calls
    if not _packs(dtype):  # bf16 linears where oneDNN does not run them: F.linear's matmuls
        assert "mkldnn::_linear_pointwise" not in calls
        assert {"aten::mm", "aten::addmm", "aten::bmm"} & set(calls), calls
        return
    assert calls.get("mkldnn::_linear_pointwise") == (1 + 3) * (4 * layers + 1)
    assert not {"aten::mm", "aten::addmm", "aten::bmm"} & set(calls), calls
