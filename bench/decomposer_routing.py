"""Router must-shows 3 and 4, measured side by side on real Decompose-v0 chains with scripted
specialists (the scenarios of ``tests/decomposer/routing_sim.py``, which the router tests assert).

- must-show 3, exploration on vs off: two parse specialists, ``clear`` (right on 90% vs 30% of
  parse steps) and ``close`` (70% vs 50%), routed with exploration ``ucb``, ``epsilon`` and
  ``none``. Per run: batches routed before the parse ratings separated, the largest share one
  policy got of any such batch's parse traffic, the mean routing entropy over those batches
  (bits; 1 = an even split of two), the parse success over the whole run and the better
  policy's share of the parse traffic after separation. Claim: with exploration on, no policy
  gets more than 80% of a batch before separation.
- must-show 4, memory of past outcomes: two parse specialists each right on exactly the
  templates the other gets wrong (so success = how often the router picked the better one),
  routed with and without memory (``ucb``, ``epsilon``); better-pick fraction over the batches
  after the first. Claim: memory picks the better specialist more often.

One batch = 32 chains = one training step, all routed before any outcome is known. Everything
is deterministic; the whole run takes under 30 s on 2 cores (most of it importing),
and it exits 1 when a claim fails.

    .venv/bin/python bench/decomposer_routing.py [--batches 12] [--memory-batches 6]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The scripted scenarios are shared with the tests (one definition, asserted there, reported
# here), so they live in the test folder rather than in the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "decomposer"))

from routing_sim import PAIRS, exploration_run, memory_run  # noqa: E402

MODES = ("ucb", "epsilon", "none")
MAX_SHARE = 0.8  # must-show 3: most of a type's traffic one policy may get before separation


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def exploration_table(batches: int) -> dict[tuple[str, str], dict]:
    print(f"must-show 3: exploration on vs off ({batches} batches of 32 chains; parse type)")
    print(f"{'mode':<8} {'pair':<12} {'batches before':>14} {'max share':>10} "
          f"{'mean entropy':>13} {'success':>8} {'better share':>13}")
    print(f"{'':<8} {'(good/bad %)':<12} {'separation':>14} {'before sep':>10} "
          f"{'before (bits)':>13} {'':>8} {'after sep':>13}")
    runs = {}
    for mode in MODES:
        for pair in PAIRS:
            f = runs[mode, pair] = exploration_run(mode, pair, batches)
            label = f"{pair} {PAIRS[pair][0]}/{PAIRS[pair][1]}"
            print(f"{mode:<8} {label:<12} {f['batches_before_separation']:>14} "
                  f"{fmt(f['max_share_before_separation']):>10} "
                  f"{fmt(f['mean_entropy_before_separation']):>13} "
                  f"{fmt(f['parse_success']):>8} {fmt(f['good_share_after_separation']):>13}")
    return runs


def memory_table(batches: int) -> dict[str, dict[bool, float]]:
    print(f"\nmust-show 4: better-pick fraction, memory on vs off (batches 1..{batches - 1})")
    print(f"{'mode':<8} {'with memory':>12} {'without':>8} {'difference':>11}")
    picked: dict[str, dict[bool, float]] = {}
    for mode in ("ucb", "epsilon"):
        picked[mode] = {m: memory_run(mode, m, batches)["better_pick"] for m in (True, False)}
        on, off = picked[mode][True], picked[mode][False]
        print(f"{mode:<8} {on:>12.3f} {off:>8.3f} {on - off:>+11.3f}")
    return picked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12, help="Batches per exploration run.")
    ap.add_argument("--memory-batches", type=int, default=6, help="Batches per memory run.")
    args = ap.parse_args()
    t0 = time.perf_counter()
    runs = exploration_table(args.batches)
    picked = memory_table(args.memory_batches)

    on = [f for (m, _), f in runs.items() if m != "none"]
    on_max = max(f["max_share_before_separation"] for f in on)
    on_entropy = min(f["mean_entropy_before_separation"] for f in on)
    off = {pair: runs["none", pair] for pair in PAIRS}
    ok3 = on_max <= MAX_SHARE
    ok4 = all(p[True] > p[False] for p in picked.values())
    print(f"\nmust-show 3: {'PASS' if ok3 else 'FAIL'}: max share before separation with "
          f"exploration on {on_max:.2f} (<= {MAX_SHARE:.2f}), mean entropy >= {on_entropy:.2f} "
          f"bits; off " + ", ".join(f"{fmt(f['max_share_before_separation'])} ({pair}, "
                                    f"{fmt(f['mean_entropy_before_separation'])} bits)"
                                    for pair, f in off.items()))
    print(f"must-show 4: {'PASS' if ok4 else 'FAIL'}: better pick with memory vs without "
          + ", ".join(f"{m} {p[True]:.2f} vs {p[False]:.2f}" for m, p in picked.items()))
    print(f"(routing runs {time.perf_counter() - t0:.1f} s, after the imports)")
    return 0 if ok3 and ok4 else 1


if __name__ == "__main__":
    sys.exit(main())
