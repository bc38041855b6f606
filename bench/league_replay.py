"""Issue 18, must-show 3: 20 kill -9s at random moments of a league with a Redis memory bank.

    .venv/bin/python bench/league_replay.py                 # 20 kills, seed 0
    .venv/bin/python bench/league_replay.py --kills 5 --seed 3 --steps 8

Starts a real redis-server, runs the league of tests/tournaments/league_replay.py once straight
through, empties the bank, then runs it again in a new folder, SIGKILLing the whole run after a
random share (seeded) of the straight run's duration, ``--kills`` times, resuming with the same
command after each, and finally letting it end. Prints, per kind (metrics rows, match records,
memory records in Redis), the rows of each run, the rows missing from the killed run, those it
holds twice and those the straight run does not hold; exits 1 unless all three are zero.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "tournaments"))

from league_replay import compare, flush, run_killed, run_through, state, write_config  # noqa: E402

from agentrt.testing.redis_server import RedisServer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--steps", type=int, default=8, help="league steps")
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="league-replay-") as tmp:
            folder = Path(tmp)
            cfg = write_config(folder / "straight", server.url, args.steps)
            span = run_through(cfg, folder / "straight.log")
            straight = state(cfg.parent / "run", server.url)
            flush(server.url)
            cfg = write_config(folder / "killed", server.url, args.steps)
            start = time.monotonic()
            kills = run_killed(cfg, folder / "killed.log", args.kills, span, seed=args.seed)
            killed = state(cfg.parent / "run", server.url)
            took = time.monotonic() - start
    finally:
        server.stop()
    counts = compare(straight, killed)
    print(f"straight run {span:.0f} s; {kills} SIGKILLs at random moments and resumes "
          f"{took:.0f} s")
    print(f"{'':16}{'uninterrupted':>14}{'killed':>8}{'missing':>9}{'duplicated':>11}"
          f"{'foreign':>9}")
    for kind, c in counts.items():
        print(f"{kind:16}{c['uninterrupted']:>14}{c['killed']:>8}{c['missing']:>9}"
              f"{c['duplicated']:>11}{c['foreign']:>9}")
    same = killed == straight
    print("identical to the uninterrupted run (texts, metadata, vectors, order; ids carry each "
          "folder's run_uid):", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
