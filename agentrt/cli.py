"""Command line: ``agentrt train CONFIG.yaml [--set section.field=value ...]``.

Errors a user can meet print as one line (``error: ...``) with exit code 2, never a traceback
(``agentrt --debug ...`` shows it). Every command checks its whole config (agentrt.tools.checks) before
it imports torch or creates a run folder.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from agentrt.core.errors import AgentrtError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="agentrt: RL post-training of many language-model policies.")
_DEBUG = {"on": False}
_IMPORT = typer.Option(None, "--import", help="Plugin module to import before the config is "
                       "checked (repeatable; see agentrt.core.plugins).")
_NEW_RUN = typer.Option(False, "--new-run", help="Start over in the run folder: delete what the "
                        "run it holds wrote (checkpoints, metrics, records, reports, models).")
_RESUME = typer.Option("auto", "--resume", help="auto: resume the folder's run only if it is "
                       "this config's; force: resume it with this config even so.")


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors.")
             ) -> None:
    _DEBUG["on"] = debug


def _launch(kind: str, config: Path, set_: Optional[list[str]], imports: Optional[list[str]],
            run_dir: Optional[str], new_run: bool, resume: str, frozen: bool = False) -> Any:
    """The one way every run command starts: the config checked whole (before torch is imported
    or a folder written), then :func:`agentrt.tools.checks.launch`. ``frozen``: nothing trains."""
    _setup()
    if resume not in ("auto", "force"):
        raise AgentrtError(f"--resume takes auto or force, not {resume!r}")
    if new_run and resume == "force":
        raise AgentrtError("--new-run starts over and --resume force continues; pass one")
    from agentrt.tools.checks import launch, load_checked

    overrides = list(set_ or []) + ([f"run_dir={run_dir}"] if run_dir else [])
    cfg = load_checked(config, overrides, expect=kind, imports=imports or ())[1]
    if frozen:  # a rating-only tournament: nothing trains, every baseline plays (eval_only too)
        cfg = cfg.model_copy(update={
            "policies": tuple(p.model_copy(update={"trainable": False}) for p in cfg.policies),
            "baselines": tuple(b.model_copy(update={"eval_only": False}) for b in cfg.baselines)})
    return launch(kind, cfg, "new" if new_run else resume)


def _setup() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Our own progress messages at INFO; libraries (faiss, httpx, ray) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentrt").setLevel(logging.INFO)


_SET = typer.Option(None, "--set", help="Override: section.field=value")


def _train_summary(run: Any, last: dict[str, float]) -> list[str]:
    acc = last.get("eval/accuracy")
    return [f"run folder: {run.run_dir.path}",
            *([f"final held-out accuracy: {acc:.3f}"] if acc is not None else []),
            f"curves: {run.run_dir.path / 'curves.png'}"]


def _league_summary(run: Any, last: dict[str, float]) -> list[str]:
    return [run.workload.leaderboard_text, f"report: {run.workload.report_path}"]


def _decompose_summary(run: Any, last: dict[str, float]) -> list[str]:
    lines = [f"run folder: {run.run_dir.path}"]
    if "eval/success" in last:
        lines.append(f"held-out task success: {last['eval/success']:.3f}, plan validity: "
                     f"{last['eval/plan_valid']:.3f}")
    return [*lines, f"report: {run.run_dir.path / 'report.html'}"]


def _run_command(kind: str, doc: str, summary: Callable[[Any, dict[str, float]], list[str]]
                 ) -> Callable[..., None]:
    """The command of a run kind: one launch, the run, then the kind's summary lines."""

    def command(config: Path = typer.Argument(..., help=f"YAML {kind} config (see examples/)."),
                set_: Optional[list[str]] = _SET, imports: Optional[list[str]] = _IMPORT,
                run_dir: Optional[str] = typer.Option(None, help="Output folder (overrides "
                                                                 "run_dir)."),
                new_run: bool = _NEW_RUN, resume: str = _RESUME) -> None:
        run = _launch(kind, config, set_, imports, run_dir, new_run, resume)
        last = run.run()
        for line in summary(run, last):
            typer.echo(line)

    command.__doc__ = doc
    return command


app.command("train")(_run_command(
    "train", "Train one policy on a built-in task: optional SFT warm start, then GRPO/PPO/...",
    _train_summary))


