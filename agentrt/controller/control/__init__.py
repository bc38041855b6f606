"""Online control of a running run, without a restart (docs/control.md).

Configured by ``control:`` in the config of every run kind (:class:`ControlConfig`, off by
default): train, tournament and decompose runs alike. Commands come in through a small HTTP
endpoint (bearer token; 127.0.0.1 by default) and, optionally, a Redis stream. A receiving
thread checks each command at once (a bad value or an unknown episode is refused with one
message, nothing queued) and queues it; the controller applies the queue only at a step
boundary, the start of the next step, never mid-step (:meth:`RunControl.step_start`).

Commands (JSON objects; ``agentrt ctl RUN_DIR ...`` sends them):

- ``{"cmd": "set", "values": {"train.prompts_per_step": 64}}``: a live field of the run's kind
  (:meth:`agentrt.controller.workload.Workload.live_fields`: the kind's own, every LM policy's
  sampling and learning rate, ``eval.every``...), validated with the whole config (pydantic)
  as if written in the YAML;
- ``{"cmd": "feedback", "episode": "s12-3", "value": 1.0}``: a late reward for an episode of the
  episode log (:mod:`agentrt.controller.episodes`). At the next step boundary it replaces the episode's
  logged reward and the episode's prompt group (its siblings from the log, with their logged
  rewards or their own feedback) is trained once more in that step's batch, as a group of its
  own, so a group-relative baseline (GRPO, RLOO) sees the corrected reward. An episode more than
  ``feedback.max_staleness`` steps older than that step is logged and dropped (counted);
- ``{"cmd": "inject", "prompts": [{"prompt": "2+2=", "answer": "4"}]}``: prompts the next
  steps draw before their source's;
- ``{"cmd": "pause", "at_step": 12}`` (``at_step`` optional) and ``{"cmd": "resume"}``: hold
  the loop at a step boundary; commands sent meanwhile apply at that boundary.

Feedback and inject apply to a train run's prompts; a kind where they mean nothing refuses them
in one line (:meth:`agentrt.controller.workload.Workload.refusal`: a league's reward is a
match's outcome, it has no prompts).

Every applied change is a metric of that step's row of metrics.jsonl (``control/set/<key>``,
``control/feedback/applied|dropped|trained``, ``control/inject/prompts``) and a log line. The
live values and queued prompts are part of the checkpoint, so a resume keeps them; the run's
identity (run.json) is the config it started with, so the resume is not refused.

Modules: :mod:`agentrt.config.control` (the ``control:`` settings),
:mod:`~agentrt.controller.control.config` (the live fields every kind shares, the error),
:mod:`~agentrt.controller.control.run` (:class:`RunControl`: the queue, checks and application),
:mod:`~agentrt.controller.control.endpoint` (HTTP), :mod:`~agentrt.controller.control.stream` (Redis),
:mod:`~agentrt.controller.control.feedback` (the groups late rewards train again); the client is
:mod:`agentrt.controller.control.client`.
"""
