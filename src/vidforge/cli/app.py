"""The `vidforge` command: global options and the wiring of every subcommand (one module each)."""

from __future__ import annotations

from typing import Annotated

from vidforge.cli._startup import collector_paused

with collector_paused():
    import typer

    from vidforge import __version__
    from vidforge.cli import bench as bench_cli
    from vidforge.cli import (
        caption_cmd,
        clip_cmd,
        dedup_cmd,
        finetune_cmd,
        infer_cmd,
        model_cmd,
        profile_cmd,
        review_cmd,
        search_cmd,
        shard_cmd,
        tokenize_cmd,
        train_cmd,
    )
    from vidforge.cli._globals import COMMAND_KEY, RootGroup
    from vidforge.cli._output import Output, set_current_output, silence_library_bars

app = typer.Typer(
    name="vidforge",
    cls=RootGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    help="Raw videos to a trained video diffusion model and back.\n\n"
    "Every stage reads one run-profile (--profile, default profiles/local_cpu.yaml). "
    "--json, --quiet and --debug go before or after the subcommand. "
    "Exit codes: 0 ok, 1 failure, 2 fix your input, 3 partial success (see the errors file).",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vidforge {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable JSON lines on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for failures.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from vidforge.parallel.launch import announces_the_run

    silence_library_bars()
    ctx.obj = Output(json=json_, quiet=quiet, debug=debug, command=ctx.meta.get(COMMAND_KEY, ""))
    set_current_output(ctx.obj)
    if announces_the_run():
        ctx.obj.start()


app.add_typer(profile_cmd.app, name="profile")
app.command("clip")(clip_cmd.clip)
app.command("caption")(caption_cmd.caption)
app.command("dedup")(dedup_cmd.dedup)
app.command("shard")(shard_cmd.shard)
app.add_typer(tokenize_cmd.app, name="tokenize")
app.command("train")(train_cmd.train)
app.command("finetune")(finetune_cmd.finetune)
app.command("infer")(infer_cmd.infer)
app.command("review")(review_cmd.review)
app.command("search")(search_cmd.search)
app.add_typer(bench_cli.app, name="bench")
app.add_typer(model_cmd.app, name="model")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