@app.command("check-config")
def check_config(
    config: Path = typer.Argument(..., help="YAML config to validate (any kind)."),
    set_: Optional[list[str]] = _SET,
    imports: Optional[list[str]] = _IMPORT,
    kind: Optional[str] = typer.Option(
        None, help="train, tournament or decompose (default: told by the config's sections)."),
    prompt: bool = typer.Option(
        True, help="Print each policy's first prompt, rendered (loads the tokenizers: "
                   "transformers; --no-prompt validates without it)."),
) -> None:
    """Validate a config of any kind and print it resolved, then each policy's first prompt
    as the run renders it (chat template included), without running anything.

    It resolves what the config names: envs, rewards, baselines against the envs they play,
    model and data paths, plugin modules (imports:).
    """
    from agentrt.tools.checks import load_checked
    from agentrt.config.load import dump_config
    from agentrt.tools.first_prompt import first_prompts

    found, cfg = load_checked(config, list(set_ or []), kind=kind, imports=imports or ())
    typer.echo(f"# {found} config, valid\n{dump_config(cfg)}", nl=False)
    for first in first_prompts(found, cfg) if prompt else []:
        typer.echo(first.show(), nl=False)


@app.command("config-help")
def config_help(
    kind: str = typer.Argument("train", help="train, tournament or decompose."),
    field: Optional[str] = typer.Argument(
        None, help="Only this field or section and what is under it (e.g. policy.algorithm)."),
) -> None:
    """Every field of a config kind: its path, type, default and what it does."""
    from agentrt.tools.checks import help_rows

    for path, type_, default, doc in help_rows(kind, field):
        head = f"{path}: {type_}" + (f" = {default}" if default else "")
        typer.echo(f"{head}\n    {doc}" if doc else head)


tournament_app = typer.Typer(no_args_is_help=True, help="Self-play leagues and tournaments.")
app.add_typer(tournament_app, name="tournament")
tournament_app.command("run")(_run_command(
    "tournament", "Train learning policies by playing scheduled matches; resumes if the folder "
    "has a checkpoint; ends with the leaderboard and the HTML report.", _league_summary))


@tournament_app.command("eval")
def tournament_eval(
    config: Path = typer.Argument(..., help="YAML config: frozen policies (model.path) and "
                                            "baselines; schedule.format round_robin or swiss."),
    set_: Optional[list[str]] = _SET,
    imports: Optional[list[str]] = _IMPORT,
    new_run: bool = _NEW_RUN,
    resume: str = _RESUME,
) -> None:
    """Rating-only tournament between checkpoints and baselines (nothing trains)."""
    run = _launch("tournament", config, set_, imports, None, new_run, resume, frozen=True)
    run.run()
    typer.echo(run.workload.leaderboard_text)
    typer.echo(f"\n{run.workload.seat_text}")  # each pair of players by seat: win/draw/loss
    typer.echo(f"report: {run.workload.report_path}")


@tournament_app.command("exploit")
def tournament_exploit(
    run_dir: Path = typer.Argument(..., help="A finished tournament run folder."),
    policy: Optional[str] = typer.Option(None, help="Only this policy (default: learners)."),
    checkpoint: Optional[Path] = typer.Option(None, help="A checkpoints/step_N folder (default: "
                                                         "final_models)."),
    exploiter_steps: int = typer.Option(0, min=0, help="Also train an exploiter this many steps "
                                        "against each final model (any game; 0: off)."),
    exploiter_games_per_step: int = typer.Option(64, min=1, help="The exploiter's games/step."),
    exploiter_games: int = typer.Option(200, min=1, help="Its final games vs the policy."),
    imports: Optional[list[str]] = _IMPORT,
) -> None:
    """Exact exploitability of the final policies: NashConv (OpenSpiel games, Kuhn poker),
    best-response values per seat (tic-tac-toe), invalid mass; with --exploiter-steps, an
    exploiter's final win rate (approximate, any game); docs/tournaments.md."""
    _setup()
    from agentrt.tools.exploit import exploit_rows, format_rows

    typer.echo(format_rows(exploit_rows(run_dir, policy, imports or (), checkpoint,
                                        exploiter_steps, exploiter_games_per_step,
                                        exploiter_games)))


