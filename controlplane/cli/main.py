"""The ``controlplane`` command: the daemon (``serve``) and a client for CI and operators.

The client commands live in modules of their own (operations.py, status.py, history.py,
fleet.py, rollout.py); this one puts them together, with ``serve``, ``config`` and ``--version``.

Exit codes, the same for every client command (output.py decides them):

====  ==========================================================================================
0     success
1     the operation failed or was refused (with --fleet: or a member could not follow it)
2     bad usage or settings
3     the daemon could not be reached
4     gave up waiting: --timeout ran out before the operation (with --fleet: the fleet) was
      done; it goes on, and ``controlplane wait ID`` or ``controlplane fleet`` follows it
====  ==========================================================================================
"""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Annotated

import typer

from controlplane import __version__
from controlplane.cli import apply, fleet, history, operations, release, rollout, status
from controlplane.cli.client import API_VERSION
from controlplane.cli.options import DaemonUrlOption, TokenOption
from controlplane.cli.output import EXIT_USAGE
from controlplane.settings import settings_help

# typer finds the shell for --show-completion and --install-completion from the processes
# above this one, and ignores a shell named after the option. With this switch of typer's
# both options take the shell (bash, zsh, fish, powershell, pwsh), so that
# `--show-completion zsh` prints zsh's script whichever shell runs it, and a CI image with no
# shell above the process can still print one.
os.environ.setdefault("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")

app = typer.Typer(
    help="controlplane: safe, fast model updates for NVIDIA Triton Inference Server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    try:
        return installed_version("controlplane")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(
            f"controlplane {package_version()} (API {API_VERSION}, "
            f"Python {platform.python_version()})"
        )
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_print_version,
            is_eager=True,
            help="Print the version (and the API version this client speaks) and exit.",
        ),
    ] = False,
) -> None:
    """controlplane: safe, fast model updates for NVIDIA Triton Inference Server."""


@app.command(epilog=settings_help())
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML settings file (env vars override it).")
    ] = None,
) -> None:
    """Run the daemon: the REST API, start-up reconcile and every background task."""
    from controlplane.cli.serve import run  # the daemon's imports are heavy: load on demand

    raise typer.Exit(run(config))


@app.command()
def config(
    defaults: Annotated[bool, typer.Option("--defaults", help="Print every default.")] = False,
    effective: Annotated[
        bool,
        typer.Option(
            "--effective",
            help="Print the settings serve would run with (defaults < --config FILE < "
            "CONTROLPLANE_* variables), secrets masked, each value that is not the default "
            "with where it came from.",
        ),
    ] = False,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="With --effective: the YAML file serve is given."),
    ] = None,
    url: DaemonUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print the settings file with every setting, its default and what it does (--defaults),
    or the settings in effect (--effective): those this environment gives, or with --url
    those of the running daemon."""
    from controlplane.settings import SettingsError, render_defaults

    if (
        defaults == effective
        or (config_file is not None and not effective)
        or (url is not None and not effective)
    ):
        typer.echo(
            "use --defaults to print the default settings file, or --effective [--config "
            "FILE] to print the settings in effect, or --effective --url URL for the running "
            "daemon's",
            err=True,
        )
        raise typer.Exit(EXIT_USAGE)
    if defaults:
        typer.echo(render_defaults(), nl=False)
        return
    if url is not None:
        if config_file is not None:
            typer.echo(
                "--config reads a settings file here, --url asks the running daemon: give one",
                err=True,
            )
            raise typer.Exit(EXIT_USAGE)
        from controlplane.cli.config_remote import effective_of_daemon

        typer.echo(effective_of_daemon(url, token), nl=False)
        return
    from controlplane.cli.config_view import render_effective

    try:
        typer.echo(render_effective(config_file), nl=False)
    except SettingsError as exc:
        typer.echo(f"controlplane: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


app.command()(operations.deploy)
app.command()(operations.rollback)
app.command()(operations.unload)
app.command()(operations.wait)
app.command()(status.status)
app.command()(fleet.fleet)
app.command()(history.operations)
app.command()(history.history)
app.command()(apply.apply)
app.command()(apply.diff)
app.add_typer(release.app, name="release")
app.add_typer(rollout.app, name="rollout")


def main() -> None:
    app(prog_name="controlplane")
