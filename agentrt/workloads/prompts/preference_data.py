"""Offline preference data of ``agentrt train`` (``data.path``, docs/preference.md): rows read
from JSONL, Parquet or a datasets folder, parsed (pairwise, listwise or unpaired), tokenized once
into :class:`~agentrt.runtime.preference.PreferenceExample` and split into train and eval by
prompt hash."""

from __future__ import annotations

import json
import logging
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from agentrt.core.errors import AgentrtError
from agentrt.envs.tasks import encode_prompt
from agentrt.policies.chat import Chat
from agentrt.runtime.preference import PreferenceExample
from agentrt.workloads.prompts.config import DataConfig
from agentrt.workloads.prompts.data.sources import chat_prompt

log = logging.getLogger(__name__)


class DataError(AgentrtError):
    """The preference data cannot be read at all (rows that are merely malformed are skipped)."""


def read_rows(cfg: DataConfig) -> list[Any]:
    """Raw rows of ``cfg.path`` (JSONL lines that are not JSON come back as None)."""
    path = Path(str(cfg.path))
    fmt = cfg.format
    if fmt == "auto":
        fmt = "datasets" if path.is_dir() else "parquet" if path.suffix == ".parquet" else "jsonl"
    try:
        if fmt == "jsonl":
            return [_json_or_none(line) for line in path.read_text().splitlines() if line.strip()]
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        import datasets

        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError, ImportError) as exc:
        raise DataError(f"data.path {str(path)!r}: cannot read as {fmt} ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = cfg.split or ("train" if "train" in ds else None)
        if split not in ds:
            raise DataError(f"data.split {split!r} is not in {str(path)!r}; splits: "
                            f"{', '.join(ds)}")
        ds = ds[split]
    return ds.to_list()


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def parse_row(row: Any) -> tuple[str, list[str], list[int], list[float] | None] | str:
    """(prompt, responses, ranks, desirable) of a pairwise, listwise or unpaired row, or the
    reason it is malformed. Shapes: {prompt, chosen, rejected}; {prompt, responses, ranks |
    scores} (no ranks/scores: best first); {prompt, response, desirable | label}."""
    if not isinstance(row, dict):
        return "not a JSON object"
    prompt = row.get("prompt")
    if not isinstance(prompt, str):
        return "missing field"
    if "chosen" in row or "rejected" in row:
        texts, ranks, labels = [row.get("chosen"), row.get("rejected")], [0, 1], None
    elif "responses" in row:
        texts, labels = row["responses"], None
        ranks = _ranks(row, len(texts) if isinstance(texts, list) else -1)
        if isinstance(ranks, str):
            return ranks
    elif "response" in row:
        label = row.get("desirable", row.get("label"))
        if not isinstance(label, (bool, int)) or label not in (0, 1):
            return "missing field"
        texts, ranks, labels = [row["response"]], [0], [float(label)]
    else:
        return "missing field"
    if not all(isinstance(t, str) for t in texts):
        return "missing field"
    if any(not t.strip() for t in texts):
        return "empty response"
    if len(set(texts)) < len(texts):
        return "chosen == rejected"
    return prompt, texts, ranks, labels


def _ranks(row: dict[str, Any], n: int) -> list[int] | str:
    if n < 2:
        return "fewer than 2 responses"
    if "ranks" in row or "scores" in row:
        given = row.get("ranks", row.get("scores"))
        if not isinstance(given, list) or len(given) != n or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in given):
            return "ranks/scores do not match responses"
        key = given if "ranks" in row else [-x for x in given]  # higher score = better
        levels = sorted(set(key))
        ranks = [levels.index(x) for x in key]
    else:
        ranks = list(range(n))
    return ranks if len(set(ranks)) > 1 else "all responses tie"


def load_preference_data(cfg: DataConfig, tokenizer: Any, accepts_unpaired: bool,
                         exclude_prompts: set[str] = frozenset(), chat: Chat | None = None
                         ) -> tuple[list[PreferenceExample], list[PreferenceExample]]:
    """(train, eval) examples of ``cfg.path``, tokenized once; malformed rows are counted,
    skipped and reported in one warning line. Rows whose prompt is in ``exclude_prompts`` (the
    task's held-out prompts, as the policy's prompts render them) are dropped. The eval split is
    by prompt hash, so no prompt is in both splits. With ``chat`` (the policy's chat template) a
    prompt is a user message rendered through it, as the policy's own prompts are."""
    rows = read_rows(cfg)
    skipped: Counter[str] = Counter()
    train, held_out, excluded = [], [], 0
    eos = [tokenizer.eos_token_id]
    for row in rows:
        parsed = parse_row(row)
        if isinstance(parsed, str):
            skipped[parsed] += 1
            continue
        prompt, texts, ranks, labels = parsed
        if labels is not None and not accepts_unpaired:
            skipped["unpaired row (needs algorithm kto)"] += 1
            continue
        if chat_prompt(chat, prompt) in exclude_prompts:
            excluded += 1
            continue
        p_ids = (encode_prompt(tokenizer, prompt) if chat is None else
                 chat.ids([{"role": "user", "content": prompt}]))
        r_ids = [tokenizer.encode(t, add_special_tokens=False) + eos for t in texts]
        if len(p_ids) + max(len(r) for r in r_ids) > cfg.max_length:
            skipped["too long"] += 1
            continue
        ex = PreferenceExample(prompt, [p_ids] * len(r_ids), r_ids, ranks, labels)
        is_eval = zlib.crc32(prompt.encode()) % 10_000 < cfg.eval_fraction * 10_000
        (held_out if is_eval else train).append(ex)
    if skipped:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        log.warning("preference data %s: skipped %d of %d rows (%s)", cfg.path,
                    sum(skipped.values()), len(rows), detail)
    if excluded:
        log.info("preference data: dropped %d rows whose prompt is a held-out task prompt",
                 excluded)
    if not train:
        raise DataError(f"data.path {cfg.path!r} has no usable training rows "
                        f"(read {len(rows)}, skipped {sum(skipped.values())})")
    return train, held_out
