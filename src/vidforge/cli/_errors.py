"""The one error boundary: every exception a subcommand raises ends here and becomes an exit code."""

from __future__ import annotations

import sys
import traceback

import typer
from typer.core import TyperGroup

from vidforge.cli._output import EXIT_FAILURE, EXIT_TERMINATED, EXIT_USER_ERROR, Output
from vidforge.errors import Terminated, UserInputError
from vidforge.parallel.launch import RanksFailed, report_failure


class GuardedGroup(TyperGroup):
    """The root command group. User errors print one line and exit 2; anything else that goes wrong while
    running prints one line and exits 1 (`--debug` shows the traceback instead)."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):  # typer's own: usage errors, exits
            raise
        except BrokenPipeError:
            if not stdout_closed():
                raise _failure(ctx) from None
            raise  # the reader stopped (`| head`): click's own quiet exit, not an error message
        except UserInputError as err:
            _error(ctx, str(err), kind="user")
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            _error(ctx, "interrupted; rerun the same command to resume", kind="interrupted")
            raise typer.Exit(130) from None
        except Terminated as err:
            _error(ctx, str(err), kind="terminated")
            raise typer.Exit(EXIT_TERMINATED) from None
        except Exception:  # noqa: BLE001 - this is the boundary
            raise _failure(ctx) from None
        finally:
            _leave_process_group()


def _failure(ctx: typer.Context) -> typer.Exit:
    """The exception being handled as one line (the traceback with --debug); exit 1."""
    err = sys.exc_info()[1]
    out = _output_of(ctx)
    if out.debug:
        traceback.print_exc()
    # A worker's failure, already named by rank, needs no exception type in front of it.
    message = str(err) if isinstance(err, RanksFailed) else f"{type(err).__name__}: {err}"
    hint = "" if out.debug else " (rerun with --debug for the traceback)"
    _error(ctx, message, kind="failure", hint=hint)
    return typer.Exit(EXIT_FAILURE)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (`vidforge ... | head`): poll reports an error on
    it. A broken pipe elsewhere (a socket) is a failure like any other."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no fileno (a test's capture), or no poll
        return False


def _leave_process_group() -> None:
    """Whatever a subcommand did, leave a torch.distributed group it joined before the interpreter exits:
    gloo's worker threads torn down during finalization abort the process (SIGABRT, "terminate called
    without an active exception") after the work is done, and torchrun then reports the run as failed."""
    dist = sys.modules.get("torch.distributed")  # never import torch just to check
    # Still half-imported when a run fails while a model loads on a background thread: nothing joined.
    is_initialized = getattr(dist, "is_initialized", None)
    if is_initialized is not None and dist.is_available() and is_initialized():
        dist.destroy_process_group()


def _error(ctx: typer.Context, message: str, *, kind: str, hint: str = "") -> None:
    # A worker that `--nproc` started reports to its parent, which prints one line for all ranks.
    if not report_failure(kind, message):
        _output_of(ctx).error(message + hint, kind=kind)


def _output_of(ctx: typer.Context) -> Output:
    # The root callback stores the Output on the root context; it may not have run (bad global option).
    return ctx.obj if isinstance(ctx.obj, Output) else Output()