@tournament_app.command("report")
def tournament_report(run_dir: Path = typer.Argument(..., help="A tournament run folder.")
                      ) -> None:
    """Rebuild the HTML report (leaderboard, rating and win-rate curves, payoff heat map)."""
    from agentrt.tournaments.report import write_report
    from agentrt.tournaments.records import MatchStore

    import sqlite3

    if not (run_dir / "matches.sqlite").is_file():
        raise AgentrtError(f"{run_dir} has no matches.sqlite; is it a tournament run folder?")
    try:
        typer.echo(f"report: {write_report(MatchStore(run_dir, readonly=True))}")
    except sqlite3.DatabaseError as exc:
        raise AgentrtError(f"{run_dir / 'matches.sqlite'} cannot be read ({exc}); is it a "
                           "tournament run's match database?") from None


decompose_app = typer.Typer(no_args_is_help=True,
                            help="Long tasks split into subtask chains run by specialists.")
app.add_typer(decompose_app, name="decompose")
decompose_app.command("run")(_run_command(
    "decompose", "Train a planner and its specialists on a task family's chains; resumes if the "
    "folder has a checkpoint; ends with held-out success and the HTML report.",
    _decompose_summary))


@decompose_app.command("report")
def decompose_report(run_dir: Path = typer.Argument(..., help="A decomposer run folder.")
                     ) -> None:
    """Rebuild the HTML report (success per subtask type, routing over time, example chains)."""
    from agentrt.decomposer.report import write_report

    if not (run_dir / "chains.jsonl").is_file():
        raise AgentrtError(f"{run_dir} has no chains.jsonl; is it a decomposer run folder?")
    typer.echo(f"report: {write_report(run_dir)}")


@app.command("play")
def play_command(
    run_dir: Path = typer.Argument(..., help="A finished tournament run folder."),
    policy: Optional[str] = typer.Option(None, help="Policy to play (default: the first "
                                                    "trainable one)."),
    env: Optional[str] = typer.Option(None, help="Env of the run (default: its first)."),
    seat: int = typer.Option(0, help="Your seat: 0 moves first."),
    games: int = typer.Option(1, min=1, help="Games to play."),
    sample: bool = typer.Option(False, help="Sample the policy's moves (default: greedy)."),
    imports: Optional[list[str]] = _IMPORT,
) -> None:
    """Play a trained policy in the terminal (any turn-based env of the run)."""
    _setup()
    from agentrt.tools.play import play

    results = play(run_dir, policy, env, seat, games, sample, imports or ())
    if games > 1:
        typer.echo(f"you won {results.count('win')} of {games} games, drew "
                   f"{results.count('draw')}")


@app.command("serve")
def serve_command(
    target: Path = typer.Argument(..., help="A run folder, a Hugging Face model folder or a "
                                            "LoRA adapter folder."),
    adapter: Optional[list[str]] = typer.Option(None, help="NAME=PATH: one more LoRA adapter "
                                                           "over the base (repeatable)."),
    base: Optional[Path] = typer.Option(None, help="Base model folder of the adapters."),
    name: Optional[str] = typer.Option(None, help="Served name of a model/adapter folder."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="TCP port (0: any free one; the line printed says)."),
    token: Optional[str] = typer.Option(None, help="Bearer token requests must send (default: "
                                                   "$AGENTRT_SERVE_TOKEN); admin routes need it."),
    backend: str = typer.Option("hf", help="Rollout backend: hf or vllm."),
    device: Optional[str] = typer.Option(None, help="Where the hf backend runs: auto (CUDA "
                                                    "when a GPU is visible), cpu or cuda "
                                                    "(default: a run folder's model.device, "
                                                    "else auto)."),
    max_batch: int = typer.Option(32, help="Most requests in one generate call."),
    max_tokens: int = typer.Option(64, help="max_tokens of a request that sets none."),
    max_request_mb: float = typer.Option(8.0, help="Largest request body (MiB); larger ones "
                                                   "get 413 before they are read."),
    canary_share: Optional[float] = typer.Option(None, help="Canary: share of requests the "
                                                            "candidate answers (0.05)."),
    canary_alpha: Optional[float] = typer.Option(None, help="Canary: chance of promoting a "
                                                            "candidate worse by the margin "
                                                            "(0.05)."),
    canary_power: Optional[float] = typer.Option(None, help="Canary: chance of promoting an "
                                                            "equal candidate (0.9)."),
    canary_margin: Optional[float] = typer.Option(None, help="Canary: non-inferiority margin "
                                                             "in reward units (0.05)."),
    canary_scorer: Optional[str] = typer.Option(None, help="Canary: reward function scoring "
                                                           "every response (a registered name "
                                                           "or module:function)."),
    canary_log: Path = typer.Option(Path("canary.jsonl"), help="Canary decisions (JSON lines)."),
    follow: bool = typer.Option(False, help="TARGET is a run still training (checkpoint.models: "
                                            "true): serve its newest checkpoint and try each "
                                            "newer one through a canary."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: tuned on the "
                                                     "first model at start, see agentrt.runtime.threads)."),
) -> None:
    """Serve a run's policies behind an OpenAI-compatible HTTP API (docs/serving.md)."""
    _setup()
    from agentrt.serving.server import serve

    canary = {"share": canary_share, "alpha": canary_alpha, "power": canary_power,
              "margin": canary_margin}
    serve(target, adapter or (), base, name, host, port, token, backend, max_batch, max_tokens,
          canary, canary_log, threads, device, max_request_mb, follow=follow,
          canary_scorer=canary_scorer)


