"""Command line: ``agentrt train CONFIG.yaml [--set section.field=value ...]``.

Errors a user can meet print as one line (``error: ...``) with exit code 2, never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from agentrt.errors import AgentrtError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="agentrt: RL post-training of many language-model policies.")


def _setup() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Our own progress messages at INFO; libraries (faiss, httpx, ray) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("agentrt").setLevel(logging.INFO)


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config (see examples/)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.field=value"),
    run_dir: Optional[str] = typer.Option(None, help="Output folder (overrides run_dir)."),
) -> None:
    """Train one policy on a built-in task: optional SFT warm start, then GRPO/PPO/..."""
    _setup()
    from agentrt.config import load_config
    from agentrt.trainer import Trainer

    overrides = list(set_ or []) + ([f"run_dir={run_dir}"] if run_dir else [])
    cfg = load_config(config, overrides)
    trainer = Trainer(cfg)
    last = trainer.run()
    acc = last.get("eval/accuracy")
    typer.echo(f"run folder: {trainer.run_dir.path}")
    if acc is not None:
        typer.echo(f"final held-out accuracy: {acc:.3f}")
    typer.echo(f"curves: {trainer.run_dir.path / 'curves.png'}")


@app.command("check-config")
def check_config(
    config: Path = typer.Argument(..., help="YAML config to validate."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.field=value"),
) -> None:
    """Validate a config and print it resolved, without running anything."""
    from agentrt.config import dump_config, load_config

    typer.echo(dump_config(load_config(config, list(set_ or []))))


tournament_app = typer.Typer(no_args_is_help=True, help="Self-play leagues and tournaments.")
app.add_typer(tournament_app, name="tournament")


@tournament_app.command("run")
def tournament_run(
    config: Path = typer.Argument(..., help="YAML tournament config (see examples/)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.field=value"),
    run_dir: Optional[str] = typer.Option(None, help="Output folder (overrides run_dir)."),
) -> None:
    """Train learning policies by playing scheduled matches; resumes if the folder has a
    checkpoint; ends with the leaderboard and the HTML report."""
    _setup()
    from agentrt.config import load_config
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer

    overrides = list(set_ or []) + ([f"run_dir={run_dir}"] if run_dir else [])
    cfg = load_config(config, overrides, model=TournamentRunConfig)
    trainer = LeagueTrainer(cfg)
    trainer.run()
    typer.echo(trainer.leaderboard_text)
    typer.echo(f"report: {trainer.report_path}")


@tournament_app.command("eval")
def tournament_eval(
    config: Path = typer.Argument(..., help="YAML config: frozen policies (model.path) and "
                                            "baselines; schedule.format round_robin or swiss."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.field=value"),
) -> None:
    """Rating-only tournament between checkpoints and baselines (nothing trains)."""
    _setup()
    from agentrt.config import load_config
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer

    cfg = load_config(config, list(set_ or []), model=TournamentRunConfig)
    frozen = tuple(p.model_copy(update={"trainable": False}) for p in cfg.policies)
    trainer = LeagueTrainer(cfg.model_copy(update={"policies": frozen}))
    trainer.run()
    typer.echo(trainer.leaderboard_text)
    typer.echo(f"report: {trainer.report_path}")


@tournament_app.command("report")
def tournament_report(run_dir: Path = typer.Argument(..., help="A tournament run folder.")
                      ) -> None:
    """Rebuild the HTML report (leaderboard, rating and win-rate curves, payoff heat map)."""
    from agentrt.tournaments.report import write_report
    from agentrt.tournaments.records import MatchStore

    if not (run_dir / "matches.sqlite").is_file():
        raise AgentrtError(f"{run_dir} has no matches.sqlite; is it a tournament run folder?")
    typer.echo(f"report: {write_report(MatchStore(run_dir))}")


decompose_app = typer.Typer(no_args_is_help=True,
                            help="Long tasks split into subtask chains run by specialists.")
app.add_typer(decompose_app, name="decompose")


@decompose_app.command("run")
def decompose_run(
    config: Path = typer.Argument(..., help="YAML decomposer config (see examples/)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override: section.field=value"),
    run_dir: Optional[str] = typer.Option(None, help="Output folder (overrides run_dir)."),
) -> None:
    """Train a planner and its specialists on a task family's chains; resumes if the folder
    has a checkpoint; ends with held-out success and the HTML report."""
    _setup()
    from agentrt.config import load_config
    from agentrt.decomposer.config import DecomposeConfig
    from agentrt.decomposer.workload import Decomposer

    overrides = list(set_ or []) + ([f"run_dir={run_dir}"] if run_dir else [])
    cfg = load_config(config, overrides, model=DecomposeConfig)
    runner = Decomposer(cfg)
    last = runner.run()
    typer.echo(f"run folder: {runner.run_dir.path}")
    if "eval/success" in last:
        typer.echo(f"held-out task success: {last['eval/success']:.3f}, plan validity: "
                   f"{last['eval/plan_valid']:.3f}")
    typer.echo(f"report: {runner.run_dir.path / 'report.html'}")


@decompose_app.command("report")
def decompose_report(run_dir: Path = typer.Argument(..., help="A decomposer run folder.")
                     ) -> None:
    """Rebuild the HTML report (success per subtask type, routing over time, example chains)."""
    from agentrt.decomposer.report import write_report

    if not (run_dir / "chains.jsonl").is_file():
        raise AgentrtError(f"{run_dir} has no chains.jsonl; is it a decomposer run folder?")
    typer.echo(f"report: {write_report(run_dir)}")


def main() -> None:
    import click

    try:
        code = app(standalone_mode=False)  # typer returns 130 after Ctrl-C in this mode
        if code == 130:
            raise KeyboardInterrupt
    except AgentrtError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, click.exceptions.Abort):
        typer.echo("interrupted; run the same command again to resume from the last checkpoint",
                   err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors come here too under standalone_mode=False
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
