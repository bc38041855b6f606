"""Small local models: a causal LM of any architecture of :data:`~agentrt.policies.presets.ARCHITECTURES` and a byte-level tokenizer, built in code.

Nothing can be downloaded here, so tests, examples and benchmarks build their model with
:func:`build_model` and save it in Hugging Face format; transformers (and vLLM) then load the folder
like any other checkpoint. Any local Hugging Face model folder works the same way through
:func:`load_model`.

Presets keep head_dim = 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

from agentrt.core.errors import ConfigError, ModelLoadError
from agentrt.policies.presets import CONTEXT, PRESETS
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per UTF-8 byte plus <pad>, <bos>, <eos>.

    It encodes any string (any language, any bytes) without unknown tokens, and one character of
    ASCII is one token, which keeps digit-level tasks learnable by tiny models.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS.values()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False,
                                   **SPECIAL_TOKENS)


def _arch_fields(arch: str, widths: dict[str, int]) -> dict[str, Any]:
    """The config fields of ``arch`` at ``widths``: each family's own names, dropout off, the
    rotary/window/softcap settings its released checkpoints use (short rollouts stay inside
    every sliding window)."""
    heads, head_dim = widths["num_attention_heads"], widths["hidden_size"] // widths["num_attention_heads"]
    if arch == "gpt2":
        return dict(n_embd=widths["hidden_size"], n_inner=widths["intermediate_size"],
                    n_layer=widths["num_hidden_layers"], n_head=heads, n_positions=CONTEXT,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    fields: dict[str, Any] = dict(widths, max_position_embeddings=CONTEXT)
    if arch == "gpt_neox":
        fields.pop("num_key_value_heads")
        return dict(fields, rotary_pct=0.25, use_parallel_residual=True, attention_dropout=0.0,
                    hidden_dropout=0.0, layer_norm_eps=1e-5)
    fields.update(rms_norm_eps=1e-6, rope_theta=10000.0)
    if arch in ("qwen3", "gemma2", "gemma3", "mistral"):
        fields["head_dim"] = head_dim
    if arch == "llama":
        fields.update(attention_bias=False)
    if arch == "qwen2":
        fields.update(use_sliding_window=False)
    if arch in ("gemma2", "gemma3"):
        fields.update(query_pre_attn_scalar=head_dim, sliding_window=512,
                      hidden_activation="gelu_pytorch_tanh")
    if arch == "gemma2":
        fields.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    return fields


def model_config(preset: str = "llama-tiny", vocab_size: int = 259, **overrides: Any
                 ) -> PretrainedConfig:
    """The transformers config of a preset (see :data:`PRESETS`: ``<architecture>-<size>``),
    with any field overridden."""
    if preset not in PRESETS:
        raise ModelLoadError(f"unknown model preset {preset!r}; valid: {', '.join(PRESETS)}")
    arch, widths = PRESETS[preset]
    fields = dict(vocab_size=vocab_size, tie_word_embeddings=True, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, **_arch_fields(arch, widths))
    fields.update(overrides)
    return AutoConfig.for_model("gemma3_text" if arch == "gemma3" else arch, **fields)


def build_model(out_dir: str | Path, preset: str = "llama-tiny", seed: int = 0,
                **overrides: Any) -> Path:
    """Builds a randomly initialised model + tokenizer and saves both to ``out_dir`` (HF format).

    Returns:
        The folder, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained`` like a downloaded checkpoint.
    """
    out = Path(out_dir)
    tokenizer = build_tokenizer()
    cfg = model_config(preset, vocab_size=len(tokenizer), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "agentrt_model.json").write_text(json.dumps({"preset": preset, "seed": seed}))
    return out


# Files a Hugging Face tokenizer loads from (one is enough: fast, SentencePiece, BPE vocab, or
# the config of a tokenizer that says where its vocabulary comes from).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "tokenizer_config.json")


def check_model_folder(folder: Path) -> None:
    """A local Hugging Face model folder: it exists and has a config.json and a tokenizer
    (ModelLoadError)."""
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {str(folder)!r} does not exist; set policy.model.path "
                             "to a local Hugging Face folder or use policy.model.preset")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"model folder {str(folder)!r} has no config.json; it is not a "
                             "Hugging Face model folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"model folder {str(folder)!r} has no tokenizer (none of "
                             f"{', '.join(TOKENIZER_FILES)}); save it beside the weights "
                             "(tokenizer.save_pretrained(folder))")


def lora_targets(model: torch.nn.Module, names: tuple[str, ...] | None = None
                 ) -> tuple[list[str], bool]:
    """The module names a LoRA adapter of ``model`` adapts, and whether they are GPT-2 style
    ``Conv1D`` layers (weights stored in x out: peft's ``fan_in_fan_out``).

    ``names`` given (``lora.target_modules``) wins; None: every linear layer of the transformer
    blocks, the output head excluded (what peft calls ``all-linear``), so the default fits any
    architecture: Llama/Qwen/Gemma/Mistral's q/k/v/o_proj and gate/up/down_proj, Phi-3's
    qkv_proj, o_proj, gate_up_proj, down_proj, GPT-2's c_attn, c_proj, c_fc, NeoX's
    query_key_value, dense, dense_h_to_4h, dense_4h_to_h. ``model`` may already carry adapters.
    """
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    found: dict[str, bool] = {}  # leaf name -> is Conv1D
    for name, module in model.named_modules():
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts) or module is head or \
                not isinstance(module, (torch.nn.Linear, Conv1D)):
            continue
        leaf = parts[-2] if parts[-1] == "base_layer" else parts[-1]  # peft wraps the layer
        if leaf != "lm_head":
            found[leaf] = found.get(leaf, False) or isinstance(module, Conv1D)
    if names:
        linear = [n.removesuffix(".base_layer") for n, m in model.named_modules()
                  if isinstance(m, (torch.nn.Linear, Conv1D)) and "lora_" not in n]
        missing = [t for t in names if not any(n == t or n.endswith(f".{t}") for n in linear)]
        if missing:  # peft's own error comes after the load, as an unexplained exception
            raise ConfigError(f"lora.target_modules: {', '.join(map(repr, missing))} is no "
                              f"linear layer of this model; its layers: "
                              f"{', '.join(sorted(found))}")
    targets = list(names) if names else sorted(found)
    return targets, any(found.get(n, False) for n in targets)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32
               ) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Loads any local Hugging Face causal-LM folder. Raises ModelLoadError with one clear line."""
    folder = Path(path)
    check_model_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model from {str(folder)!r}: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
