"""Text for people: everything the command line prints fits 100 columns (rich tables, wrapped prose).

``rich`` is a Megatron-Bridge dependency; output is plain text (no colour codes) so it pipes and logs well.
"""

from __future__ import annotations

import io
import textwrap
from typing import Iterable, Sequence

__all__ = ["WIDTH", "table", "wrap"]

WIDTH = 100


def wrap(text: str, indent: str = "", *, hang: str | None = None, width: int = WIDTH) -> list[str]:
    """``text`` as lines of at most ``width`` columns: the first after ``indent``, the rest after ``hang``."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent if hang is None else hang,
        break_long_words=True,
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def labelled(label: str, value: str, *, hang: str = "  ", width: int = WIDTH) -> list[str]:
    """``label`` then ``value`` (a path people copy) never split: on one line when it fits, else the value alone on
    the next line after ``hang``, however long."""
    if len(label) + len(value) <= width:
        return [label + value]
    return [label.rstrip(), hang + value]


def table(
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[object]],
    *,
    width: int = WIDTH,
    keep_whole: Sequence[int] = (0,),
) -> str:
    """A borderless table; ``columns`` are (header, "left"|"right"); long cells wrap inside their column,
    except the first line of the ``keep_whole`` columns (names people copy, e.g. a recipe's)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    cells = [[str(cell) for cell in row] for row in rows]
    for index, (header, justify) in enumerate(columns):
        whole = index in keep_whole
        min_width = max([len(header)] + [len(row[index].split("\n")[0]) for row in cells]) if whole else None
        grid.add_column(header, justify=justify, overflow="fold", min_width=min_width)  # type: ignore[arg-type]
    for row in cells:
        grid.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False, emoji=False).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
