"""Writes a Parquet file of arithmetic prompts for ``examples/grpo_parquet.yaml``.

Columns: ``question`` ("37+45="), ``target`` (the integer answer), ``tolerance`` (how far off a
reply may be and still count: 0, 1 or 2; read by the reward in examples/prompt_rewards.py) and
``difficulty`` (operand digits). Written in row groups through a ParquetWriter, so the script
itself runs in constant memory for any ``--rows``.

    python examples/make_prompts_parquet.py                      # 100,000 rows
    python examples/make_prompts_parquet.py --rows 1000 --out /tmp/p.parquet --missing-every 100
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([("question", pa.string()), ("target", pa.int64()),
                    ("tolerance", pa.int64()), ("difficulty", pa.int64())])


def rows(n: int, seed: int, missing_every: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        digits = rng.choice((1, 2, 2, 3))
        a, b = rng.randrange(10**digits), rng.randrange(10**digits)
        target = None if missing_every and i % missing_every == missing_every - 1 else a + b
        out.append({"question": f"{a}+{b}=", "target": target,
                    "tolerance": rng.choice((0, 0, 1, 2)), "difficulty": digits})
    return out


def write(out: Path, n: int, seed: int = 0, row_group: int = 5000, missing_every: int = 0
          ) -> Path:
    """Writes ``n`` rows to ``out`` in row groups of ``row_group`` rows; returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, SCHEMA) as writer:
        for start in range(0, n, row_group):
            part = rows(min(row_group, n - start), seed * 1_000_003 + start, missing_every)
            writer.write_table(pa.Table.from_pylist(part, schema=SCHEMA))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("examples/data/prompts.parquet"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-group", type=int, default=5000, help="rows per row group")
    parser.add_argument("--missing-every", type=int, default=0,
                        help="leave the target of every k-th row empty (0: none)")
    args = parser.parse_args()
    path = write(args.out, args.rows, args.seed, args.row_group, args.missing_every)
    print(f"wrote {args.rows} rows to {path}")


if __name__ == "__main__":
    main()
