"""Settings of the prompt sources (``task: {name: dataset | redis, options: {...}}``).

Light on purpose: the config is validated before anything heavy is imported (agentrt.tools.checks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from agentrt.core.schema import ConfigModel


class Columns(ConfigModel):
    """Which column of the file is which part of an example."""

    prompt: str | None = Field(
        None, min_length=1, description="Column of the prompt text (default 'prompt' when "
        "messages is unset).")
    messages: str | None = Field(
        None, min_length=1, description="Column of chat messages ([{role, content}, ...]), "
        "rendered with the tokenizer's chat template (else 'role: content' lines).")
    answer: str | None = Field(
        "answer", description="Column of the reference answer (info['answer']); null: none.")
    extra: tuple[str, ...] = Field(
        (), description="Other columns put into the example's info, under their own names, for "
        "the reward.")

    @model_validator(mode="after")
    def _one_prompt(self) -> Columns:
        if self.prompt is not None and self.messages is not None:
            raise ValueError("columns: set prompt (a text column) or messages (a chat column), "
                             "not both")
        return self

    @property
    def prompt_column(self) -> str:
        """The column holding the prompt (text or messages)."""
        return self.messages or self.prompt or "prompt"

    def names(self) -> dict[str, str]:
        """Every mapped column: ``{field name: column}`` (for error messages)."""
        out = {("messages" if self.messages else "prompt"): self.prompt_column}
        if self.answer is not None:
            out["answer"] = self.answer
        out |= {f"extra.{i}": c for i, c in enumerate(self.extra)}
        return out


class EvalSplit(ConfigModel):
    """Where the held-out prompts come from (``task.eval_size`` of them are used)."""

    path: str | None = Field(
        None, description="A separate file of held-out rows (same format and columns); its "
        "prompts are also left out of training.")
    fraction: float | None = Field(
        None, gt=0.0, lt=1.0, description="Hold out this share of prompts by a hash of the "
        "prompt (never trained on); eval uses the first eval_size of them. Unset (and no path): "
        "the file's first eval_size rows are held out.")

    @model_validator(mode="after")
    def _one_way(self) -> EvalSplit:
        if self.path is not None and self.fraction is not None:
            raise ValueError("eval: set path or fraction, not both")
        if self.path is not None and not Path(self.path).exists():
            raise ValueError(f"eval.path {self.path!r} does not exist")
        return self


class DatasetOptions(ConfigModel):
    """``task: {name: dataset}``: prompts streamed from a JSONL, Parquet or saved datasets file."""

    path: str = Field(description="A .jsonl or .parquet file, or a datasets folder "
                      "(save_to_disk).")
    format: Literal["auto", "jsonl", "parquet", "datasets"] = Field(
        "auto", description="File format; auto picks by suffix (a folder is a datasets folder).")
    split: str | None = Field(
        None, description="Split of a saved DatasetDict (default: 'train' when present).")
    columns: Columns = Field(default_factory=Columns)
    eval: EvalSplit = Field(default_factory=EvalSplit)
    shuffle_buffer: int = Field(
        4096, ge=0, description="Rows held for shuffling (blocks are read in a shuffled order "
        "too); 0 reads the file in order. Memory stays bounded by it, whatever the file size.")

    @model_validator(mode="after")
    def _exists(self) -> DatasetOptions:
        if not Path(self.path).exists():
            raise ValueError(f"path {self.path!r} does not exist")
        return self

    @property
    def resolved_format(self) -> str:
        """The format, with 'auto' decided by the path."""
        return resolved_format(self.path, self.format)


def resolved_format(path: str, fmt: str) -> str:
    """'auto' -> 'datasets' for a folder, 'parquet' for .parquet, else 'jsonl'."""
    if fmt != "auto":
        return fmt
    p = Path(path)
    return "datasets" if p.is_dir() else "parquet" if p.suffix == ".parquet" else "jsonl"
