"""Issue 18, must-show 3: a league with a Redis memory bank, killed with SIGKILL at random moments
and resumed with the same command each time, ends with the metrics rows, match records and
memory records of a run that was never killed: none missing, none twice. A run of the same
config started fresh in another folder leaves the first run's records alone (issue 41, finding
4: its start deleted them, both runs being keyed by the config hash alone).

Before memory writes were keyed by run, step, episode (the match id) and seat, a resumed league
wrote the replayed steps' memories again under new random ids. The bench with 20 kills:
``.venv/bin/python bench/league_replay.py``.
"""

from __future__ import annotations

from league_replay import (compare, flush, memory_rows, run_killed, run_through, state,
                           write_config)

KILLS = 4


def test_killed_and_resumed_league_ends_with_the_uninterrupted_records(tmp_path, redis_server):
    url = redis_server.url
    straight_cfg = write_config(tmp_path / "straight", url)
    span = run_through(straight_cfg, tmp_path / "straight.log")
    straight = state(straight_cfg.parent / "run", url)
    assert straight["memory records"], "the league wrote no memories: nothing is compared"
    assert len(straight["metrics rows"]) == 9  # step 0 and steps 1-8
    # The same config started fresh in another folder (0 steps: its start only, which writes
    # no record) must not delete the first run's records.
    run_through(write_config(tmp_path / "other", url, steps=0), tmp_path / "other.log")
    assert memory_rows(url) == straight["memory records"]
    flush(url)  # the next run starts from an empty bank, as the first did (a shared bank's
    # records are read by every run, and a fact a policy stored is not stored again)

    killed_cfg = write_config(tmp_path / "killed", url)
    kills = run_killed(killed_cfg, tmp_path / "killed.log", KILLS, span, seed=18)
    killed = state(killed_cfg.parent / "run", url)

    counts = compare(straight, killed)
    print(f"{kills} kills:", counts)
    for kind, c in counts.items():
        assert c["missing"] == c["duplicated"] == c["foreign"] == 0, (kind, c)
    # Same rows in the same order, the same record texts, metadata and vectors (the ids derive
    # from each folder's run_uid, the step, the match and the seat).
    assert killed == straight


