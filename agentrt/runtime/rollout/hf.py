"""Rollout over any causal LM module (the always-available backend).

The hybrid engine serves its trainable module through this class, so rollout sees every update
with no copy; frozen snapshots (league opponents) wrap their own frozen module the same way.
Models of the families the static decoder runs (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3)
decode with :class:`~agentrt.runtime.rollout.static.StaticDecoder` (a pre-allocated KV cache,
sampling and log-probs on tensors, finished rows dropped); other models, or
``decode="hf"``, use ``model.generate``. Both give the same greedy tokens and the same log-probs;
sampled tokens follow the same distribution from another random stream (docs/rollout.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agentrt.config.rollout import SamplingConfig
from agentrt.core.device import autocast_for, module_device
from agentrt.runtime.rollout.static import StaticDecoder, unsupported_reason

DECODE_MODES = ("auto", "hf", "static")


@dataclass
class Completion:
    """One generated response.

    Attributes:
        response_ids: Generated token ids, eos included when generation stopped on eos.
        logprobs: Log-probability of each generated id under the temperature-scaled policy.
        finished: True when it stopped on eos, False when cut by ``max_new_tokens``.
    """

    response_ids: list[int]
    logprobs: list[float]
    finished: bool


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[ids] without materialising the full log-softmax. [B,T,V],[B,T]->[B,T]."""
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


class HFRollout:
    """Batched sampling with per-token log-probs from ``model.generate``.

    Args:
        model: A causal LM (plain or peft-wrapped).
        tokenizer: Its tokenizer (pad and eos ids are read from it).
        sampling: Default sampling config.
        batch_size: Prompts per ``generate`` call.
        autocast_dtype: ``torch.bfloat16`` for bf16 autocast, None for fp32.
        decode: ``"static"`` (the static decoder; the model must be of a family it runs,
            :data:`~agentrt.runtime.rollout.families.FAMILIES`), ``"hf"``
            (``model.generate``) or ``"auto"`` (static where the model allows it, else hf).
        compile: The static decoder's decode steps through torch.compile (``policy.compile``).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, sampling: SamplingConfig,
                 batch_size: int = 256, autocast_dtype: torch.dtype | None = None,
                 decode: str = "auto", compile: bool = False) -> None:
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, not {decode!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.batch_size = batch_size
        self.autocast_dtype = autocast_dtype
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        reason = unsupported_reason(model) if decode != "hf" else None
        if decode == "static" and reason is not None:
            raise ValueError(f"rollout.decode is 'static' but {reason}; set rollout.decode: hf "
                             "or auto")
        self.decoder = (StaticDecoder(model, self.pad_id, self.eos_id, autocast_dtype, compile)
                        if decode != "hf" and reason is None else None)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None,
                 streamer: Any = None, adapters: list[str] | None = None,
                 frozen: dict[str, dict[str, torch.Tensor]] | None = None) -> list[Completion]:
        """One response per prompt (token-id lists, non-empty); temperature 0 is greedy.

        ``streamer`` (transformers' streamer protocol: ``put`` gets the prompt ids, then each
        step's new ids, one per row) sees the tokens as they are generated; with a streamer the
        prompts must fit one batch (``batch_size``). ``adapters`` (a peft model): each prompt's
        LoRA adapter, all of them in one batch (peft's mixed-batch ``adapter_names``); with
        ``frozen`` (the static decoder only), each prompt's full weights instead: a name in
        ``frozen`` is that snapshot's, any other the module's own.
        """
        if frozen is not None and self.decoder is None:
            raise ValueError("a batch of full-weight snapshots needs the static decoder")
        s = sampling or self.sampling
        if streamer is not None and len(prompts) > self.batch_size:
            raise ValueError(f"a streamer follows one batch; {len(prompts)} prompts exceed "
                             f"batch_size {self.batch_size}")
        out: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            out += self._generate_batch(
                prompts[start:start + self.batch_size], s, streamer,
                None if adapters is None else adapters[start:start + self.batch_size], frozen)
        return out

    def _generate_batch(self, prompts: list[list[int]], s: SamplingConfig, streamer: Any = None,
                        adapters: list[str] | None = None,
                        frozen: dict[str, dict[str, torch.Tensor]] | None = None
                        ) -> list[Completion]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (e.g. bos)")
        width = max(len(p) for p in prompts)
        # left padding (generation continues at the right edge), one tensor from one list
        device = module_device(self.model)  # the module's device, never an assumed CPU
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts],
                           device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=device)
        if self.decoder is not None:
            new, logps = self.decoder.generate(ids, mask, s, streamer, adapters, frozen)
            return [self._trim(n, lp) for n, lp in zip(new.tolist(), logps.tolist())]
        greedy = s.temperature == 0.0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=s.max_new_tokens, do_sample=not greedy, pad_token_id=self.pad_id,
            eos_token_id=self.eos_id, output_logits=True, return_dict_in_generate=True,
        )
        if not greedy:
            # top_k as configured: 0 means off. None would not: transformers fills None from the
            # model's generation_config or its own default top_k=50. With top_k 0 and top_p 1.0
            # generate adds no top-k/top-p warper (transformers 5.x: `top_k != 0`, `top_p < 1`).
            gen_kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        from transformers import GenerationConfig

        with autocast_for(device, self.autocast_dtype):
            res = self.model.generate(input_ids=ids, attention_mask=mask, streamer=streamer,
                                      generation_config=GenerationConfig(**gen_kwargs),
                                      **({} if adapters is None else {"adapter_names": adapters}))
        new = res.sequences[:, width:]
        logits = torch.stack(res.logits, dim=1).float() / (1.0 if greedy else s.temperature)
        logps = token_logprobs(logits, new)
        return [self._trim(n, lp) for n, lp in zip(new.tolist(), logps.tolist())]

    def _trim(self, ids: list[int], logps: list[float]) -> Completion:
        if self.eos_id in ids:
            end = ids.index(self.eos_id) + 1
            return Completion(ids[:end], logps[:end], finished=True)
        return Completion(ids, logps, finished=False)