policies_app = typer.Typer(no_args_is_help=True,
                           help="Policy versions of a run: provenance and metrics at each save.")
app.add_typer(policies_app, name="policies")


@policies_app.command("ls")
def policies_ls(run_dir: Path = typer.Argument(..., help="A run folder.")) -> None:
    """Every checkpointed version and league snapshot: parent, step, key figures."""
    from agentrt.controller.versions import listing

    typer.echo("\n".join(listing(run_dir)))


@policies_app.command("show")
def policies_show(run_dir: Path = typer.Argument(..., help="A run folder."),
                  version: str = typer.Argument(..., help="lm@v4, a snapshot lm@25, or lm "
                                                          "(its newest version).")) -> None:
    """One version's record (JSON): parent, code, config hash, data, reward source, metrics."""
    import json

    from agentrt.controller.versions import find

    typer.echo(json.dumps(find(version, run_dir)[1], indent=1, sort_keys=True))


@policies_app.command("diff")
def policies_diff(run_dir: Path = typer.Argument(..., help="A run folder."),
                  a: str = typer.Argument(..., help="A version of it, or OTHER_RUN:version."),
                  b: str = typer.Argument(..., help="Another, or OTHER_RUN:version.")) -> None:
    """What differs between two versions: code commit, config (field by field), training data,
    reward source, key figures."""
    from agentrt.controller.versions import diff, find

    lines = diff(find(a, run_dir), find(b, run_dir))
    typer.echo("\n".join([f"{a} vs {b}:", *(lines or ["same code, config, data and reward"])]))


ckpt_app = typer.Typer(no_args_is_help=True, help="Checkpoints: can one be resumed or served.")
app.add_typer(ckpt_app, name="ckpt")


@ckpt_app.command("check")
def ckpt_check(
    ckpt: Path = typer.Argument(..., help="A checkpoint folder (checkpoints/step_N) or a run "
                                          "folder (its newest checkpoint)."),
    against: Optional[Path] = typer.Option(None, help="A config (any kind) or another "
                                                      "checkpoint to check it against."),
    imports: Optional[list[str]] = _IMPORT,
) -> None:
    """Say whether a checkpoint loads and fits a config or another checkpoint (architecture,
    LoRA rank and targets, optimizer state, format) and name what differs. Exit 0: it does;
    1: it does not; 2: bad input."""
    from agentrt.tools.ckpt_check import check

    if against is not None and not against.exists():
        raise AgentrtError(f"--against {against}: no such file or folder")
    verdict = check(ckpt, against, tuple(imports or ()))
    typer.echo(verdict.text(ckpt, against))
    if not verdict.ok:
        sys.exit(1)


