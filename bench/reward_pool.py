"""A slow reward function (sleep) scored serially vs from a pool of 4 workers (issue 14,
must-show 3): the same batch, the same values, the wall-time ratio measured side by side.

    .venv/bin/python bench/reward_pool.py [--samples 64] [--sleep 0.05]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from agentrt.rewards.executors import Sample, build_executor
from agentrt.rewards.sources import parse_reward

SLOW = """
import time

def slow(prompt, response, info):
    time.sleep({sleep})
    return float(response.strip() == info["answer"])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds per reward call")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-reward-pool-"))
    (folder / "bench_slow_reward.py").write_text(SLOW.format(sleep=args.sleep))
    sys.path.insert(0, str(folder))
    samples = [Sample(f"s1-{i}", f"{i}+1=", str(i + 1 - i % 2), {"answer": str(i + 1)})
               for i in range(args.samples)]
    seconds, values = {}, {}
    for label, extra in (("serial (workers: 1)", {}),
                         ("threads (workers: 4)", {"workers": 4}),
                         ("processes (workers: 4)", {"workers": 4, "pool": "process"})):
        executor = build_executor(parse_reward({"python": "bench_slow_reward:slow", **extra}))
        executor.score_batch(samples[:8])  # warm-up: the pool is up, the module imported
        start = time.perf_counter()
        values[label], errors, _ = executor.score_batch(samples)
        seconds[label] = time.perf_counter() - start
        executor.close()
        assert errors == [None] * len(samples)
    serial = "serial (workers: 1)"
    assert all(v == values[serial] for v in values.values()), "pooled scores differ"
    print(f"{args.samples} samples, {args.sleep * 1000:.0f} ms per call; scores identical")
    for label, s in seconds.items():
        print(f"{label:24s} {s:6.2f} s   speed-up x{seconds[serial] / s:.2f}")


if __name__ == "__main__":
    main()
