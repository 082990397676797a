"""The one error boundary: every exception a subcommand raises ends here and becomes an exit code."""

from __future__ import annotations

import traceback

import click
import typer
from typer.core import TyperGroup

from vidforge.cli._output import EXIT_FAILURE, EXIT_USER_ERROR, Output, current_output
from vidforge.errors import UserInputError


class GuardedGroup(TyperGroup):
    """The root command group. User errors print one line and exit 2; anything else that goes wrong while
    running prints one line and exits 1 (`--debug` shows the traceback instead)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except UserInputError as err:
            current_output().error(str(err), kind="user")
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            current_output().error("interrupted; rerun the same command to resume", kind="interrupted")
            raise typer.Exit(130) from None
        except Exception as err:  # noqa: BLE001 - this is the boundary
            out: Output = current_output()
            if out.debug:
                traceback.print_exc()
            hint = "" if out.debug else " (rerun with --debug for the traceback)"
            out.error(f"{type(err).__name__}: {err}{hint}", kind="failure")
            raise typer.Exit(EXIT_FAILURE) from None