@app.command("debug")
def debug_command(
    run_dir: Path = typer.Argument(..., help="A run folder (train, tournament or decompose)."),
    sample: str = typer.Argument(..., help="An episode id of its episode log (s<step>-<index>; "
                                           "a match or chain turn: s<step>-<index>-<agent>-<turn>) "
                                           "or a JSON file {prompt, response, reward?, info?, "
                                           "step?}."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Second reward source to "
                                         "compare (name or module:fn; default: exact match)."),
    repeats: int = typer.Option(8, help="Re-scores of the run's reward."),
    embedder: str = typer.Option("hashing", help="Embedder of the leakage check (hashing, "
                                                 "minilm)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    imports: Optional[list[str]] = _IMPORT,
) -> None:
    """Why is this sample bad: evidence and a verdict per cause (reward, actor drift, prompt
    leakage); the first line is the verdict (docs/debug.md)."""
    _setup()
    import json

    from agentrt.tools.debug import diagnose

    report = diagnose(run_dir, sample, reward, repeats, embedder, tuple(imports or ()))
    typer.echo(json.dumps(report.to_json(), indent=1) if as_json else report.text())


ctl_app = typer.Typer(no_args_is_help=True, help="Online control of a running run of any kind: "
                      "live settings, pause, late feedback, prompts (docs/control.md).")
app.add_typer(ctl_app, name="ctl")


@ctl_app.callback()
def _ctl(ctx: typer.Context,
         run_dir: Path = typer.Argument(..., help="The run folder of a running run (train, "
                                                  "tournament or decompose) with "
                                                  "control.enabled.")) -> None:
    ctx.obj = run_dir


def _ctl_send(ctx: typer.Context, command: Optional[dict]) -> dict:
    from agentrt.controller.control.client import send

    return send(ctx.obj, command)


@ctl_app.command("set")
def ctl_set(ctx: typer.Context, assignments: list[str] = typer.Argument(
        ..., help="KEY=VALUE of a live field, e.g. train.prompts_per_step=64 or "
        "policies.0.rollout.sampling.temperature=0.5 (repeatable).")
            ) -> None:
    """Change live settings; they apply at the start of the next step."""
    from agentrt.controller.control.client import parse_assignments

    reply = _ctl_send(ctx, {"cmd": "set", "values": parse_assignments(assignments)})
    typer.echo(f"queued #{reply['queued']}: applies at the start of step "
               f"{reply['applies_at_step']}")


@ctl_app.command("feedback")
def ctl_feedback(ctx: typer.Context,
                 episode: str = typer.Argument(..., help="Episode id of the run's log "
                                               "(s<step>-<i>)."),
                 value: float = typer.Argument(..., help="The late reward.")) -> None:
    """A late reward for a past episode; it joins the next step's training when recent enough."""
    reply = _ctl_send(ctx, {"cmd": "feedback", "episode": episode, "value": value})
    typer.echo(f"queued #{reply['queued']}: joins step {reply['applies_at_step']}")


@ctl_app.command("inject")
def ctl_inject(ctx: typer.Context, prompt: str = typer.Argument(..., help="Prompt text."),
               answer: str = typer.Option("", help="Its answer (what the reward compares).")
               ) -> None:
    """A prompt the next step draws before its source's."""
    reply = _ctl_send(ctx, {"cmd": "inject", "prompts": [{"prompt": prompt, "answer": answer}]})
    typer.echo(f"queued #{reply['queued']}: joins step {reply['applies_at_step']}")


@ctl_app.command("pause")
def ctl_pause(ctx: typer.Context, at_step: Optional[int] = typer.Option(
        None, "--at-step", help="Pause before this step (default: the next).")) -> None:
    """Hold the run at a step boundary until `resume` (commands sent meanwhile apply there)."""
    reply = _ctl_send(ctx, {"cmd": "pause", "at_step": at_step})
    typer.echo(f"queued #{reply['queued']}: pauses before step "
               f"{at_step or reply['applies_at_step']}")


@ctl_app.command("resume")
def ctl_resume(ctx: typer.Context) -> None:
    """Let a paused run go on."""
    reply = _ctl_send(ctx, {"cmd": "resume"})
    typer.echo(f"queued #{reply['queued']}")


@ctl_app.command("status")
def ctl_status(ctx: typer.Context) -> None:
    """The run's step, pause, live values and command counts (JSON)."""
    import json

    typer.echo(json.dumps(_ctl_send(ctx, None), indent=1, sort_keys=True))


def main() -> None:
    try:
        code = app(standalone_mode=False)  # typer returns 130 after Ctrl-C in this mode
        if code == 130:
            raise KeyboardInterrupt
    except AgentrtError as exc:
        if _DEBUG["on"]:
            raise
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted; run the same command again to resume from the last checkpoint",
                   err=True)
        sys.exit(130)
    except typer.TyperException as exc:  # usage: unknown command or option, missing argument
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message:  # empty after no_args_is_help printed the help
            typer.echo(f"error: {message} (see agentrt --help)", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # noqa: BLE001 - one line unless --debug, as every error
        if _DEBUG["on"]:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        typer.echo(f"error: {type(exc).__name__}: {first} (an agentrt bug or an unexpected "
                   "input; run with --debug for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
