"""The canary routes of ``agentrt serve`` (``POST|GET /admin/canary``, ``POST /v1/feedback``) and
what a canary does to the served versions: a mixin of :class:`agentrt.serving.api.Api`, which
holds the state they use (``host``, ``batcher``, ``canaries``, ``finished``, ``canary_log``,
``canary_defaults``, ``max_body``, ``on_decided``, ``_tasks``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentrt.core.errors import AgentrtError
from agentrt.core.schema import format_validation_error
from agentrt.rewards import RewardFn, resolve_reward, score
from agentrt.serving.canary import CanaryConfig, CanaryRun
from agentrt.serving.canary_stats import Arm, Decision
from agentrt.serving.http import read_json
from agentrt.serving.protocol import RequestError

log = logging.getLogger(__name__)


class CanaryRoutes:
    """Starting canaries, counting their rewards, and acting on their decisions."""

    async def admin_canary(self, request: Request) -> Response:
        """GET: every canary (running first) with its events; POST: start one (CanaryConfig)."""
        self._auth(request, admin=True)
        if request.method == "GET":
            runs = [*self.canaries.values(), *reversed(self.finished)]
            return JSONResponse({"canaries": [r.status() for r in runs]})
        body = await read_json(request, self.max_body)
        if not isinstance(body, dict):
            raise RequestError('the body must be {"model": NAME, "path": FOLDER, ...}')
        try:
            cfg = CanaryConfig.model_validate({**self.canary_defaults, **body})
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            raise RequestError(format_validation_error(exc),
                               param=str(loc[0]) if loc else None) from None
        return JSONResponse((await self.start_canary(cfg)).status())

    async def start_canary(self, cfg: CanaryConfig, resume: dict[str, Any] | None = None
                           ) -> CanaryRun:
        """Loads ``cfg.path`` as the candidate of ``cfg.model`` and starts its canary (or goes
        on with a saved one: ``resume`` is a :meth:`CanaryRun.snapshot`).

        Raises:
            RequestError: a bad scorer or path, or the name is busy (409).
        """
        try:
            scorer = resolve_reward(cfg.scorer) if cfg.scorer else None
        except AgentrtError as exc:
            raise RequestError(str(exc), param="scorer") from None
        self._free(cfg.model)
        self._changing.add(cfg.model)
        try:
            incumbent = self.host.current[cfg.model]
            candidate = await self._load(cfg.model, Path(cfg.path), candidate=True)
            run = CanaryRun(cfg, scorer, incumbent, candidate, self.canary_log, resume)
            self.canaries[cfg.model] = run
        finally:
            self._changing.discard(cfg.model)
        log.info("%s: canary of %s on %.1f%% of requests", cfg.model, candidate.fingerprint,
                 100 * cfg.share)
        return run

    async def feedback(self, request: Request) -> Response:
        """``{"id": completion id, "reward": number}``: the reward of a canary's response."""
        self._auth(request)
        body = await read_json(request, self.max_body)
        rid = body.get("id") if isinstance(body, dict) else None
        value = body.get("reward") if isinstance(body, dict) else None
        if not isinstance(rid, str) or isinstance(value, bool) or \
                not isinstance(value, (int, float)):
            raise RequestError('the body must be {"id": COMPLETION_ID, "reward": NUMBER}',
                               param="reward" if isinstance(rid, str) else "id")
        run = next((r for r in self.canaries.values() if rid in r.served), None)
        if run is None:
            raise RequestError(f"no canary waits for a reward of {rid!r}: only responses served "
                               "while a canary runs count, each once", 404, "id",
                               "not_found_error")
        if not run.running:
            raise RequestError(f"the canary of {run.cfg.model!r} has decided; this reward is not "
                               "counted", 409, "id", "conflict_error")
        try:
            decision = await self._count(run, rid, float(value), "feedback")
        except ValueError as exc:
            raise RequestError(str(exc), param="reward") from None
        return JSONResponse({"id": rid, "model": run.cfg.model, "counted": True,
                             "look": decision.record() if decision else None,
                             "state": run.state})

    async def _count(self, run: CanaryRun, rid: str, value: float, via: str) -> Decision | None:
        decision = run.reward(rid, value, via)
        if decision is not None and decision.decision != "continue":
            await self._decide(run, decision)
        return decision

    async def _decide(self, run: CanaryRun, decision: Decision) -> None:
        """Promotes the candidate through the hot-swap path, or withdraws it."""
        if decision.decision == "promote":
            fn = lambda: self.host.promote(run.candidate)  # noqa: E731
        else:
            fn = lambda: self.host.withdraw(run.candidate)  # noqa: E731
        await asyncio.wrap_future(self.batcher.call(fn))
        current = self.host.current[run.cfg.model]
        run.finish(decision, current)
        del self.canaries[run.cfg.model]
        self.finished.append(run)
        log.info("%s: canary %s %s (%s)", run.cfg.model, run.candidate.fingerprint, run.state,
                 decision.rule)
        if self.on_decided is not None:
            self.on_decided(run)

    def _answered(self, run: CanaryRun | None, arm: Arm | None, rid: str, prompts: list[list[int]],
                  texts: list[str], tokenizer: Any) -> None:
        """A canary's response was made: it waits for a reward; a scorer gives one now."""
        if run is None or arm is None or not run.running:
            return
        run.answered(rid, arm)
        if run.scorer is not None:
            task = asyncio.get_running_loop().create_task(
                self._score(run, run.scorer, rid, prompts, texts, tokenizer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _score(self, run: CanaryRun, fn: RewardFn, rid: str, prompts: list[list[int]],
                     texts: list[str], tokenizer: Any) -> None:
        samples = [(tokenizer.decode(p, skip_special_tokens=True), t,
                    {"model": run.cfg.model, "id": rid}) for p, t in zip(prompts, texts)]
        values, errors = await asyncio.to_thread(score, fn, samples)
        if errors or not run.running:
            return  # a failed score is no sample (score logged it)
        try:
            await self._count(run, rid, sum(values) / len(values), "scorer")
        except (KeyError, ValueError) as exc:
            log.warning("%s: scorer reward not counted: %s", run.cfg.model, exc)
