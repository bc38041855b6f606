"""The leakage cause of ``agentrt debug`` (:mod:`agentrt.tools.debug`): is the sample's prompt or
answer in what the run trained on or remembers?

Exact matches (case and whitespace aside) and embedding matches (cosine at least
:data:`~agentrt.tools.evidence.COSINE`) of the prompt and the answer against the run's training
data (the task's train split, the rows of a preference data file) and the records of the FAISS
memory banks in the run folder, and whether the prompt is in the train and the eval split at once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentrt.tools.evidence import COSINE, MIN_ANSWER_CHARS, Cause, Sample, clip


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def memory_texts(run_dir: Path) -> list[tuple[str, str]]:
    """(bank, text) of every record of the FAISS banks under ``<run_dir>/memory/`` (read-only:
    the live snapshot and its write log; Redis banks live in their server, not the folder)."""
    out: list[tuple[str, str]] = []
    for bank in sorted((run_dir / "memory").glob("*/bank.json")):
        folder = bank.parent
        records: dict[str, str] = {}
        current = folder / "CURRENT"
        seq = 0
        if current.is_file():
            snap = folder / current.read_text().strip()
            for line in (snap / "records.jsonl").read_text().splitlines():
                row = json.loads(line)
                if row is not None:
                    records[row["id"]] = row["text"]
            seq = int(json.loads((snap / "meta.json").read_text())["seq"])
        wal = folder / f"wal-{seq:012d}.jsonl"
        for line in wal.read_text().splitlines() if wal.is_file() else []:
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a torn last line
            if entry["op"] == "put":
                records.update({r["id"]: r["text"] for r in entry["records"]})
            elif entry["op"] == "del":
                for rid in entry["ids"]:
                    records.pop(rid, None)
        out += [(folder.name, text) for text in records.values()]
    return out


def leakage_cause(run_dir: Path, cfg: Any, s: Sample, embedder: str = "hashing") -> Cause:
    """Exact and embedding matches of the prompt and answer in training data and memory."""
    train, evals, what = training_data(cfg, run_dir)
    mem = memory_texts(run_dir)
    ev = [f"training data: {what}; memory: {len(mem)} records in "
          f"{len({b for b, _ in mem})} FAISS banks"]
    why: list[str] = []
    in_train, in_eval = _exact(s, train, evals, mem, why, ev)
    _embedded(s, train, mem, embedder, why, ev)
    summary = "; ".join(dict.fromkeys(why)) or "no match in training data or memory"
    return Cause("leakage", bool(why), summary, ev,
                 {"in_train": in_train, "in_eval": in_eval, "memory_records": len(mem),
                  "embedder": embedder})


def training_data(cfg: Any, run_dir: Path) -> tuple[list[Any], list[Any], str]:
    """(train, eval) examples of the run and what they are: the task's splits or the rows of a
    prompt file (``task: {name: dataset}``), and the rows of a preference data file
    (``data.path``; its best response as the answer)."""
    from agentrt.envs.tasks import TASKS, Example, make_splits

    t = cfg.task
    if t.name in TASKS:
        train, evals = make_splits(t.name, t.options, t.train_size, t.eval_size, t.seed)
        what = [f"{t.name} train split ({len(train)} prompts, seed {t.seed})"]
    elif t.name == "dataset":
        train, evals = file_examples(cfg, run_dir)
        what = [f"prompt file {t.options.get('path')} ({len(train)} training rows, "
                f"{len(evals)} held out)"]
    else:  # a stream (redis): its prompts are gone once trained on
        train, evals = [], []
        what = [f"task {t.name!r} is a stream; its prompts are not checked"]
    if cfg.data.path is not None:
        from agentrt.workloads.prompts.preference_data import parse_row, read_rows

        rows = [r for r in map(parse_row, read_rows(cfg.data)) if not isinstance(r, str)]
        train = train + [Example(prompt, texts[ranks.index(min(ranks))]) for prompt, texts,
                         ranks, _ in rows]
        what.append(f"data file {cfg.data.path} ({len(rows)} rows)")
    return train, evals, "; ".join(what)


def file_examples(cfg: Any, run_dir: Path) -> tuple[list[Any], list[Any]]:
    """Every training row of a prompt file (the rows its held-out test keeps out of the
    eval split) and its eval examples, as the run's source renders them (through the policy's chat
    template, agentrt.policies.chat)."""
    from agentrt.workloads.prompts.data import open_source
    from agentrt.workloads.prompts.data.config import resolved_format
    from agentrt.workloads.prompts.data.readers import open_reader
    from agentrt.workloads.prompts.data.stream import SkipCounter, scan

    source = open_source(cfg.task, cfg.seed)
    folder = run_model_folder(cfg.policy, run_dir)
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        from agentrt.policies.chat import policy_chat

        tokenizer = AutoTokenizer.from_pretrained(folder)
        source.start(tokenizer, policy_chat(cfg.policy, tokenizer))
    o = source.opts
    reader = open_reader(o.path, resolved_format(o.path, o.format), o.split,
                         list(o.columns.names().values()))
    rows = scan(reader, o.columns, SkipCounter(o.path, warn=False))
    return ([source.example(r) for r in rows if not source.held_out(r)],
            source.eval_examples())


def run_model_folder(policy: Any, run_dir: Path) -> Path:
    """A policy's model folder (``policy``: its config): ``model.path``, or the preset the run
    built in its folder."""
    m = policy.model
    return Path(m.path) if m.path is not None else run_dir / f"base_model_{m.preset}"


def _exact(s: Sample, train: list[Any], evals: list[Any], mem: list[tuple[str, str]],
           why: list[str], ev: list[str]) -> tuple[bool, bool]:
    """Exact matches (whitespace and case aside); appends reasons and evidence. Returns
    whether the prompt is in the train and in the eval split."""
    prompt, answer = _norm(s.prompt), _norm(str(s.info.get("answer", "")))
    in_train = prompt in {_norm(ex.prompt) for ex in train}
    in_eval = prompt in {_norm(ex.prompt) for ex in evals}
    if in_train:
        ev.append("prompt is in the train split (exact)" + (
            ": expected, the run trained on this episode" if s.trained else ""))
        if not s.trained:
            why.append("the prompt is in the training data (exact match)")
    if in_train and in_eval:
        why.append("the prompt is in the train and the eval split (train/eval leakage)")
    ev.append(f"prompt in the eval split: {'yes' if in_eval else 'no'}")
    mem_exact = [(b, x) for b, x in mem if prompt and prompt in _norm(x)]
    if mem_exact:
        why.append(f"the prompt is in memory bank {mem_exact[0][0]!r}")
        ev.append(f"prompt found in memory: {clip(mem_exact[0][1])}")
    if len(answer) < MIN_ANSWER_CHARS:
        ev.append(f"answer {clip(answer)}: under {MIN_ANSWER_CHARS} characters, not matched "
                  "exactly")
        return in_train, in_eval
    word = re.compile(rf"(?<!\w){re.escape(answer)}(?!\w)")
    hits = [(f"memory bank {b!r}", x) for b, x in mem if word.search(_norm(x))] + \
           [("a train prompt", ex.prompt) for ex in train if word.search(_norm(ex.prompt))]
    ev.append(f"answer {clip(answer)} found exactly in {len(hits)} texts"
              + (f", first in {hits[0][0]}: {clip(hits[0][1])}" if hits else ""))
    if hits:
        why.append(f"the answer is in {hits[0][0]}")
    return in_train, in_eval


def _embedded(s: Sample, train: list[Any], mem: list[tuple[str, str]], embedder: str,
              why: list[str], ev: list[str], chunk: int = 8192) -> None:
    """Embedding matches (cosine >= COSINE) of the prompt and the answer; appends reasons and
    evidence. A near-duplicate prompt counts when it carries the same answer (a train
    example's answer, or a memory record holding it): '32+15=' and '32+28=' embed alike but
    answer differently. A trained episode's train matches are expected, not counted. The
    corpus is embedded ``chunk`` texts at a time (memory stays bounded)."""

    from agentrt.memory.embedders import build_embedder

    corpus = [(ex.prompt, _norm(ex.answer), True) for ex in train] + \
             [(x, None, False) for _, x in mem]
    if not corpus:
        return
    prompt, answer = _norm(s.prompt), _norm(str(s.info.get("answer", "")))
    emb = build_embedder(embedder, 1024 if embedder == "hashing" else None)
    queries = emb.encode([s.prompt, answer or s.prompt])
    best: dict[str, tuple[float, str]] = {}  # "prompt", "same" (carrying the answer), "answer"

    def keep(key: str, score: float, text: str) -> None:
        if score > best.get(key, (-2.0, ""))[0]:
            best[key] = (score, text)

    for start in range(0, len(corpus), chunk):
        part = corpus[start:start + chunk]
        sims = queries @ emb.encode([text for text, _, _ in part]).T  # [2, chunk]
        for j, (text, their_answer, is_train) in enumerate(part):
            keep("prompt", float(sims[0, j]), text)
            if is_train and s.trained:
                continue
            carries = answer != "" and (their_answer == answer if is_train
                                        else answer in _norm(text))
            if carries and _norm(text) != prompt:
                keep("same", float(sims[0, j]), text)
            keep("answer", float(sims[1, j]), text)
    near, text = best["prompt"]
    ev.append(f"embedding ({embedder}): nearest to the prompt {clip(text)} cosine {near:.3f}")
    if "same" in best:
        near, text = best["same"]
        ev.append(f"embedding: nearest with the same answer {clip(text)} cosine {near:.3f}")
        if near >= COSINE:
            why.append(f"a near-duplicate (cosine {near:.2f} >= {COSINE:g}) with the same "
                       "answer is in the training data or memory")
    if len(answer) >= MIN_ANSWER_CHARS and "answer" in best:
        near, text = best["answer"]
        ev.append(f"embedding: nearest to the answer {clip(text)} cosine {near:.3f}")
        if near >= COSINE:
            why.append(f"the answer embeds as {clip(text)} (cosine {near:.2f})")
