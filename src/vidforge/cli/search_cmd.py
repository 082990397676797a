"""`vidforge search RUN... "TEXT"` or `--like CLIP_ID`: clips by what they show (vidforge.curate.embeddings.search)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidforge.cli._options import ProfileOpt, SetOpt, profile_from
from vidforge.cli._output import current_output
from vidforge.cli._terminal import printable


def search(
    args: Annotated[
        list[str],
        typer.Argument(
            help="RUN folders (`vidforge clip` or `vidforge caption` outputs), then the text query (none with "
            "--like).",
            show_default=False,
        ),
    ],
    like: Annotated[
        str | None,
        typer.Option("--like", metavar="CLIP_ID", help="Rank by similarity to this clip instead of a text."),
    ] = None,
    captions: Annotated[
        bool,
        typer.Option(
            "--captions",
            help="Match the clips' captions (a `vidforge caption` output's text embeddings) instead of "
            "their pictures.",
        ),
    ] = False,
    k: Annotated[int, typer.Option("-k", "--top", min=1, help="How many clips to show.")] = 10,
    review: Annotated[
        Path | None, typer.Option("--review", help="Also write the hits as a review page into this folder.")
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """The clips nearest a text (through the text tower of the model that embedded them) or another clip,
    over the runs' embedding stores; with --captions, the clips whose captions are nearest (through the
    caption stage's CLIP text tower).

    Example: vidforge search runs/clips-mon runs/clips-tue "a dog catching a frisbee" -k 20 --review hits/
    """
    from vidforge.curate.embeddings.search import search as run_search

    runs, text = (args, None) if like is not None else (args[:-1], args[-1])
    output = current_output()
    hits = run_search(profile_from(profile, set_), runs, text=text, like=like, k=k, captions=captions)
    output.table(  # the table escapes every cell: the runs' data must not drive the terminal
        [
            (
                h.rank,
                f"{h.score:.4f}",
                h.clip_id,
                h.run,
                (h.record or {}).get("path") or (h.record or {}).get("media") or "",
            )
            for h in hits
        ],
        columns=("rank", "cosine", "clip", "run", "media"),
        title=f"search: {text if like is None else 'like ' + like}",
    )
    if review is not None:
        from vidforge.review.search_page import write_search_page

        page = write_search_page(hits, text if like is None else f"like {like}", review)
        output.info(f"review page: {printable(page)}")
