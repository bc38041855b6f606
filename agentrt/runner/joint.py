"""One tick's policies acting: each on its own, or together when they share a pool.

In a league tick every game waits on one move, and the seats belong to the learner, its
snapshots and baselines. LM policies whose handles are one pool (``joint_key``) act in one
``act_joint`` call, so the pool decodes their prompts as one batch (docs/runtime.md, "One batch
for a pool's policies and snapshots"); every other policy acts on its own.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Iterator, Mapping, TypeVar

from agentrt.policies.base import ActRequest

log = logging.getLogger(__name__)

Item = TypeVar("Item")  # what the caller keeps beside each request (its episode)


def act_all(policies: Mapping[str, Any], waiting: dict[str, list[tuple[Item, ActRequest]]]
            ) -> Iterator[tuple[str, list[tuple[Item, ActRequest]], Any, float]]:
    """Per waiting policy: ``(policy id, its items, its actions or the exception its act raised,
    its seconds)``.

    Policies with one ``joint_key`` act in one ``act_joint`` call; its time is shared by rows.
    Should the joint call fail, it is logged and each of them acts on its own, so an error stays
    with the policy that raised it."""
    joint: dict[Any, list[str]] = defaultdict(list)
    for pid in waiting:
        key = getattr(policies[pid], "joint_key", None)
        joint[("own", pid) if key is None else key].append(pid)
    for pids in joint.values():
        if len(pids) > 1:
            t0 = time.perf_counter()
            try:
                answers = policies[pids[0]].act_joint(
                    [(policies[pid], [req for _, req in waiting[pid]]) for pid in pids])
            except Exception as e:  # noqa: BLE001 - retried one policy at a time below
                log.warning("policies %s failed acting together (%s: %s); each acts on its own",
                            pids, type(e).__name__, e)
            else:
                share = (time.perf_counter() - t0) / sum(len(waiting[pid]) for pid in pids)
                for pid, actions in zip(pids, answers):
                    yield pid, waiting[pid], actions, share * len(waiting[pid])
                continue
        for pid in pids:
            t0 = time.perf_counter()
            try:
                actions = policies[pid].act([req for _, req in waiting[pid]])
            except Exception as e:  # noqa: BLE001 - the caller records or raises it
                actions = e
            yield pid, waiting[pid], actions, time.perf_counter() - t0
